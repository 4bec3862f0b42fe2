"""Several models behind Ray Serve: each replica runs every model, as one server does."""

from __future__ import annotations

import time

import httpx
import numpy as np
from rasterio.io import MemoryFile

from geoserve import Engine
from geoserve.distributed.serving import build_app
from geoserve.server import ServerSettings
from tests.conftest import write_geotiff
from tests.server.conftest import free_port


def test_a_replica_answers_each_model_it_is_asked_for(ray_cluster, tmp_path):
    from ray import serve

    port = free_port()
    settings = ServerSettings(models=["test-seg", "identity"], port=port)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        serve.run(
            build_app(settings, replicas=1, cpus_per_replica=0.5, imports=["tests.stub_models"]),
            name="geoserve",
            route_prefix="/",
            blocking=False,
        )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health/ready", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        path = write_geotiff(
            tmp_path / "s.tif",
            np.random.default_rng(3).integers(0, 400, (3, 30, 40)).astype(np.uint16),
        )
        models = httpx.get(f"{url}/v1/models", timeout=30).json()["data"]
        assert [m["id"] for m in models] == ["test-seg", "identity"]
        for model in ("identity", "test-seg"):
            resp = httpx.post(
                f"{url}/v1/images",
                files={"file": ("s.tif", path.read_bytes())},
                data={"model": model},
                timeout=60,
            )
            assert resp.status_code == 200, resp.text
            want = Engine(model).generate_image(path, out_format="tensor").outputs.tensor
            with MemoryFile(resp.content) as mem, mem.open() as ds:
                np.testing.assert_array_equal(ds.read(), want.numpy())
        missing = httpx.post(
            f"{url}/v1/images", files={"file": ("s.tif", path.read_bytes())}, timeout=60
        )
        assert missing.status_code == 400
        assert "test-seg, identity" in missing.json()["message"]
    finally:
        serve.shutdown()
