"""STAC Items over HTTP, on a real uvicorn: an Item read from an allowed path or URL, and every
file it names held to the same allow-lists as an input the request named itself."""

from __future__ import annotations

import base64
import http.server
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import rasterio

from geoserve import Engine
from tests.conftest import http_server, serve_ranges
from tests.server.conftest import running_server
from tests.stac_items import write_s2_item

SIZE = 64


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """An allowed directory holding an S2 Item and its files, and a directory outside it."""
    allowed = tmp_path_factory.mktemp("allowed")
    write_s2_item(allowed / "s2", SIZE)
    outside = tmp_path_factory.mktemp("outside")
    shutil.copy(allowed / "s2" / "B03.tif", outside / "secret.tif")
    return allowed, outside


@pytest.fixture(scope="module")
def ranges(roots: tuple[Path, Path]) -> Iterator[str]:
    with serve_ranges(roots[0] / "s2") as (base, _):
        yield base


@pytest.fixture(scope="module")
def server(roots: tuple[Path, Path]) -> Iterator[str]:
    with running_server(
        model="ndwi-water",
        allowed_input_dirs=[roots[0]],
        allowed_url_domains=["127.0.0.1"],
        patch_size=32,
    ) as url:
        yield url


def _post(server: str, data: str, data_format: str) -> httpx.Response:
    body = {"data": data, "data_format": data_format}
    return httpx.post(f"{server}/v1/images", json=body, timeout=60)


def _classes(resp: httpx.Response) -> np.ndarray:
    assert resp.status_code == 200, resp.text
    with rasterio.MemoryFile(base64.b64decode(resp.json()["data"])) as mem, mem.open() as src:
        return src.read(1)


@pytest.fixture(scope="module")
def offline(roots: tuple[Path, Path]) -> np.ndarray:
    out = Engine("ndwi-water", patch_size=32).generate_image(
        str(roots[0] / "s2" / "s2_item.json"), out_format="bytes"
    )
    with rasterio.MemoryFile(out.outputs.data) as mem, mem.open() as src:
        return src.read(1)


def test_an_item_under_an_allowed_directory(server, roots, offline):
    got = _classes(_post(server, "s2/s2_item.json", "path"))
    np.testing.assert_array_equal(got, offline)


def test_an_item_at_an_allowed_url_read_in_place(server, ranges, offline):
    np.testing.assert_array_equal(_classes(_post(server, f"{ranges}/s2_item.json", "url")), offline)


def _item_with(directory: Path, name: str, green_href: str) -> str:
    data = json.loads((directory / "s2" / "s2_item.json").read_text())
    data["assets"]["green"]["href"] = green_href
    (directory / "s2" / name).write_text(json.dumps(data))
    return f"s2/{name}"


@pytest.mark.parametrize(
    ("href", "status", "needle"),
    [
        ("OUTSIDE/secret.tif", 403, "outside the allowed input directories"),
        ("../../../../../../etc/passwd", 403, "outside the allowed input directories"),
        ("http://example.com/B03.tif", 403, "not an allowed URL domain"),
        ("s3://bucket/B03.tif", 400, "s3:// hrefs are not read"),
        ("/vsicurl/http://127.0.0.1/B03.tif", 403, "path inputs take a file path, not a URL"),
        ("/vsizip/x.zip/B03.tif", 403, "outside the allowed input directories"),
    ],
)
def test_an_item_cannot_reach_what_the_request_could_not(server, roots, href, status, needle):
    allowed, outside = roots
    href = href.replace("OUTSIDE", str(outside))
    resp = _post(server, _item_with(allowed, f"bad{abs(hash(href))}.json", href), "path")
    assert resp.status_code == status, resp.text
    assert needle in resp.json()["message"]
    assert "asset 'green'" in resp.json()["message"] or "B03" in resp.json()["message"]


def test_a_remote_item_may_not_name_local_files(server, roots, tmp_path):
    allowed, _ = roots
    # (an absolute path in a remote Item is a path on its host: a URL like any other)
    name = _item_with(allowed, "names_local.json", f"file://{allowed / 's2' / 'B03.tif'}")
    with serve_ranges(allowed) as (base, _):
        resp = _post(server, f"{base}/{name}", "url")
    assert resp.status_code == 400, resp.text
    assert "an Item read from a URL may not name local files" in resp.json()["message"]


def test_an_item_outside_the_allowed_directories_is_not_read(server, roots):
    _, outside = roots
    (outside / "item.json").write_text("{}")
    resp = _post(server, str(outside / "item.json"), "path")
    assert resp.status_code == 403
    assert "outside the allowed input directories" in resp.json()["message"]


def test_an_item_file_behind_a_redirect_is_refused(server, roots):
    """A file an Item names is checked like a URL input: a host that redirects is refused
    before GDAL reads it (GDAL would follow the redirect to a host not allowed)."""
    allowed, _ = roots
    hits: list[str] = []

    class Redirect(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:  # noqa: N802 - the handler's API
            hits.append(self.path)
            self.send_response(302)
            self.send_header("Location", "http://localhost:9/secret.tif")
            self.end_headers()

        do_GET = do_HEAD  # noqa: N815

        def log_message(self, *args: object) -> None:
            pass

    with http_server(Redirect) as base:
        name = _item_with(allowed, "redirects.json", f"{base}/B03.tif")
        resp = _post(server, name, "path")
    assert resp.status_code == 403, resp.text
    assert "redirects are not followed" in resp.json()["message"]
    assert hits == ["/B03.tif"]  # one HEAD, nothing after it


def test_at_most_eight_items_per_request(server):
    data = {f"m{i}": "s2/s2_item.json" for i in range(9)}
    resp = httpx.post(f"{server}/v1/images", json={"data": data, "data_format": "path"})
    assert resp.status_code == 400
    assert "more than 8 STAC Items in one request" in resp.json()["message"]
