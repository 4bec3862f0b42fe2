"""The HTTP API as a Ray Serve deployment with two replicas, on the local cluster."""

from __future__ import annotations

import base64
import time

import httpx
import numpy as np
from rasterio.io import MemoryFile

from geoserve import Engine
from geoserve.distributed.serving import build_app
from geoserve.server import ServerSettings
from tests.conftest import write_geotiff
from tests.server.conftest import free_port


def test_serve_deployment_answers_the_images_contract(ray_cluster, tmp_path):
    from ray import serve

    port = free_port()
    settings = ServerSettings(model="test-seg", port=port)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        serve.run(
            build_app(settings, replicas=2, cpus_per_replica=0.5, imports=["tests.stub_models"]),
            name="geoserve",
            route_prefix="/",
            blocking=False,
        )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        ready_in_a_row = 0  # requests are spread over both replicas: each must have loaded
        while time.monotonic() < deadline and ready_in_a_row < 8:
            try:
                ok = httpx.get(f"{url}/health/ready", timeout=5).status_code == 200
            except httpx.HTTPError:
                ok = False
            ready_in_a_row = ready_in_a_row + 1 if ok else 0
            time.sleep(0.1 if ok else 0.5)
        path = write_geotiff(
            tmp_path / "s.tif",
            np.random.default_rng(2).integers(0, 400, (3, 40, 50)).astype(np.uint16),
        )
        expected = Engine("test-seg").generate_image(path, out_format="tensor").outputs.tensor
        resp = httpx.post(
            f"{url}/v1/images", files={"file": ("s.tif", path.read_bytes())}, timeout=60
        )
        assert resp.status_code == 200, resp.text
        assert resp.headers["content-type"] == "image/tiff"
        with MemoryFile(resp.content) as mem, mem.open() as ds:
            np.testing.assert_array_equal(ds.read(), expected.numpy())
        body = httpx.post(
            f"{url}/v1/images",
            json={
                "data": base64.b64encode(path.read_bytes()).decode(),
                "out_data_format": "b64_json",
            },
            timeout=60,
        ).json()
        assert body["model"] == "test-seg"
        assert body["width"] == 50
        refused = httpx.post(
            f"{url}/v1/images", json={"data": "/etc/passwd", "data_format": "path"}, timeout=60
        )
        assert refused.status_code == 403
        assert refused.json()["type"] == "ForbiddenInputError"
    finally:
        serve.shutdown()
