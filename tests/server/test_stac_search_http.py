"""STAC API searches over HTTP, on a real uvicorn: ``{"stac": {...}}`` to ``/v1/images`` and
``/v1/jobs``, the catalogue (a real ``rustac serve``) and every file it names held to the
server's URL allow-list."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import rasterio

import geoserve
from tests.server.conftest import running_server
from tests.stac_catalogue import Catalogue, served_catalogue

pytest.importorskip("odc.stac")


@pytest.fixture(scope="module")
def catalogue(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Catalogue]:
    with served_catalogue(tmp_path_factory.mktemp("stac")) as served:
        yield served


@pytest.fixture(scope="module")
def elsewhere(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Catalogue]:
    """The same catalogue, its band files named at ``localhost`` (a host not allowed)."""
    with served_catalogue(tmp_path_factory.mktemp("stac2"), host="localhost") as served:
        yield served


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    out = tmp_path_factory.mktemp("out")
    with running_server(
        model="ndwi-water", allowed_url_domains=["127.0.0.1"], output_dir=out
    ) as url:
        yield url


def _classes(content: bytes) -> np.ndarray:
    with rasterio.MemoryFile(content) as mem, mem.open() as ds:
        return ds.read(1)


def _post(server: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server}{path}", json=body, timeout=120)


def test_a_search_over_http_equals_the_local_run(server: str, catalogue: Catalogue) -> None:
    resp = _post(server, "/v1/images", {"stac": catalogue.body(), "out_data_format": "geotiff"})
    assert resp.status_code == 200, resp.text
    local = geoserve.Engine("ndwi-water").generate_image(catalogue.search(), out_format="xarray")
    np.testing.assert_array_equal(_classes(resp.content), local.outputs.xarray.values[0])
    with rasterio.MemoryFile(resp.content) as mem, mem.open() as ds:
        assert ds.tags()["STAC_API"] == catalogue.url


def test_a_search_as_a_job(server: str, catalogue: Catalogue) -> None:
    resp = _post(server, "/v1/jobs", {"stac": catalogue.body()})
    assert resp.status_code == 201, resp.text
    location = resp.headers["location"]
    deadline = time.monotonic() + 120
    while (info := httpx.get(location).json())["status"] not in ("successful", "failed"):
        assert time.monotonic() < deadline, info
        time.sleep(0.2)
    assert info["status"] == "successful", info
    results = httpx.get(f"{location}/results").json()
    job = httpx.get(results["classes"]["href"]).content
    direct = _post(server, "/v1/images", {"stac": catalogue.body(), "out_data_format": "geotiff"})
    np.testing.assert_array_equal(_classes(job), _classes(direct.content))
    item = httpx.get(results["stac-item"]["href"]).json()
    sources = [link["href"] for link in item["links"] if link["rel"] == "derived_from"]
    assert len(sources) == 4
    assert all(s.startswith(catalogue.url) for s in sources)
    (given,) = item["properties"]["geoserve:inputs"]  # the search, as its GET URL
    assert given.startswith(f"{catalogue.url}/search?collections=sentinel-2-l2a&bbox=")


def test_a_catalogue_or_file_of_another_host_is_refused(
    catalogue: Catalogue, elsewhere: Catalogue, tmp_path: Path
) -> None:
    with running_server(model="ndwi-water", allowed_url_domains=["localhost"]) as only_localhost:
        resp = _post(only_localhost, "/v1/images", {"stac": catalogue.body()})
        assert resp.status_code == 403, resp.text
        assert "host '127.0.0.1' is not an allowed URL domain" in resp.json()["message"]
        job = _post(only_localhost, "/v1/jobs", {"stac": catalogue.body()})
        assert job.status_code == 403, job.text
    with running_server(model="ndwi-water", allowed_url_domains=["127.0.0.1"]) as server:
        resp = _post(server, "/v1/images", {"stac": elsewhere.body()})
        assert resp.status_code == 403, resp.text
        message = resp.json()["message"]
        assert "asset 'green'" in message
        assert "host 'localhost'" in message
    with running_server(model="ndwi-water") as no_urls:
        resp = _post(no_urls, "/v1/images", {"stac": catalogue.body()})
        assert resp.status_code == 403
        assert "url inputs are disabled" in resp.text


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"stac": {"url": "x"}}, "stac"),
        ({"stac": {"url": "http://127.0.0.1:1", "collections": ["c"], "bbox": [1, 2]}}, "bbox"),
        (
            {"stac": {"url": "http://127.0.0.1:1", "collections": [], "bbox": [0, 0, 1, 1]}},
            "collections",
        ),
        (
            {
                "stac": {
                    "url": "http://127.0.0.1:1",
                    "collections": ["c"],
                    "bbox": [0, 0, 1, 1],
                    "max_items": 5000,
                }
            },
            "max_items",
        ),
        (
            {
                "stac": {
                    "url": "http://127.0.0.1:1",
                    "collections": ["c"],
                    "bbox": [0, 0, 1, 1],
                    "where": 1,
                }
            },
            "where",
        ),
        ({"data": "a.tif", "stac": {}}, "stac"),
        ({}, "data"),
    ],
)
def test_bad_search_bodies_are_400s_naming_the_field(
    server: str, body: dict[str, Any], field: str
) -> None:
    resp = _post(server, "/v1/images", body)
    assert resp.status_code in (400, 422), resp.text  # (422: the body's form; 400: a value)
    assert field in resp.json()["message"]


def test_too_many_items_is_a_400(server: str, catalogue: Catalogue) -> None:
    resp = _post(server, "/v1/images", {"stac": catalogue.body(max_items=3)})
    assert resp.status_code == 400, resp.text
    assert "more than 3 Items" in resp.json()["message"]


def test_a_search_larger_than_max_pixels_is_a_413(catalogue: Catalogue) -> None:
    """The search's grid counts towards --max-pixels before a pixel is read."""
    with running_server(
        model="ndwi-water", allowed_url_domains=["127.0.0.1"], max_pixels=10_000
    ) as server:
        resp = _post(server, "/v1/images", {"stac": catalogue.body()})
    assert resp.status_code == 413, resp.text
    assert "max-pixels" in resp.json()["message"] or "max_pixels" in resp.json()["message"]


