"""Cutting, normalising and stitching in torch (as on a GPU) give the host path's values exactly.

CI has no GPU: the torch path runs on CPU tensors here, the same code that runs on CUDA.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from geoserve import Engine, GeoTiffPatcher, RequestSpec
from geoserve.raster import open_raster

CASES = {
    "uint16-scaled": ({"dtype": "uint16"}, {"scale_factor": 1e-4, "mean": (0.1, 0.2, 0.3)}),
    "int16-nodata": (
        {"dtype": "int16", "nodata": 7},
        {"mean": (10.0, 20.0, 30.0), "std": (3.0, 4.0, 5.0), "fill": -1.5},
    ),
    "float-nan": ({"dtype": "float32", "nan": True}, {"std": (2.0, 2.0, 2.0)}),
    "uint8": ({"dtype": "uint8"}, {}),
}


def _scene(make_geotiff, dtype, height, width, nodata=None, nan=False, seed=0):
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 200, (3, height, width)).astype(dtype)
    if nodata is not None:
        data[:, : height // 3, : width // 4] = nodata  # whole patches of nodata get skipped
        data[1, -1, -1] = nodata
    if nan:
        data[:, 2:5, 3:9] = np.nan
        data[:, : height // 2, : width // 2] = np.nan
    return make_geotiff(data=data, nodata=nodata)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize(
    ("height", "width", "patch", "stride"), [(70, 90, 16, 12), (9, 5, 16, 16), (40, 33, 32, 24)]
)
def test_device_cut_equals_host_cut_bitwise(make_geotiff, case, height, width, patch, stride):
    scene_kw, proc_kw = CASES[case]
    path = _scene(make_geotiff, height=height, width=width, **scene_kw)
    proc = GeoTiffPatcher(patch_size=patch, stride=stride, blend="center", **proc_kw)
    with open_raster(path) as src:
        ctx = proc.prepare([src])
        for r in range(ctx.grid.rows):
            host = proc.read_row([src], ctx, r)
            dev = proc.read_row_on([src], ctx, r, torch.device("cpu"))
            assert isinstance(dev.patches, torch.Tensor)
            assert dev.cols == host.cols
            np.testing.assert_array_equal(dev.patches.numpy(), host.patches)
            if host.core_valid is None:
                assert dev.core_valid is None
            else:
                np.testing.assert_array_equal(dev.core_valid, host.core_valid)


def test_device_cut_multi_date(make_geotiff):
    rng = np.random.default_rng(3)
    dates = [
        make_geotiff(data=rng.integers(0, 900, (2, 30, 41)).astype(np.uint16)) for _ in range(3)
    ]
    proc = GeoTiffPatcher(patch_size=16, stride=12, num_frames=3, mean=(5.0, 6.0), std=(2.0, 3.0))
    sources = [open_raster(d) for d in dates]
    ctx = proc.prepare(sources)
    for r in range(ctx.grid.rows):
        host = proc.read_row(sources, ctx, r)
        dev = proc.read_row_on(sources, ctx, r, torch.device("cpu"))
        assert host.patches.shape[1:3] == (2, 3)  # (n, C, T, P, P)
        np.testing.assert_array_equal(dev.patches.numpy(), host.patches)
    for s in sources:
        s.close()


@pytest.mark.parametrize("model", ["test-seg", "demo-water"])
def test_engine_outputs_equal_with_device_preprocessing(make_geotiff, model):
    rng = np.random.default_rng(1)
    path = make_geotiff(data=rng.integers(0, 3000, (13, 150, 170)).astype(np.uint16))
    outs = []
    for where in ("host", "device"):
        with Engine(model, preprocess=where, max_batch_patches=6) as engine:
            assert engine.preprocess == where
            req = engine.prepare_request(RequestSpec(path, out_format="tensor"))  # (not admitted)
            req.close()
            assert req.stitch_on == (torch.device("cpu") if where == "device" else None)
            outs.append(engine.generate_image(path, out_format="tensor").outputs.tensor)
    assert outs[0].equal(outs[1])


@pytest.mark.parametrize("n_classes", [2, 300])
def test_class_map_reduced_on_the_device_equals_the_host_argmax(n_classes):
    from geoserve import SegmentationReassembler

    rng = np.random.default_rng(n_classes)
    logits = rng.integers(-2, 3, (n_classes, 20, 30)).astype(np.float32)  # many exact ties
    valid = rng.random((20, 30)) > 0.1
    proc = SegmentationReassembler(classes=tuple(f"c{i}" for i in range(n_classes)))
    ctx = _ctx(20, 30)
    host = proc.finalize(logits.copy(), valid, ctx)
    reduced = proc.reduce_rows(torch.from_numpy(logits)).numpy()
    assert reduced.shape == (1, 20, 30)
    assert reduced.itemsize < logits.itemsize * n_classes  # less to copy back
    device = proc.finalize(reduced, valid, ctx)
    np.testing.assert_array_equal(device.data, host.data)
    assert device.nodata == host.nodata
    assert device.data.dtype == host.data.dtype
    probs = proc.for_kind("probabilities")
    assert probs.reduce_rows(torch.from_numpy(logits)).shape == logits.shape  # nothing to reduce


def _ctx(height, width):
    from geoserve.processors.base import RasterContext
    from geoserve.raster.grid import PatchGrid

    return RasterContext(
        grid=PatchGrid(height, width, 16, 16, "none"),
        names=("<test>",),
        bands=(0,),
        band_names=("b",),
        profile={},
        has_nodata=True,
    )


def test_a_failing_reduce_on_the_device_fails_the_request_alone(make_geotiff, register_model):
    import dataclasses

    from geoserve import SegmentationReassembler

    @dataclasses.dataclass(frozen=True)
    class BrokenOnLarge(SegmentationReassembler):
        def reduce_rows(self, blended):
            if bool((blended.abs() > 1e5).any()):  # a bug that only large logits reach
                raise RuntimeError("bug in reduce_rows")
            return super().reduce_rows(blended)

    class Logits(torch.nn.Module):
        def forward(self, x):
            return torch.cat([-x, x], dim=1)

    model = register_model(
        "test-broken-reduce",
        Logits,
        GeoTiffPatcher(bands=(0,), patch_size=16, stride=16),
        BrokenOnLarge(classes=("low", "high")),
    )
    bad = make_geotiff(data=np.full((1, 40, 40), 1e6, np.float32))
    good = make_geotiff(bands=1, height=40, width=40)
    with Engine(model, preprocess="device") as engine:
        failed, fine = engine.generate_image([bad, good], out_format="tensor")
        assert failed.error is not None
        assert "output processing failed" in str(failed.error)
        assert "bug in reduce_rows" in str(failed.error)
        assert fine.ok
        assert engine.generate_image(good, out_format="tensor").ok
