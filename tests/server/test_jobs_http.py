"""Jobs over HTTP (``/v1/jobs``) against a real server: submit, poll, results, dismiss."""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import rasterio

from tests.conftest import write_geotiff
from tests.server.conftest import running_server


@pytest.fixture(scope="module")
def scenes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("job_inputs")
    rng = np.random.default_rng(3)
    write_geotiff(root / "small.tif", rng.integers(0, 400, (3, 40, 52)).astype(np.uint16))
    write_geotiff(root / "big.tif", rng.integers(0, 400, (3, 64, 64)).astype(np.uint16))
    return root


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("job_outputs")


@pytest.fixture(scope="module")
def client(scenes: Path, outputs: Path) -> Iterator[httpx.Client]:
    with (
        running_server(
            model="test-slow",
            allowed_input_dirs=[scenes],
            output_dir=outputs,
            max_batch_patches=1,
            max_body_mb=1,
            max_inline_mb=0.05,
        ) as url,
        httpx.Client(base_url=url, timeout=60) as c,
    ):
        yield c


def wait_final(client: httpx.Client, location: str, timeout: float = 60) -> list[dict[str, Any]]:
    """Poll a job until it ends; every status seen, in order."""
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = client.get(location).json()
        seen.append(info)
        if info["status"] in ("successful", "failed", "dismissed"):
            return seen
        time.sleep(0.1)
    raise AssertionError(f"job did not finish: {seen[-1]}")


def test_job_runs_to_results_equal_to_images(
    client: httpx.Client, scenes: Path, outputs: Path
) -> None:
    body = {"data": str(scenes / "big.tif"), "data_format": "path"}
    answer = client.post("/v1/jobs", json=body)
    assert answer.status_code == 201, answer.text
    info = answer.json()
    assert info["type"] == "process"
    assert info["status"] in ("accepted", "running")
    location = answer.headers["location"]
    assert location.endswith(f"/v1/jobs/{info['jobID']}")
    seen = wait_final(client, location)
    final = seen[-1]
    assert final["status"] == "successful", final
    progress = [s["progress"] for s in seen]
    assert progress == sorted(progress)
    assert progress[-1] == 100
    assert any(0 < p < 100 for p in progress), progress  # 16 batches of 0.05 s: seen rising
    results = client.get(f"{location}/results").json()
    assert set(results) == {"raw", "stac-item"}
    out = results["raw"]
    item = client.get(results["stac-item"]["href"]).json()
    assert item["type"] == "Feature"
    assert item["id"] == info["jobID"]
    (asset,) = item["assets"].values()
    assert asset["href"] == "out.tif"  # beside the Item's URL: the output's download URL
    assert str(scenes / "big.tif") in json.dumps(item)  # the input as the client named it
    assert str(outputs) not in json.dumps(item)  # no server path of its own
    assert out["type"].startswith("image/tiff")
    job_bytes = client.get(out["href"]).content
    direct = client.post("/v1/images", json={**body, "out_data_format": "geotiff"})
    assert direct.status_code == 200
    assert job_bytes == direct.content
    listed = client.get("/v1/jobs", params={"status": "successful"}).json()
    assert info["jobID"] in [j["jobID"] for j in listed["jobs"]]


def test_inline_input_job(client: httpx.Client, scenes: Path, outputs: Path) -> None:
    b64 = base64.b64encode((scenes / "small.tif").read_bytes()).decode()
    answer = client.post("/v1/jobs", json={"data": b64})
    assert answer.status_code == 201, answer.text
    assert wait_final(client, answer.headers["location"])[-1]["status"] == "successful"
    assert not list((outputs / "jobs").glob("in-*"))  # its inputs removed once it ended


def test_dismiss_mid_run_removes_outputs(client: httpx.Client, scenes: Path, outputs: Path) -> None:
    answer = client.post("/v1/jobs", json={"data": str(scenes / "big.tif"), "data_format": "path"})
    location = answer.headers["location"]
    job_id = answer.json()["jobID"]
    deadline = time.monotonic() + 30
    while client.get(location).json()["status"] != "running" and time.monotonic() < deadline:
        time.sleep(0.05)
    dismissed = client.delete(location)
    assert dismissed.status_code == 200
    assert dismissed.json()["status"] == "dismissed"
    deadline = time.monotonic() + 10
    while (outputs / "jobs" / job_id).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not (outputs / "jobs" / job_id).exists()
    assert client.get(f"{location}/results").status_code == 404
    after = client.post(
        "/v1/images", json={"data": str(scenes / "small.tif"), "data_format": "path"}
    )
    assert after.status_code == 200


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/v1/jobs/job-nothex", 404),
        ("/v1/jobs/" + "job-" + "0" * 32, 404),
        ("/v1/jobs/x/results", 404),
    ],
)
def test_unknown_jobs_are_404_exceptions(client: httpx.Client, path: str, status: int) -> None:
    answer = client.get(path)
    assert answer.status_code == status
    body = answer.json()
    assert body["status"] == status
    assert {"type", "title", "detail"} <= set(body)


def test_bad_inputs_are_exceptions(client: httpx.Client, scenes: Path, tmp_path: Path) -> None:
    outside = tmp_path / "x.tif"
    write_geotiff(outside, np.zeros((3, 8, 8), np.uint16))
    answer = client.post("/v1/jobs", json={"data": str(outside), "data_format": "path"})
    assert answer.status_code == 403, answer.text
    assert "outside the allowed" in answer.json()["detail"]
    # one that passes the checks but fails when it runs: a failed job with the exception
    (scenes / "broken.tif").write_bytes(b"not a tiff")
    answer = client.post("/v1/jobs", json={"data": "broken.tif", "data_format": "path"})
    assert answer.status_code == 201, answer.text
    final = wait_final(client, answer.headers["location"])[-1]
    assert final["status"] == "failed"
    assert final["exception"]["status"] == 400
    assert "broken.tif" in final["exception"]["detail"]
    big = base64.b64encode(b"\0" * 100_000).decode()
    answer = client.post("/v1/jobs", json={"data": big})
    assert answer.status_code == 413
    assert answer.json()["status"] == 413
    answer = client.post("/v1/jobs", json={"data": "x", "options": {"output_kind": "polygons"}})
    assert answer.status_code == 400
    assert "polygons" in answer.json()["detail"]
    answer = client.post("/v1/jobs", json={"data": "x", "nonsense": 1})
    assert answer.status_code == 400
    assert answer.json()["title"] == "InputError"