@pytest.fixture
def crowded(catalogue: Catalogue, tmp_path: Path) -> Iterator[str]:
    """A real STAC API holding 1,500 Items over the area (copies of one)."""
    import json

    from tests.stac_catalogue import stac_api

    one = catalogue.items[0]
    items = []
    for i in range(1500):
        item = json.loads(json.dumps(one))
        item["id"] = f"{one['id']}_{i:04d}"
        items.append(item)
    with stac_api(items, tmp_path) as url:
        yield url


def test_a_catalogue_of_thousands_of_items_is_refused(server: str, crowded: str) -> None:
    body = {
        "url": crowded,
        "collections": ["sentinel-2-l2a"],
        "bbox": [11.985, 44.996, 12.015, 45.004],
    }
    t0 = time.monotonic()
    resp = _post(server, "/v1/images", {"stac": body})
    assert resp.status_code == 400, resp.text
    assert "more than 100 Items" in resp.json()["message"]
    assert time.monotonic() - t0 < 30  # (101 Items asked for, not all 1,500)


def test_cli_predict_server_stac(server: str, catalogue: Catalogue, tmp_path: Path) -> None:
    """``predict --server URL --stac ...``: the search runs on the server, as a job."""
    from tests.cli_process import run_in_process

    out = tmp_path / "water.tif"
    bbox = ",".join(map(str, catalogue.search().bbox))
    when = "2024-05-25/2024-06-20"
    flags = ["--stac", catalogue.url, "--collection", "sentinel-2-l2a", "--bbox", bbox,
             "--datetime", when]  # fmt: skip
    run = run_in_process("predict", "--server", server, "-o", str(out), "--stac-item", *flags)
    assert run.returncode == 0, run.stderr
    local = geoserve.Engine("ndwi-water").generate_image(catalogue.search(), out_format="xarray")
    with rasterio.open(out) as ds:
        np.testing.assert_array_equal(ds.read(1), local.outputs.xarray.values[0])


def test_a_search_is_held_to_the_remote_budget(catalogue: Catalogue) -> None:
    """The cube's file reads count too (they run after the inputs were opened)."""
    with running_server(
        model="ndwi-water", allowed_url_domains=["127.0.0.1"], max_remote_requests=30
    ) as server:
        resp = _post(server, "/v1/images", {"stac": catalogue.body()})
    assert resp.status_code in (400, 413), resp.text
    assert "--max-remote-requests" in resp.json()["message"]


@pytest.mark.parametrize(
    ("extra", "field"),
    [({"crs": "EPSG:999999"}, "stac.crs"), ({"datetime": "not-a-date/../../"}, "stac.datetime")],
)
def test_a_bad_crs_or_datetime_is_refused_before_asking(
    server: str, extra: dict[str, Any], field: str
) -> None:
    body = {"url": "http://127.0.0.1:9", "collections": ["c"], "bbox": [0, 0, 1, 1], **extra}
    resp = _post(server, "/v1/images", {"stac": body})
    assert resp.status_code == 400, resp.text
    assert field in resp.json()["message"]
