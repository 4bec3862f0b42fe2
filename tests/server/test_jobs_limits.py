"""Jobs at their bounds against a real server: ``max_jobs`` (503 + Retry-After, then accepted
again), outputs inline in the results (small ones only), and a job store that fails while the
server runs (a clear 503, never a stack trace; back once the store is)."""

from __future__ import annotations

import base64
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.conftest import write_geotiff
from tests.server.conftest import running_server

RETRY_AFTER_S = 3
INLINE_MB = 0.016  # 16 777 bytes: small.tif's raw output (~12.7 kB) fits, big.tif's (~23 kB) not


@pytest.fixture(scope="module")
def scenes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("limit_inputs")
    rng = np.random.default_rng(11)
    write_geotiff(root / "small.tif", rng.integers(0, 400, (3, 40, 52)).astype(np.uint16))
    write_geotiff(root / "big.tif", rng.integers(0, 400, (3, 64, 64)).astype(np.uint16))
    return root


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("limit_outputs")


@pytest.fixture(scope="module")
def client(scenes: Path, outputs: Path) -> Iterator[httpx.Client]:
    with (
        running_server(
            model="test-slow",
            allowed_input_dirs=[scenes],
            output_dir=outputs,
            max_batch_patches=1,
            max_jobs=1,
            retry_after_s=RETRY_AFTER_S,
            max_inline_mb=INLINE_MB,
        ) as url,
        httpx.Client(base_url=url, timeout=60) as c,
    ):
        yield c


def job(scenes: Path, name: str) -> dict[str, str]:
    return {"data": str(scenes / name), "data_format": "path"}


