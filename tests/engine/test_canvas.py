"""The row-band canvas: streamed rows equal the whole-image result, and memory stays bounded."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from geoserve.engine.canvas import Canvas
from geoserve.raster.grid import PatchGrid


def _run(grid: PatchGrid, outputs: dict, invalid_rows: set[int], streaming: bool, device=None):
    canvas = Canvas(grid, device)
    bands, peak = [], 0
    for r in range(grid.rows):
        core_h = grid.core_window(r, 0).height
        mask = None
        if r in invalid_rows:
            mask = np.ones((core_h, grid.width), dtype=bool)
            mask[0, : grid.width // 2] = False
        cols = [c for c in range(grid.cols) if (r, c) in outputs]
        canvas.expect(r, len(cols), mask)
        for c in cols:
            out = outputs[r, c]
            canvas.add(r, c, out if device is None else torch.from_numpy(out).to(device))
            peak = max(peak, canvas.rows_held)
            band = canvas.take_finished(2) if streaming else None
            if band is not None:
                bands.append(band)
    assert canvas.complete
    last = canvas.take_finished(2)
    if last is not None:
        bands.append(last)
    return bands, peak


@pytest.mark.parametrize("device", [None, torch.device("cpu")], ids=["numpy", "torch"])
@pytest.mark.parametrize("blend", ["none", "center", "mean", "cosine"])
@pytest.mark.parametrize(("h", "w"), [(1, 1), (5, 70), (97, 33), (130, 130)])
def test_streamed_rows_equal_whole_image_bitwise(blend, h, w, device):
    """Streamed rows equal the whole image, and a torch canvas (as on a GPU) equals numpy's."""
    patch, stride = 16, 16 if blend == "none" else 12
    grid = PatchGrid(h, w, patch, stride, blend)
    rng = np.random.default_rng(h * 1000 + w)
    outputs = {
        (r, c): rng.normal(size=(2, patch, patch)).astype(np.float32)
        for r, c in grid.indices()
        if (r + c) % 7 != 3  # some all-nodata patches are skipped
    }
    invalid = {1, grid.rows - 1}
    streamed, peak = _run(grid, outputs, invalid, streaming=True, device=device)
    whole, _ = _run(grid, outputs, invalid, streaming=False)
    assert len(whole) == 1
    assert whole[0].row == 0
    rows = [b.row for b in streamed]
    assert rows == sorted(rows)
    assert rows[0] == 0
    assert sum(b.data.shape[1] for b in streamed) == h  # every row exactly once, in order
    data = np.concatenate([b.data for b in streamed], axis=1)
    np.testing.assert_array_equal(data, whole[0].data)
    valid = np.concatenate(
        [np.ones(b.data.shape[1:], bool) if b.valid is None else b.valid for b in streamed]
    )
    np.testing.assert_array_equal(valid, whole[0].valid)
    assert peak <= 2 * patch + stride  # a few patch heights, whatever the image height


def test_tall_image_holds_only_open_rows():
    grid = PatchGrid(4000, 64, 32, 24, "cosine")
    canvas = Canvas(grid)
    ones = np.ones((1, 32, 32), dtype=np.float32)
    peak, total = 0, 0
    for r in range(grid.rows):
        canvas.expect(r, grid.cols, None)
        for c in range(grid.cols):
            canvas.add(r, c, ones)
        peak = max(peak, canvas.rows_held)
        band = canvas.take_finished(1)
        total += band.data.shape[1] if band is not None else 0
        if band is not None:
            np.testing.assert_allclose(band.data, 1.0, rtol=1e-6)
    assert total == grid.height
    assert peak <= 3 * grid.patch_size