def test_ogc_documents(client: httpx.Client) -> None:
    landing = client.get("/ogcapi").json()
    rels = {link["rel"].rsplit("/", 1)[-1] for link in landing["links"]}
    assert {"conformance", "processes", "job-list"} <= rels
    conformance = client.get("/ogcapi/conformance").json()["conformsTo"]
    assert any(c.endswith("/conf/core") for c in conformance)
    assert any(c.endswith("/conf/dismiss") for c in conformance)
    assert not any(c.endswith("/conf/oas30") for c in conformance)  # FastAPI serves 3.1
    (process,) = client.get("/ogcapi/processes").json()["processes"]
    assert process["id"] == "test-slow"
    described = client.get("/ogcapi/processes/test-slow").json()
    assert {"image", "output_kind", "bands", "dates", "seed"} == set(described["inputs"])
    assert "raw" in described["outputs"]
    assert client.get("/ogcapi/processes/nope").json()["status"] == 404


def test_ogc_execute_async_and_sync(client: httpx.Client, scenes: Path) -> None:
    inputs = {"image": {"href": str(scenes / "small.tif")}}
    answer = client.post(
        "/ogcapi/processes/test-slow/execution",
        json={"inputs": inputs},
        headers={"Prefer": "respond-async"},
    )
    assert answer.status_code == 201, answer.text
    location = answer.headers["location"]
    assert "/ogcapi/jobs/job-" in location
    assert wait_final(client, location)[-1]["status"] == "successful"
    async_results = client.get(f"{location}/results").json()
    sync = client.post("/ogcapi/processes/test-slow/execution", json={"inputs": inputs})
    assert sync.status_code == 200, sync.text
    assert set(sync.json()) == set(async_results) == {"raw", "stac-item"}
    a = client.get(async_results["raw"]["href"]).content
    b = client.get(sync.json()["raw"]["href"]).content
    assert a == b
    assert a[:2] in (b"II", b"MM")
    bad = client.post(
        "/ogcapi/processes/test-slow/execution", json={"inputs": {**inputs, "nonsense": 1}}
    )
    assert bad.status_code == 400
    assert "nonsense" in bad.json()["detail"]
    missing = client.post("/ogcapi/processes/nope/execution", json={"inputs": inputs})
    assert missing.status_code == 404
    assert missing.json()["title"] == "NotFoundError"


def test_owslib_client_drives_the_api(client: httpx.Client, scenes: Path) -> None:
    from owslib.ogcapi.processes import Processes

    api = Processes(str(client.base_url).rstrip("/") + "/ogcapi")
    assert [p["id"] for p in api.processes()] == ["test-slow"]
    assert "image" in api.process("test-slow")["inputs"]
    status = api.execute("test-slow", {"image": {"href": str(scenes / "small.tif")}}, async_=True)
    assert status["type"] == "process"
    assert status["jobID"].startswith("job-")
    location = api.response_headers["Location"]
    final = wait_final(client, location)[-1]
    assert final["status"] == "successful"
    results = client.get(f"{location}/results").json()
    assert client.get(results["raw"]["href"]).status_code == 200
    sync = api.execute("test-slow", {"image": {"href": str(scenes / "small.tif")}})
    assert set(sync) == {"raw", "stac-item"}


def test_queued_jobs_do_not_starve_interactive_requests(client: httpx.Client, scenes: Path) -> None:
    """100 queued jobs beside interactive requests: jobs run at a lower priority, so an
    interactive request waits at most for the batch in the model (a generous bound)."""
    body = {"data": str(scenes / "small.tif"), "data_format": "path"}

    def latencies() -> list[float]:
        out = []
        for _ in range(8):
            t0 = time.perf_counter()
            assert client.post("/v1/images", json=body).status_code == 200
            out.append(time.perf_counter() - t0)
        return out

    alone = max(latencies())
    locations = []
    for _ in range(100):
        answer = client.post("/v1/jobs", json=body)
        assert answer.status_code == 201, answer.text
        locations.append(answer.headers["location"])
    beside = max(latencies())
    queued = client.get("/v1/jobs", params={"status": "accepted", "limit": 1}).json()
    assert queued["numberMatched"] > 50  # the interactive requests ran while jobs waited
    assert beside < 3 * alone + 1.0, (alone, beside)
    for location in locations:  # (dismissed: the next tests start with an empty queue)
        client.delete(location)


def test_docs_python_example_runs(
    client: httpx.Client, scenes: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/serving.md's Python jobs example, as written but for the server and the scene."""
    doc = (Path(__file__).resolve().parents[2] / "docs/serving.md").read_text()
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", doc, re.S) if "/v1/jobs" in b]
    code = code.replace("http://localhost:8000", str(client.base_url).rstrip("/"))
    code = code.replace("/data/scenes/s2.tif", str(scenes / "small.tif"))
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "serving.md", "exec"), {})  # noqa: S102
    with rasterio.open(tmp_path / "raw.tif") as dst:
        assert (dst.width, dst.height) == (52, 40)
    assert not (tmp_path / "stac-item.tif").exists()