def wait_final(client: httpx.Client, location: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info: dict[str, Any] = client.get(location).json()
        if info["status"] in ("successful", "failed", "dismissed"):
            return info
        time.sleep(0.05)
    raise AssertionError(f"job did not finish: {info}")


def assert_busy(answer: httpx.Response, title: str, *words: str) -> dict[str, Any]:
    """A 503 with Retry-After and the standard's exception JSON naming ``words``."""
    assert answer.status_code == 503, answer.text
    assert answer.headers["retry-after"] == str(RETRY_AFTER_S)
    assert answer.headers["content-type"] == "application/json"
    body: dict[str, Any] = answer.json()
    assert body["status"] == 503
    assert body["title"] == title
    for word in words:
        assert word in body["detail"], (word, body)
    assert "Traceback" not in answer.text
    return body


def test_past_max_jobs_is_503_then_accepted_once_one_finished(
    client: httpx.Client, scenes: Path
) -> None:
    first = client.post("/v1/jobs", json=job(scenes, "big.tif"))  # 16 batches of 0.05 s
    assert first.status_code == 201, first.text
    refused = client.post("/v1/jobs", json=job(scenes, "small.tif"))
    assert_busy(refused, "QueueFullError", "1 job queued or running", "max_jobs 1")
    ogc = client.post(
        "/ogcapi/processes/test-slow/execution",
        json={"inputs": {"image": {"href": str(scenes / "small.tif")}}},
        headers={"Prefer": "respond-async"},
    )
    assert_busy(ogc, "QueueFullError", "max_jobs 1")
    assert client.get(first.headers["location"]).json()["status"] in ("accepted", "running")
    assert wait_final(client, first.headers["location"])["status"] == "successful"
    again = client.post("/v1/jobs", json=job(scenes, "big.tif"))
    assert again.status_code == 201, again.text
    # a dismissed job frees its place at once
    assert client.post("/v1/jobs", json=job(scenes, "small.tif")).status_code == 503
    assert client.delete(again.headers["location"]).json()["status"] == "dismissed"
    last = client.post("/v1/jobs", json=job(scenes, "small.tif"))
    assert last.status_code == 201, last.text
    assert wait_final(client, last.headers["location"])["status"] == "successful"


def test_small_outputs_inline_when_asked(client: httpx.Client, scenes: Path) -> None:
    from owslib.ogcapi.processes import Processes

    api = Processes(str(client.base_url).rstrip("/") + "/ogcapi")
    assert api.process("test-slow")["outputTransmission"] == ["value", "reference"]
    by_value = {"raw": {"transmissionMode": "value"}}
    small = api.execute("test-slow", {"image": {"href": str(scenes / "small.tif")}}, by_value)
    raw = small["raw"]  # the sync answer, as the execute request's outputs asked
    assert set(raw) == {"value", "mediaType", "encoding"}
    assert (raw["encoding"], raw["mediaType"]) == ("base64", "image/tiff; application=geotiff")
    assert "href" in small["stac-item"]  # the Item stays a link
    (newest,) = client.get("/ogcapi/jobs", params={"limit": 1}).json()["jobs"]
    job_id = newest["jobID"]
    for prefix in ("/ogcapi/jobs", "/v1/jobs"):  # asked with the job: inline whenever fetched
        assert client.get(f"{prefix}/{job_id}/results").json()["raw"]["value"] == raw["value"]
    link_bytes = client.get(f"/v1/jobs/{job_id}/outputs/out.tif").content
    assert base64.b64decode(raw["value"]) == link_bytes
    assert link_bytes[:2] in (b"II", b"MM")

    prefer = {"Prefer": "respond-async, return=representation"}
    for name in ("small.tif", "big.tif"):
        location = client.post("/v1/jobs", json=job(scenes, name)).headers["location"]
        assert wait_final(client, location)["status"] == "successful"
        plain = client.get(f"{location}/results")
        assert "value" not in plain.json()["raw"]  # no preference: a link
        asked = client.get(f"{location}/results", headers=prefer)
        if name == "small.tif":
            assert asked.headers["preference-applied"] == "return=representation"
            assert base64.b64decode(asked.json()["raw"]["value"]) == link_bytes
        else:  # over the bound: still a link, and the preference was not applied
            assert plain.json()["raw"]["size"] > INLINE_MB * 1024 * 1024 >= len(link_bytes)
            assert asked.json() == plain.json()
            assert "preference-applied" not in asked.headers


@pytest.mark.parametrize(
    ("asked", "detail"),
    [
        ({"polygons": {"transmissionMode": "value"}}, "unknown output 'polygons'"),
        ({"raw": {"transmissionMode": "inline"}}, "outputs.raw: give"),
        (["raw"], "outputs: a JSON object"),
    ],
)
def test_bad_outputs_are_400(
    client: httpx.Client, scenes: Path, asked: object, detail: str
) -> None:
    answer = client.post(
        "/ogcapi/processes/test-slow/execution",
        json={"inputs": {"image": {"href": str(scenes / "small.tif")}}, "outputs": asked},
    )
    assert answer.status_code == 400, answer.text
    assert detail in answer.json()["detail"]


def test_store_removed_while_serving_is_503_until_put_back(
    client: httpx.Client, scenes: Path, outputs: Path, tmp_path: Path
) -> None:
    """The SQLite file removed under the running server: the job routes answer a clear 503
    naming the file (no new, empty store in its place), interactive requests carry on, and
    the jobs are back once the file is."""
    done = client.post("/v1/jobs", json=job(scenes, "small.tif"))
    location = done.headers["location"]
    assert wait_final(client, location)["status"] == "successful"
    path = outputs / "jobs.sqlite3"
    backup = tmp_path / "backup.sqlite3"
    with sqlite3.connect(path) as src, sqlite3.connect(backup) as dst:
        src.backup(dst)
    for file in outputs.glob("jobs.sqlite3*"):
        file.unlink()
    try:
        for answer in (
            client.get(location),
            client.get("/v1/jobs"),
            client.post("/v1/jobs", json=job(scenes, "small.tif")),
            client.get("/ogcapi/jobs"),
        ):
            assert_busy(answer, "JobStoreError", str(path), "is gone")
        assert not path.exists()
        direct = client.post("/v1/images", json=job(scenes, "small.tif"))
        assert direct.status_code == 200, direct.text
    finally:
        backup.replace(path)
    assert client.get(location).json()["status"] == "successful"
    after = client.post("/v1/jobs", json=job(scenes, "small.tif"))
    assert after.status_code == 201, after.text
    assert wait_final(client, after.headers["location"])["status"] == "successful"
