"""A batch's seed reaches the actors' requests on a real local Ray cluster."""

from __future__ import annotations

import numpy as np
import pytest
import rasterio

from geoserve import Engine
from geoserve.distributed import run_batch
from geoserve.errors import ConfigError
from tests.conftest import write_geotiff


def test_the_seed_reaches_every_scene_on_the_actors(ray_cluster, tmp_path):
    rng = np.random.default_rng(8)
    (tmp_path / "in").mkdir()
    paths = [
        write_geotiff(
            tmp_path / "in" / f"s{i}.tif", rng.integers(0, 400, (2, 20, 18 + i)).astype(np.uint16)
        )
        for i in range(2)
    ]
    options = {"model": "test-steps", "actors": 1, "imports": ["tests.stub_models"]}
    summary = run_batch([str(p) for p in paths], tmp_path / "out", seed=5, **options)
    assert [r.ok for r in summary.results] == [True, True]
    with Engine("test-steps") as engine:
        for path, result in zip(paths, summary.results, strict=True):
            seeded = engine.generate_image(path, out_format="tensor", seed=5).outputs.tensor
            unseeded = engine.generate_image(path, out_format="tensor").outputs.tensor
            with rasterio.open(result.output) as dst:
                written = dst.read()
            np.testing.assert_array_equal(written, seeded.numpy())
            assert not np.array_equal(written, unseeded.numpy())


@pytest.mark.parametrize("seed", [-1, 2**63, True, "5"])
def test_a_bad_seed_is_refused_before_ray_starts(seed, tmp_path):
    with pytest.raises(ConfigError, match=r"^seed: an integer from 0 to 2\*\*63 - 1"):
        run_batch([str(tmp_path / "none.tif")], tmp_path / "out", model="test-steps", seed=seed)
