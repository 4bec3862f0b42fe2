"""Many scenes on a real local Ray cluster."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest
import rasterio

from geoserve import Engine
from geoserve.distributed import run_batch
from geoserve.distributed.batch import expand_inputs
from geoserve.errors import ConfigError
from tests.conftest import write_geotiff


def run_test_seg(inputs, out_dir, **kwargs):
    """``run_batch`` of test-seg on two actors, which import the test models."""
    options = {"model": "test-seg", "actors": 2, "imports": ["tests.stub_models"], **kwargs}
    return run_batch(inputs, out_dir, **options)


@pytest.fixture
def scenes(tmp_path):
    rng = np.random.default_rng(9)
    (tmp_path / "in").mkdir()
    paths = []
    for i, (h, w) in enumerate([(40, 52), (17, 90), (64, 30), (33, 33), (70, 41), (25, 60)]):
        data = rng.integers(0, 400, (3, h, w)).astype(np.uint16)
        paths.append(write_geotiff(tmp_path / "in" / f"s{i}.tif", data))
    return paths


def test_six_scenes_over_two_actors_equal_the_single_process_engine(ray_cluster, scenes, tmp_path):
    out_dir = tmp_path / "out"
    summary = run_test_seg([str(tmp_path / "in" / "*.tif")], out_dir)
    assert [r.ok for r in summary.results] == [True] * 6
    assert summary.patches > 0
    assert not summary.failed
    engine = Engine("test-seg")
    for path, result in zip(scenes, summary.results, strict=True):
        assert result.path == str(path)
        expected = engine.generate_image(path, out_format="tensor").outputs.tensor.numpy()
        with rasterio.open(result.output) as dst, rasterio.open(path) as src:
            np.testing.assert_array_equal(dst.read(), expected)
            assert (dst.crs, dst.transform) == (src.crs, src.transform)


def test_corrupt_scene_reported_others_finish_and_rerun_does_no_work(ray_cluster, scenes, tmp_path):
    bad = tmp_path / "in" / "zz_corrupt.tif"
    bad.write_bytes(b"II*\x00" + b"\x00" * 100)
    out_dir = tmp_path / "out"
    first = run_test_seg([str(tmp_path / "in" / "*.tif")], out_dir, retries=1)
    failed = first.failed
    assert [r.path for r in failed] == [str(bad)]
    assert "zz_corrupt.tif" in failed[0].error
    assert failed[0].attempts == 2
    assert sum(r.ok for r in first.results) == 6
    assert not (out_dir / "zz_corrupt_pred.tif").exists()
    stamps = {p: p.stat().st_mtime_ns for p in out_dir.glob("*.tif")}
    t0 = time.perf_counter()
    second = run_test_seg([str(tmp_path / "in" / "*.tif")], out_dir)
    assert sum(r.skipped for r in second.results) == 6
    assert second.patches == 0
    assert [r.path for r in second.failed] == [str(bad)]  # still reported, never dropped
    assert {p: p.stat().st_mtime_ns for p in out_dir.glob("*.tif")} == stamps
    assert "6 skipped (output exists), 1 failed" in second.line()
    assert time.perf_counter() - t0 < 120


def test_engine_that_cannot_start_on_the_workers_is_one_clear_error(ray_cluster, scenes, tmp_path):
    from geoserve.errors import GeoServeError

    with pytest.raises(GeoServeError, match="weights file for model 'test-seg' not found"):
        run_test_seg([str(scenes[0])], tmp_path / "o", actors=1, weights=tmp_path / "missing.pt")


def test_pattern_matching_nothing_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="matches no file"):
        expand_inputs([str(tmp_path / "*.tif")])


def test_cli_ray_run(scenes, tmp_path):
    code = "import sys; from geoserve.cli import main; sys.exit(main(sys.argv[1:]))"
    out_dir = tmp_path / "cli_out"
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "predict",
            "--ray",
            "--ray-actors",
            "1",
            "--model",
            "identity",
            str(tmp_path / "in" / "s0.tif"),
            str(tmp_path / "in" / "s1.tif"),
            "-o",
            str(out_dir),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "2 scene(s) done, 0 skipped (output exists), 0 failed" in res.stdout
    assert (out_dir / "s0_pred.tif").exists()
    with rasterio.open(out_dir / "s1_pred.tif") as dst, rasterio.open(scenes[1]) as src:
        np.testing.assert_array_equal(dst.read(), src.read().astype(np.float32))


def test_several_output_kinds_per_scene_and_a_rerun_skips_them(ray_cluster, scenes, tmp_path):
    out_dir = tmp_path / "out"
    kinds = ["classes", "confidence", "polygons"]
    summary = run_test_seg([str(p) for p in scenes[:2]], out_dir, output_kind=kinds)
    assert [r.ok for r in summary.results] == [True, True]
    names = sorted(p.name for p in out_dir.iterdir() if not p.name.endswith(".aux.xml"))
    assert names == sorted(
        f"s{i}_{k}{'.gpkg' if k == 'polygons' else '.tif'}" for i in range(2) for k in kinds
    )
    with rasterio.open(out_dir / "s0_confidence.tif") as dst:
        assert (dst.count, dst.dtypes[0]) == (1, "float32")
    again = run_test_seg([str(p) for p in scenes[:2]], out_dir, output_kind=kinds)
    assert all(r.skipped for r in again.results)
    (out_dir / "s1_polygons.gpkg").unlink()  # one kind missing: that scene runs again
    third = run_test_seg([str(p) for p in scenes[:2]], out_dir, output_kind=kinds)
    assert [r.skipped for r in third.results] == [True, False]
    assert (out_dir / "s1_polygons.gpkg").is_file()
