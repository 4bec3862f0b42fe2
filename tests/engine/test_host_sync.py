"""No host sync in the model loop: every device -> host copy goes through ``transfer.to_host``.

On a GPU a tensor's ``bool()``, ``item()``, ``tolist()``, ``cpu()`` or ``numpy()`` makes the
host wait for the device. Here on the CPU the same calls are watched on the engine's thread:
outside :mod:`geoserve.engine.transfer`, the loop must make none of them, and the helper's
calls are counted per step: one per forward pass when the canvas is on the host (it needs the
values; the one wait that stays), none for the batch when the canvas is on the device (a torch
canvas, here on the CPU: ``preprocess="device"``), only each finished band of the class map,
one byte per pixel, each image row once.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rasterio
import torch

from geoserve import Engine, SegmentationReassembler
from tests.conftest import write_geotiff

#: Tensor methods that wait for the device (on a GPU) to hand a value to the host.
SYNCING = ("__bool__", "__int__", "__float__", "item", "tolist", "cpu", "numpy")


@contextmanager
def watch_syncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Record ``SYNCING`` calls made on this thread outside ``geoserve/engine/transfer.py``."""
    seen: list[str] = []
    here = threading.get_ident()

    def watched(name: str, method: Any) -> Any:
        def call(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            caller = sys._getframe(1).f_code.co_filename
            if threading.get_ident() == here and not caller.endswith("engine/transfer.py"):
                seen.append(f"{name} from {caller}:{sys._getframe(1).f_lineno}")
            return method(self, *args, **kwargs)

        return call

    with monkeypatch.context() as m:
        for name in SYNCING:
            m.setattr(torch.Tensor, name, watched(name, getattr(torch.Tensor, name)))
        yield seen


def test_class_map_reduction_on_the_device_does_not_wait_for_it(monkeypatch):
    """``reduce_rows`` marks non-finite pixels unconditionally (no ``bool(bad.any())``)."""
    rng = np.random.default_rng(0)
    for classes in (3, 300):  # uint8 codes, and int32 ones past 254 classes
        logits = rng.normal(size=(classes, 9, 11)).astype(np.float32)
        logits[1, 2, 3] = np.nan
        logits[0, 4, 5] = np.inf
        logits[:, 6, 7] = -np.inf
        proc = SegmentationReassembler(classes=tuple(f"c{i}" for i in range(classes)))
        with watch_syncs(monkeypatch) as seen:
            index = proc.reduce_rows(torch.from_numpy(logits))
        assert seen == []
        nodata = 255 if classes < 255 else 65535
        want = logits.argmax(axis=0)
        want[~np.isfinite(logits).all(axis=0)] = nodata
        assert index.dtype == (torch.uint8 if classes < 255 else torch.int32)
        np.testing.assert_array_equal(index.numpy()[0], want)
        clean = proc.reduce_rows(torch.from_numpy(np.nan_to_num(logits)))  # none marked
        assert int((clean == nodata).sum()) == 0


def _scene(tmp_path: Path) -> Path:
    rng = np.random.default_rng(1)
    data = (rng.random((3, 70, 50)) * 1000).astype("uint16")
    return write_geotiff(tmp_path / "in.tif", data)


def _engine(preprocess: str) -> Engine:
    return Engine("test-seg", preprocess=preprocess, max_batch_patches=4, prefetch=False)


@pytest.mark.parametrize("preprocess", ["host", "device"])
def test_the_loop_converts_nothing_to_the_host_outside_the_helper(
    preprocess, tmp_path, monkeypatch
):
    src = _scene(tmp_path)
    with _engine(preprocess) as eng, watch_syncs(monkeypatch) as seen:
        eng.add_request(src, output_path=tmp_path / "out.tif")
        while eng.has_unfinished():
            eng.step()
    assert seen == []


def _count(src: Path, out: Path, preprocess: str, monkeypatch) -> list:
    """Step a test-seg engine over ``src``: per step, its batch size and to_host calls."""
    from geoserve.engine import transfer

    calls: list[tuple[tuple[int, ...], torch.dtype]] = []
    real = transfer.to_host

    def counted(tensor: torch.Tensor, **kwargs: Any) -> Any:
        calls.append((tuple(tensor.shape), tensor.dtype))
        return real(tensor, **kwargs)

    steps = []
    with _engine(preprocess) as eng:
        monkeypatch.setattr(transfer, "to_host", counted)
        eng.add_request(src, output_path=out)
        while eng.has_unfinished():
            before = len(calls)
            eng.step()
            steps.append((eng.last_batch_size, calls[before:]))
    return steps


def test_host_canvas_copies_each_batch_once_through_the_helper(tmp_path, monkeypatch):
    steps = _count(_scene(tmp_path), tmp_path / "host.tif", "host", monkeypatch)
    assert sum(b for b, _ in steps) == 6 * 5  # the grid: 70 / 12 rows, 50 / 12 columns
    for batch, calls in steps:
        # one copy of the batch's logits (the host canvas stitches them), none without a batch
        assert calls == ([((batch, 4, 16, 16), torch.float32)] if batch else [])


def test_device_canvas_copies_only_finished_class_map_rows(tmp_path, monkeypatch):
    src = _scene(tmp_path)
    steps = _count(src, tmp_path / "device.tif", "device", monkeypatch)
    assert sum(b for b, _ in steps) == 6 * 5
    assert all(len(c) <= 1 for _, c in steps)  # at most one band a step, never the batch
    calls = [c for _, cs in steps for c in cs]
    assert calls
    assert all(len(s) == 3 and s[0] == 1 and d == torch.uint8 for s, d in calls)
    assert sum(s[1] for s, _ in calls) == 70  # each image row crosses once, as a class code
    assert all(s[2] == 50 for s, _ in calls)
    with rasterio.open(tmp_path / "device.tif") as a:
        device = a.read()
    with _engine("host") as eng:
        host_path = eng.generate_image(src, output_path=tmp_path / "h.tif").outputs.path
    with rasterio.open(host_path) as b:
        np.testing.assert_array_equal(device, b.read())  # the device canvas gives the same map
