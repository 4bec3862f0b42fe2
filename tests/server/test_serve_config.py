"""``geoserve serve`` takes every engine option, from flags and from ``--config FILE``."""

from __future__ import annotations

import httpx
import numpy as np
from rasterio.io import MemoryFile

from geoserve import Engine, EngineConfig
from geoserve.cli import build_parser
from geoserve.cli.serve import server_settings
from tests.conftest import write_geotiff
from tests.server.conftest import free_port, running_server


def test_tiling_and_output_kind_from_a_file_and_flags_reach_the_server(tmp_path):
    scene = write_geotiff(
        tmp_path / "s.tif", np.random.default_rng(2).integers(0, 400, (3, 41, 29)).astype(np.uint16)
    )
    conf = tmp_path / "serve.yaml"
    conf.write_text(
        "model: test-seg\noutput_kind: probabilities\npatch_size: 20\nstride: 8\n"
        "max_queued_patches: 500\n"
    )
    argv = ["serve", "--config", str(conf), "--stride", "10", "--blend", "mean"]
    settings = server_settings(build_parser().parse_args([*argv, "--port", str(free_port())]))
    assert settings.max_queued_patches == 500  # a server field from the file
    with running_server(**settings.model_dump()) as url:
        model = httpx.get(f"{url}/v1/models").json()["data"][0]
        assert model["input"]["patch_size"] == 20
        assert model["input"]["stride"] == 10  # the flag over the file
        assert model["output"]["kind"] == "probabilities"
        resp = httpx.post(f"{url}/v1/images", files={"file": ("s.tif", scene.read_bytes())})
    assert resp.status_code == 200, resp.text
    with MemoryFile(resp.content) as mem, mem.open() as ds:
        got = ds.read()
    config = EngineConfig(output_kind="probabilities", patch_size=20, stride=10, blend="mean")
    want = Engine("test-seg", config).generate_image(scene, out_format="tensor")
    np.testing.assert_allclose(got, want.outputs.tensor.numpy(), rtol=1e-5)
