"""The canvas's reused buffers change no bit: a property test against a whole-image reference.

The reference below is the canvas's arithmetic written out the plain way, over the whole image
at once: each patch cropped to the image, ``acc += patch * w`` and ``wsum += w`` in the order
the patches arrive (or the core copied, for ``center``/``none``), then ``acc / wsum`` where
``wsum > 0``. The canvas must give the same bits for every blend, stride and image size, with
invalid pixels and non-finite outputs, whether its rows are taken as they finish or at the end,
on numpy and on a torch tensor (the device canvas, here on the CPU).
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from geoserve.engine.canvas import Canvas
from geoserve.raster.grid import PatchGrid


def _reference(
    grid: PatchGrid, adds: list[tuple[int, int, NDArray[np.float32]]], channels: int
) -> NDArray[np.float32]:
    """The whole image, stitched the plain way (see the module docstring)."""
    h, w = grid.height, grid.width
    acc = np.zeros((channels, h, w), dtype=np.float32)
    wsum = np.zeros((h, w), dtype=np.float32)
    weights = grid.weights()
    for row, col, patch in adds:
        r0, c0 = grid.origin(row, col)
        if grid.blend in ("center", "none"):
            core = grid.core_window(row, col)
            rs, cs = core.row_off, core.col_off
            acc[:, rs : rs + core.height, cs : cs + core.width] = patch[
                :, rs - r0 : rs - r0 + core.height, cs - c0 : cs - c0 + core.width
            ]
            continue
        rs, re_ = max(r0, 0), min(r0 + grid.patch_size, h)
        cs, ce = max(c0, 0), min(c0 + grid.patch_size, w)
        wt = weights[rs - r0 : re_ - r0, cs - c0 : ce - c0]
        acc[:, rs:re_, cs:ce] += patch[:, rs - r0 : re_ - r0, cs - c0 : ce - c0] * wt
        wsum[rs:re_, cs:ce] += wt
    if grid.blend in ("center", "none"):
        return acc
    np.divide(acc, wsum, out=acc, where=wsum > 0)
    return acc


def _bits(a: NDArray[np.float32]) -> NDArray[np.uint32]:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


@st.composite
def _cases(draw: st.DrawFn) -> dict:
    blend = draw(st.sampled_from(["none", "center", "mean", "cosine"]))
    patch = draw(st.integers(2, 20))
    stride = patch if blend == "none" else draw(st.integers(1, patch))
    height = draw(st.integers(1, 3 * patch + 5))
    width = draw(st.integers(1, 3 * patch + 5))
    return {
        "grid": PatchGrid(height, width, patch, stride, blend),
        "channels": draw(st.integers(1, 3)),
        "seed": draw(st.integers(0, 2**32 - 1)),
        "skip": draw(st.floats(0.0, 0.5)),  # share of patches skipped (all nodata)
        "invalid": draw(st.booleans()),
        "nonfinite": draw(st.booleans()),
        "take": draw(st.sampled_from(["streaming", "end", "random"])),
        "lag": draw(st.integers(1, 3)),  # grid rows open at once (patches interleave)
    }


def _stitch(case: dict, device: torch.device | None):
    """Run the case on a canvas; return (image, valid mask, reference image, reference mask)."""
    grid, channels = case["grid"], case["channels"]
    rnd = random.Random(case["seed"])
    rng = np.random.default_rng(case["seed"])
    canvas = Canvas(grid, device)
    ref_valid = np.ones((grid.height, grid.width), dtype=bool)
    adds: list[tuple[int, int, NDArray[np.float32]]] = []
    bands = []

    def take(final: bool = False) -> None:
        mode = case["take"]
        if final or mode == "streaming" or (mode == "random" and rnd.random() < 0.3):
            min_rows = rnd.randint(1, grid.patch_size) if mode == "random" else 1
            band = canvas.take_finished(channels, min_rows=min_rows)
            if band is not None:
                bands.append(band)

    open_rows: dict[int, list[int]] = {}
    next_row = 0
    while next_row < grid.rows or open_rows:
        if next_row < grid.rows and (len(open_rows) < case["lag"] or not open_rows):
            cols = [c for c in range(grid.cols) if rnd.random() >= case["skip"]]
            mask = None
            if case["invalid"] and rnd.random() < 0.5:
                core = grid.core_window(next_row, 0)
                mask = rng.random((core.height, grid.width)) > 0.3
                ref_valid[core.row_off : core.row_off + core.height] = mask
            canvas.expect(next_row, len(cols), mask)
            if cols:
                open_rows[next_row] = cols
            next_row += 1
            take()
            continue
        row = rnd.choice(sorted(open_rows))
        col = open_rows[row].pop(rnd.randrange(len(open_rows[row])))
        if not open_rows[row]:
            del open_rows[row]
        patch = rng.normal(size=(channels, grid.patch_size, grid.patch_size)).astype(np.float32)
        if case["nonfinite"]:
            spots = rng.random(patch.shape)
            patch[spots < 0.02] = np.nan
            patch[(spots >= 0.02) & (spots < 0.04)] = np.inf
            patch[(spots >= 0.04) & (spots < 0.06)] = -0.0
        adds.append((row, col, patch))
        canvas.add(row, col, patch if device is None else torch.from_numpy(patch.copy()))
        take()
    assert canvas.complete
    take(final=True)
    assert [b.row for b in bands] == sorted(b.row for b in bands)
    assert sum(b.data.shape[1] for b in bands) == grid.height  # every row exactly once
    image = np.concatenate([b.data for b in bands], axis=1)
    valid = np.concatenate(
        [np.ones(b.data.shape[1:], bool) if b.valid is None else b.valid for b in bands]
    )
    return image, valid, _reference(grid, adds, channels), ref_valid


@pytest.mark.parametrize("device", [None, torch.device("cpu")], ids=["numpy", "torch"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=_cases())
def test_canvas_equals_the_whole_image_reference_bitwise(case, device):
    image, valid, ref, ref_valid = _stitch(case, device)
    assert image.dtype == np.float32
    np.testing.assert_array_equal(_bits(image), _bits(ref))  # NaN payloads and -0.0 too
    np.testing.assert_array_equal(valid, ref_valid)


@pytest.mark.parametrize("blend", ["none", "center", "mean", "cosine"])
@pytest.mark.parametrize(("h", "w"), [(1, 1), (101, 37), (250, 203)])
def test_many_takes_of_a_tall_image_stay_exact_on_both_canvases(blend, h, w):
    """Streaming over many grid rows (the buffer reused far past its first rows) is exact."""
    patch = 24
    case = {
        "grid": PatchGrid(h, w, patch, patch if blend == "none" else 17, blend),
        "channels": 2,
        "seed": h * w,
        "skip": 0.1,
        "invalid": True,
        "nonfinite": False,
        "take": "streaming",
        "lag": 2,
    }
    for device in (None, torch.device("cpu")):
        image, valid, ref, ref_valid = _stitch(case, device)
        np.testing.assert_array_equal(_bits(image), _bits(ref))
        np.testing.assert_array_equal(valid, ref_valid)


def test_a_float64_patch_is_weighed_as_before():
    """A patch that is not float32 is multiplied the promoting way (no float32 scratch)."""
    grid = PatchGrid(20, 20, 8, 5, "cosine")
    rng = np.random.default_rng(0)
    canvas = Canvas(grid)
    adds = []
    for r in range(grid.rows):
        canvas.expect(r, grid.cols, None)
        for c in range(grid.cols):
            patch = rng.normal(size=(1, 8, 8))  # float64
            adds.append((r, c, patch))
            canvas.add(r, c, patch)
    band = canvas.take_finished(1)
    assert band is not None
    np.testing.assert_array_equal(_bits(band.data), _bits(_reference(grid, adds, 1)))
