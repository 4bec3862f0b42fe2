"""Several models behind Ray Serve: each replica runs every model, as one server does."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import httpx
import numpy as np
from rasterio.io import MemoryFile

from geoserve import Engine
from geoserve.distributed.serving import build_app
from geoserve.server import ServerSettings
from tests.conftest import write_geotiff
from tests.server.conftest import free_port


@contextlib.contextmanager
def deployed(replicas: int, cpus: float, **settings: object) -> Iterator[str]:
    """The geoserve app on Ray Serve with ``replicas``, ready; its base URL."""
    from ray import serve

    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        serve.run(
            build_app(
                ServerSettings(port=port, **settings),  # type: ignore[arg-type]
                replicas=replicas,
                cpus_per_replica=cpus,
                imports=["tests.stub_models"],
            ),
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
        yield url
    finally:
        serve.shutdown()


def test_a_replica_answers_each_model_it_is_asked_for(ray_cluster, tmp_path):
    with deployed(1, 0.5, models=["test-seg", "identity"]) as url:
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


def test_models_are_multiplexed_over_replicas_by_the_model_header(ray_cluster, tmp_path):
    """Two replicas, two models, one loaded per replica: Ray routes each model to one replica."""
    with deployed(2, 0.25, models=["test-seg", "identity"], max_loaded_models=1) as url:
        path = write_geotiff(
            tmp_path / "s.tif",
            np.random.default_rng(4).integers(0, 400, (3, 30, 40)).astype(np.uint16),
        )
        want = {
            m: Engine(m).generate_image(path, out_format="tensor").outputs.tensor.numpy()
            for m in ("test-seg", "identity")
        }

        def ask(model: str) -> str:
            resp = httpx.post(
                f"{url}/v1/images",
                files={"file": ("s.tif", path.read_bytes())},
                headers={"serve_multiplexed_model_id": model},  # (and no model in the body)
                timeout=60,
            )
            assert resp.status_code == 200, resp.text
            with MemoryFile(resp.content) as mem, mem.open() as ds:
                np.testing.assert_array_equal(ds.read(), want[model])
            return resp.headers["x-geoserve-replica"]

        first = {m: ask(m) for m in ("test-seg", "identity")}  # one load each
        time.sleep(1.0)  # (the replicas have told Ray which model each holds)
        answered: dict[str, set[str]] = {"test-seg": set(), "identity": set()}
        for _ in range(6):
            for m in answered:
                answered[m].add(ask(m))
        assert answered == {m: {first[m]} for m in answered}, (first, answered)
        assert first["test-seg"] != first["identity"]  # (a model each: no reloading)
