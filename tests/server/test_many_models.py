"""One server, several models: each request runs on the model it names, as on its own server.

A module server serves test-seg, identity and test-fragile side by side (each its own engine);
one-model servers of test-seg and identity give the bytes each answer must equal.
"""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from rasterio.io import MemoryFile

from tests.conftest import write_geotiff
from tests.server.conftest import running_server

SERVED = ["test-seg", "identity", "test-fragile"]


@pytest.fixture(scope="module")
def scenes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("many_inputs")
    rng = np.random.default_rng(5)
    for name, (h, w) in {"a": (40, 52), "b": (23, 31)}.items():
        data = rng.integers(0, 400, (3, h, w)).astype(np.float32)
        write_geotiff(root / f"{name}.tif", data)
    write_geotiff(root / "poisoned.tif", np.full((3, 20, 20), 5e6, np.float32))
    return root


@pytest.fixture(scope="module")
def url(scenes: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    out = tmp_path_factory.mktemp("many_outputs")
    with running_server(
        model=SERVED[0],
        models=SERVED,
        allowed_input_dirs=[scenes],
        output_dir=out,
        max_batch_patches=4,
    ) as base:
        yield base


def image(url: str, path: Path, model: str | None, **extra: Any) -> httpx.Response:
    """POST /v1/images of ``path`` as an upload (a ``model`` form field unless None)."""
    data = {"model": model} if model is not None else {}
    return httpx.post(
        f"{url}/v1/images",
        files={"file": (path.name, path.read_bytes())},
        data={**data, **extra},
        timeout=60,
    )


def pixels(tif: bytes) -> np.ndarray:
    with MemoryFile(tif) as mem, mem.open() as ds:
        return ds.read()


def test_each_model_answers_as_its_own_one_model_server(url: str, scenes: Path) -> None:
    expected: dict[tuple[str, str], bytes] = {}
    for model in ("test-seg", "identity"):
        with running_server(model=model, allowed_input_dirs=[scenes], max_batch_patches=4) as one:
            for name in ("a", "b"):
                alone = image(one, scenes / f"{name}.tif", None)
                assert alone.status_code == 200, alone.text
                expected[model, name] = alone.content
    assert expected["test-seg", "a"] != expected["identity", "a"]  # (they do differ)
    for (model, name), want in expected.items():
        got = image(url, scenes / f"{name}.tif", model)
        assert got.status_code == 200, got.text
        assert got.content == want, (model, name)
    # JSON, the model named in the body: the same pixels, and the answer names the model
    body = {
        "model": "identity",
        "data": str(scenes / "a.tif"),
        "data_format": "path",
        "out_data_format": "b64_json",
    }
    answer = httpx.post(f"{url}/v1/images", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["model"] == "identity"
    assert base64.b64decode(answer.json()["data"]) == expected["identity", "a"]

    # requests for both, interleaved from 12 clients at once, each its own model's bytes
    order = [("test-seg", "a"), ("identity", "b"), ("identity", "a"), ("test-seg", "b")] * 3

    def one(job: tuple[str, str]) -> bytes:
        resp = image(url, scenes / f"{job[1]}.tif", job[0])
        assert resp.status_code == 200, resp.text
        return resp.content

    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(one, order))
    for job, got in zip(order, answers, strict=True):
        assert got == expected[job], job


def test_a_request_without_a_model_or_with_an_unknown_one_is_refused(
    url: str, scenes: Path
) -> None:
    missing = image(url, scenes / "a.tif", None)
    assert missing.status_code == 400
    message = missing.json()["message"]
    assert all(name in message for name in SERVED), message
    unknown = image(url, scenes / "a.tif", "prithvi")
    assert unknown.status_code == 404
    assert unknown.json()["message"] == (
        "unknown model 'prithvi'; served here: test-seg, identity, test-fragile"
    )
    body = {"data": str(scenes / "a.tif"), "data_format": "path"}
    assert httpx.post(f"{url}/v1/images", json=body).status_code == 400
    assert httpx.post(f"{url}/v1/images", json={**body, "model": "nope"}).status_code == 404
    pooling = {"data": {"data": str(scenes / "a.tif"), "data_format": "path"}}
    refused = httpx.post(f"{url}/pooling", json=pooling)
    assert refused.status_code == 400
    assert "test-fragile" in refused.json()["message"]
    assert httpx.post(f"{url}/pooling", json={**pooling, "model": "nope"}).status_code == 404
    ran = httpx.post(f"{url}/pooling", json={**pooling, "model": "identity"}, timeout=60)
    assert ran.status_code == 200, ran.text
    assert "Traceback" not in refused.text + unknown.text


def test_ray_serves_model_header_names_the_model_where_the_body_does_not(
    url: str, scenes: Path
) -> None:
    body = {"data": str(scenes / "a.tif"), "data_format": "path", "out_data_format": "b64_json"}
    header = {"serve_multiplexed_model_id": "identity"}
    by_header = httpx.post(f"{url}/v1/images", json=body, headers=header, timeout=60)
    assert by_header.status_code == 200, by_header.text
    assert by_header.json()["model"] == "identity"
    both = {**body, "model": "test-seg"}  # (the body's wins)
    by_body = httpx.post(f"{url}/v1/images", json=both, headers=header, timeout=60)
    assert by_body.json()["model"] == "test-seg"
    long_name = {"serve_multiplexed_model_id": "x" * 500}
    unknown = httpx.post(f"{url}/v1/images", json=body, headers=long_name)
    assert unknown.status_code == 404
    assert len(unknown.json()["message"]) < 200  # (a long header is not echoed whole)
    assert httpx.post(f"{url}/v1/images", json=body).status_code == 400  # (named nowhere)


def test_v1_models_lists_every_served_model(url: str) -> None:
    data = httpx.get(f"{url}/v1/models").json()["data"]
    assert [m["id"] for m in data] == SERVED
    assert all(m["ready"] for m in data)
    by_id = {m["id"]: m for m in data}
    assert by_id["test-seg"]["output"]["classes"] == ["a", "b", "c", "d"]
    assert by_id["identity"]["output"]["classes"] == []
    assert by_id["test-fragile"]["input"]["patch_size"] == 16


def test_a_failing_model_fails_only_its_own_requests(url: str, scenes: Path) -> None:
    with ThreadPoolExecutor(6) as pool:
        bad = [pool.submit(image, url, scenes / "poisoned.tif", "test-fragile") for _ in range(3)]
        good = [pool.submit(image, url, scenes / "a.tif", "test-seg") for _ in range(3)]
        for f in bad:
            resp = f.result()
            assert resp.status_code == 500
            assert "poisoned patch" in resp.json()["message"]
        for f in good:
            assert f.result().status_code == 200
    # the failing model still answers a clean request; the server stays ready
    assert image(url, scenes / "b.tif", "test-fragile").status_code == 200
    assert httpx.get(f"{url}/health/ready").status_code == 200


def test_metrics_name_the_model_of_each_per_model_series(url: str, scenes: Path) -> None:
    assert image(url, scenes / "b.tif", "identity").status_code == 200
    text = httpx.get(f"{url}/metrics").text
    for model in SERVED:
        assert f'geoserve_queue_depth_patches{{model="{model}"}}' in text
    patches = re.search(r'^geoserve_patches_total\{model="identity"\} (\S+)$', text, re.M)
    assert patches is not None
    assert float(patches.group(1)) >= 4
    assert re.search(r'^geoserve_tile_cache_bytes\{model="test-seg"\} ', text, re.M)
    assert 'geoserve_requests_total{endpoint="/v1/images",status="200"}' in text


def test_jobs_and_ogc_processes_per_model(url: str, scenes: Path) -> None:
    processes = httpx.get(f"{url}/ogcapi/processes").json()["processes"]
    assert [p["id"] for p in processes] == SERVED
    described = httpx.get(f"{url}/ogcapi/processes/identity").json()
    assert described["id"] == "identity"
    assert set(described["outputs"]) == {"raw"}
    nope = httpx.get(f"{url}/ogcapi/processes/nope").json()
    assert nope["status"] == 404
    assert "'test-seg', 'identity', 'test-fragile'" in nope["detail"]

    body = {"data": str(scenes / "a.tif"), "data_format": "path"}
    assert httpx.post(f"{url}/v1/jobs", json=body).status_code == 400  # which model?
    assert httpx.post(f"{url}/v1/jobs", json={**body, "model": "x"}).status_code == 404
    jobs = {}
    for model in ("identity", "test-seg"):
        resp = httpx.post(f"{url}/v1/jobs", json={**body, "model": model})
        assert resp.status_code == 201, resp.text
        assert resp.json()["processID"] == model
        jobs[model] = resp.json()["jobID"]
    inputs = {"image": {"href": str(scenes / "a.tif")}}
    sync = httpx.post(
        f"{url}/ogcapi/processes/identity/execution", json={"inputs": inputs}, timeout=60
    )
    assert sync.status_code == 200, sync.text
    direct = pixels(image(url, scenes / "a.tif", "identity").content)
    np.testing.assert_array_equal(pixels(httpx.get(sync.json()["raw"]["href"]).content), direct)
    for model, job_id in jobs.items():
        deadline = time.monotonic() + 30
        while (st := httpx.get(f"{url}/v1/jobs/{job_id}").json())["status"] != "successful":
            assert st["status"] in ("accepted", "running"), st
            assert time.monotonic() < deadline
            time.sleep(0.1)
        results = httpx.get(f"{url}/v1/jobs/{job_id}/results").json()
        kind = "classes" if model == "test-seg" else "raw"
        got = pixels(httpx.get(results[kind]["href"]).content)
        np.testing.assert_array_equal(got, pixels(image(url, scenes / "a.tif", model).content))
