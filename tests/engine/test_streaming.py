"""Streaming output: same bytes as whole-scene processing, bounded memory, COG, clean cancels."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import rasterio
from rio_cogeo.cogeo import cog_validate

from geoserve import Engine
from tests.conftest import FLOOD, HLS, LAKE, RGB, needs_shared, read

REPO = Path(__file__).resolve().parents[2]


def _same_output(a: Path, b: Path) -> None:
    data_a, prof_a = read(a)
    data_b, prof_b = read(b)
    np.testing.assert_array_equal(data_a, data_b)  # bitwise, NaN in the same places
    nodata_a, nodata_b = prof_a.pop("nodata"), prof_b.pop("nodata")
    assert prof_a == prof_b
    np.testing.assert_array_equal(np.float64(nodata_a or 0), np.float64(nodata_b or 0))
    with rasterio.open(a) as x, rasterio.open(b) as y:
        assert x.tags() == y.tags()
        assert x.descriptions == y.descriptions


@pytest.mark.parametrize(
    ("model", "scene", "kwargs"),
    [
        pytest.param("demo-water", LAKE, {}, marks=needs_shared(LAKE), id="demo-water-lake"),
        pytest.param(
            "test-seg",
            FLOOD,
            {"output_kind": "probabilities"},
            marks=needs_shared(FLOOD),
            id="cosine-probabilities-flood",
        ),
        pytest.param(
            "identity", RGB, {"blend": "mean", "stride": 48}, marks=needs_shared(RGB), id="rgb"
        ),
        pytest.param(
            "identity",
            HLS,
            {"blend": "cosine", "patch_size": 64, "stride": 40},
            marks=needs_shared(HLS),
            id="hls-float-nodata",
        ),
    ],
)
def test_streamed_output_equals_in_memory_output_bitwise(model, scene, kwargs, tmp_path):
    outputs = []
    for streaming in (True, False):
        # rows read in turn (prefetch off): the same batches in both runs, whatever the timing
        # (a CPU convolution may round differently at another batch size)
        with Engine(
            model, streaming=streaming, max_batch_patches=5, prefetch=False, **kwargs
        ) as engine:
            path = tmp_path / f"{streaming}.tif"
            outputs.append(engine.generate_image(scene, output_path=path).outputs.path)
    _same_output(*outputs)


def test_rows_are_written_before_the_scene_is_finished(make_geotiff, tmp_path):
    src = make_geotiff(bands=1, height=600, width=40)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    target = out_dir / "out.tif"
    with Engine("test-slow", max_batch_patches=3) as engine:
        engine.add_request(src, output_path=target)
        written_early = False
        while engine.has_unfinished():
            engine.step()
            # the output's temporary file appears with its first rows, while patches are left
            if engine.queued_patches and any(out_dir.iterdir()):
                written_early = True
        assert written_early
        assert read(target)[0].shape == (1, 600, 40)


def test_cancelled_request_leaves_no_file(make_geotiff, tmp_path, monkeypatch):
    monkeypatch.setenv("GEOSERVE_TEST_SLOW", "0")
    src = make_geotiff(bands=1, height=800, width=64)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with Engine("test-slow", max_batch_patches=4) as engine:
        rid = engine.add_request(src, output_path=out_dir / "o.tif")
        for _ in range(30):
            engine.step()
        assert engine.pending_ids() == [rid]
        assert any(out_dir.iterdir())  # rows were written to the temp file
        assert engine.abort_request(rid)
    assert list(out_dir.iterdir()) == []


def test_cli_interrupted_mid_scene_leaves_no_file(make_geotiff, tmp_path):
    src = make_geotiff(bands=1, height=2000, width=64)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    # ~25 s uninterrupted, so that even a slow (loaded) test process signals it mid-scene
    env = {**os.environ, "GEOSERVE_TEST_SLOW": "0.1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            # (Ctrl-C's default handler, even if this test process was started ignoring it)
            "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
            "import tests.stub_models, geoserve.cli as c; sys.exit(c.main())",
            "predict",
        ]
        + [str(src), "-o", str(out_dir / "o.tif"), "-m", "test-slow", "--batch-size", "2"],
        cwd=REPO,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not any(out_dir.iterdir()):  # the temp file appears once the first rows are final
        assert proc.poll() is None
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert list(out_dir.iterdir()) == []


def test_cog_output_is_a_valid_cog(make_geotiff, tmp_path):
    from geoserve.cli import main

    src = make_geotiff(bands=3, height=700, width=900, descriptions=["B2", "B3", "B8"])
    target = tmp_path / "water.tif"
    assert main(["predict", str(src), "-o", str(target), "-m", "ndwi-water", "-q", "--cog"]) == 0
    valid, errors, _ = cog_validate(str(target), quiet=True)
    assert valid, errors
    plain = tmp_path / "plain.tif"
    assert main(["predict", str(src), "-o", str(plain), "-m", "ndwi-water", "-q"]) == 0
    np.testing.assert_array_equal(read(target)[0], read(plain)[0])
    with rasterio.open(target) as cog, rasterio.open(plain) as ref:
        assert cog.overviews(1)  # internal overviews for zoomed-out range reads
        assert cog.colormap(1) == ref.colormap(1)
        assert cog.crs == ref.crs
        assert cog.transform == ref.transform
        assert cog.tags()["CLASS_NAMES"] == ref.tags()["CLASS_NAMES"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_cog_bytes_output(make_geotiff):
    from rasterio.io import MemoryFile

    src = make_geotiff(bands=3, height=700, width=900, descriptions=["B2", "B3", "B8"])
    with Engine("ndwi-water", cog=True) as engine:
        data = engine.generate_image(src, out_format="bytes").outputs.data
    with MemoryFile(data) as mem, mem.open() as ds:
        assert ds.profile["tiled"]
        assert ds.overviews(1)
        assert ds.read().shape == (1, 700, 900)


BOUNDED_RUN = textwrap.dedent(
    """
    import resource, sys
    import numpy as np, torch
    from torch import nn
    from geoserve import (Engine, GeoTiffPatcher, SegmentationReassembler, INPUT_REGISTRY,
                          MODEL_REGISTRY, OUTPUT_REGISTRY)

    @MODEL_REGISTRY.register_model("threshold")
    @INPUT_REGISTRY.register_input_processor(
        GeoTiffPatcher(bands=(0,), mean=(128.0,), std=(64.0,), patch_size=256, blend="none"))
    @OUTPUT_REGISTRY.register_output_processor(SegmentationReassembler(classes=("low", "high")))
    class Threshold(nn.Module):
        def forward(self, x):
            return torch.cat([-x, x], dim=1)

    src, dst, streaming, budget = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
    engine = Engine("threshold", max_batch_patches=32, streaming=streaming)
    engine.generate_image(src, output_path=dst + ".warm.tif")  # every thread and pool started
    vm = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize")).split()[1])
    limit = vm * 1024 + budget
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        engine.generate_image(src, output_path=dst)
    except Exception as exc:  # MemoryError, or the request failed alone on one
        if "MemoryError" not in repr(exc) + str(exc):
            raise
        print("MemoryError", exc)
        sys.exit(3)
    print("done")
    """
)


def test_a_scene_too_large_to_hold_streams_under_an_address_space_limit(tmp_path):
    """An 8192 x 8192 scene needs 512 MiB for its (2, H, W) float32 logits held whole;
    streamed, it completes with 384 MiB of address space to spare, and the whole-scene run
    under the same limit fails (so the limit bites)."""
    size, block = 8192, 1024
    src = tmp_path / "big.tif"
    profile = {"driver": "GTiff", "width": size, "height": size, "count": 1, "dtype": "uint8"}
    profile.update(tiled=True, blockxsize=256, blockysize=256, compress="deflate")
    profile.update(crs="EPSG:32633", transform=rasterio.Affine(10, 0, 300000, 0, -10, 5900000))
    cols = (np.arange(size) % 256).astype(np.uint8)
    with rasterio.open(src, "w", **profile) as dst:
        for r in range(0, size, block):
            dst.write(np.broadcast_to(cols, (1, block, size)), window=((r, r + block), (0, size)))
    budget = 384 << 20
    env = {**os.environ, "MALLOC_ARENA_MAX": "2", "OMP_NUM_THREADS": "2"}
    results = {}
    for streaming in ("1", "0"):
        dst = tmp_path / f"out{streaming}.tif"
        results[streaming] = subprocess.run(
            [sys.executable, "-c", BOUNDED_RUN, str(src), str(dst), streaming, str(budget)],
            capture_output=True,
            text=True,
            env=env,
            timeout=900,
        )
    ok = results["1"]
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert results["0"].returncode == 3, results["0"].stdout + results["0"].stderr
    assert not (tmp_path / "out0.tif").exists()
    with rasterio.open(tmp_path / "out1.tif") as out:
        assert out.shape == (size, size)
        row = out.read(1, window=((size - 3, size - 2), (0, size)))[0]
    np.testing.assert_array_equal(row, (cols > 128).astype(np.uint8))  # ties: first class


def test_leading_nodata_rows_wait_for_the_models_channel_count(make_geotiff, tmp_path):
    """identity fixes no channel count, and its first rows are all nodata (no patch, final at
    once): they still come out with the input's 3 bands, NaN, as in the whole-output run."""
    data = (np.arange(3 * 120 * 50) % 500 + 1).reshape(3, 120, 50).astype(np.uint16)
    data[:, :70] = 0  # the first grid rows are all nodata: no patch, rows final at once
    src = make_geotiff(data=data, nodata=0)
    outs = []
    for streaming in (True, False):
        with Engine("identity", streaming=streaming, patch_size=32, max_batch_patches=2) as e:
            outs.append(e.generate_image(src, output_path=tmp_path / f"{streaming}.tif"))
    _same_output(outs[0].outputs.path, outs[1].outputs.path)
    out, profile = read(outs[0].outputs.path)
    assert out.shape == (3, 120, 50)
    assert np.isnan(out[:, :70]).all()
    np.testing.assert_array_equal(out[:, 70:], data[:, 70:])
