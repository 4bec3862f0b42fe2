"""The actors on Ray run with the EngineConfig they are given."""

from __future__ import annotations

import numpy as np
import rasterio

from geoserve import Engine, EngineConfig
from geoserve.distributed import run_batch
from tests.conftest import write_geotiff


def test_actors_run_with_the_config(ray_cluster, tmp_path):
    rng = np.random.default_rng(4)
    (tmp_path / "in").mkdir()
    path = write_geotiff(
        tmp_path / "in" / "s.tif", rng.integers(0, 400, (3, 45, 37)).astype(np.uint16)
    )
    config = EngineConfig(output_kind="probabilities", patch_size=20, stride=10, blend="mean")
    summary = run_batch(
        [str(path)],
        tmp_path / "out",
        model="test-seg",
        imports=["tests.stub_models"],
        config=config,
        cog=True,
    )
    assert [r.ok for r in summary.results] == [True]
    expected = Engine("test-seg", config).generate_image(path, out_format="tensor")
    with rasterio.open(summary.results[0].output) as dst:
        assert dst.count == 4  # one probability band per class, not a class map
        assert dst.dtypes[0] == "float32"
        assert dst.profile["tiled"]  # cog=True: the override reached the actor too
        np.testing.assert_allclose(dst.read(), expected.outputs.tensor.numpy(), rtol=1e-6)
