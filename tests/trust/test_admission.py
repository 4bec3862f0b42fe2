"""Opening a request's inputs, against an allowed host that answers late or fans out.

Admission (the HEAD and range GET of each URL, GDAL opening it, a STAC Item's files one by one)
runs under the request's one deadline, in the engine's own threads, and within a budget of
remote requests, bytes and pixels: a slow host gets a 504 at the deadline, an upload never
waits behind it, and a STAC request naming hundreds of files is refused at the budget, not
after all of them were fetched. The test host is a real HTTP server on 127.0.0.1 that counts
what it is asked; it tells GDAL's requests from the server's own by their User-Agent.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import numpy as np
import pytest

from tests.conftest import http_server, write_geotiff
from tests.server.conftest import running_server
from tests.stac_items import asset, item

#: A file's side: each file holds 16 x 16 = 256 pixels of one band.
SIDE = 16


class Host:
    """What the test host was asked: (method, path, user agent) of every request."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str, str]] = []
        self.held = 0  # GDAL requests waiting at the gate now
        self.lock = threading.Lock()

    def gdal_files(self) -> set[str]:
        """The files GDAL asked for."""
        with self.lock:
            return {p for _, p, ua in self.log if ua.startswith("GDAL")}


@contextmanager
def late_host(
    blob: bytes, gdal_delay_s: float = 0.0, gate: threading.Event | None = None
) -> Iterator[tuple[str, Host]]:
    """A host serving ``blob`` at every ``.tif`` path (with byte ranges) and STAC Items at
    ``/item{k}.json`` (64 single-band assets each, every one its own URL).

    GDAL's requests answer ``gdal_delay_s`` late, or once ``gate`` is set (at most 30 s); the
    server's own checks are answered at once, as an attacker's host can choose to."""
    host = Host()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self, body: bool) -> None:
            agent = self.headers.get("User-Agent", "")
            with host.lock:
                host.log.append((self.command, self.path, agent))
            if agent.startswith("GDAL"):
                if gate is not None:
                    with host.lock:
                        host.held += 1
                    gate.wait(30)
                    with host.lock:
                        host.held -= 1
                time.sleep(gdal_delay_s)
            data = blob
            match = re.fullmatch(r"/item(\d+)\.json", self.path)
            if match is not None:
                data = json.dumps(_item(self.path, int(match.group(1)))).encode()
            rng = re.match(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
            if rng and self.command == "GET" and match is None:
                a = int(rng.group(1))
                b = min(int(rng.group(2) or len(blob) - 1), len(blob) - 1)
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {a}-{b}/{len(blob)}")
                data = blob[a : b + 1]
            else:
                self.send_response(200)
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if body:
                self.wfile.write(data)

        def do_HEAD(self) -> None:  # noqa: N802 - the handler's API
            self._answer(False)

        def do_GET(self) -> None:  # noqa: N802
            self._answer(True)

        def log_message(self, *args: Any) -> None:
            pass

    with http_server(Handler) as base:
        yield base, host


def _item(path: str, k: int) -> dict[str, Any]:
    """Item ``k``: 64 assets, each one band in its own file (relative hrefs)."""
    assets = {f"b{j}": asset(f"i{k}/b{j}.tif", f"B{j}", None) for j in range(64)}
    return item(assets, item_id=f"item{k}")


@pytest.fixture(scope="module")
def blob(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A small single-band GeoTIFF (every file the host serves)."""
    path = tmp_path_factory.mktemp("late") / "b.tif"
    return write_geotiff(path, np.ones((1, SIDE, SIDE), np.uint16)).read_bytes()


def test_a_late_host_gets_a_504_at_the_deadline_and_no_more_opens(blob):
    """Eight URL modalities whose GDAL opens each answer 2 s late, 3 s for the request: the
    answer is a 504 at the deadline (the old server opened all eight, then answered 200)."""
    with (
        late_host(blob, gdal_delay_s=2.0) as (base, host),
        running_server(
            model="identity", allowed_url_domains=["127.0.0.1"], request_timeout_s=3
        ) as url,
    ):
        data = {f"m{i}": f"{base}/s{i}.tif" for i in range(8)}
        t0 = time.monotonic()
        resp = httpx.post(
            f"{url}/v1/images", json={"data": data, "data_format": "url"}, timeout=120
        )
        took = time.monotonic() - t0
        print(f"8 late URL modalities: HTTP {resp.status_code} after {took:.1f} s")
        assert resp.status_code == 504, resp.text[:300]
        assert "did not finish within 3 s" in resp.json()["message"]
        assert took < 3 + 2.5, took  # at the deadline, not after the opens (a margin, no benchmark)
        opened = host.gdal_files()
        time.sleep(2 * 2.0 + 1)  # what GDAL had in flight answers; nothing new may start
        assert host.gdal_files() <= opened | {f"/s{len(opened)}.tif"}, "opens went on"
        assert len(host.gdal_files()) < 8


def test_an_upload_never_waits_behind_slow_remote_opens(blob, tmp_path):
    """As many slow URL requests as the old shared thread pool had threads (the remote lane
    has as many by default), each stuck in a GDAL open: an upload still answers 200 while
    they are pending."""
    slow_n = min(32, (os.cpu_count() or 1) + 4)  # asyncio's default executor's size
    fine = write_geotiff(tmp_path / "f.tif", np.ones((3, 24, 24), np.uint16)).read_bytes()
    gate = threading.Event()
    with (
        late_host(blob, gate=gate) as (base, host),
        running_server(
            model="identity",
            allowed_url_domains=["127.0.0.1"],
            request_timeout_s=60,
        ) as url,
    ):

        async def scenario() -> tuple[httpx.Response, bool, list[httpx.Response]]:
            async with httpx.AsyncClient(base_url=url, timeout=60) as ac:
                slow = [
                    asyncio.create_task(
                        ac.post(
                            "/v1/images", json={"data": f"{base}/slow{i}.tif", "data_format": "url"}
                        )
                    )
                    for i in range(slow_n)
                ]
                deadline = time.monotonic() + 20
                while host.held < slow_n:  # every slow request is inside a GDAL open
                    assert time.monotonic() < deadline, f"only {host.held} opens started"
                    await asyncio.sleep(0.05)
                innocent = await ac.post("/v1/images", files={"file": ("f.tif", fine)})
                pending = host.held == slow_n and not any(t.done() for t in slow)
                gate.set()
                return innocent, pending, list(await asyncio.gather(*slow))

        try:
            innocent, pending, slow = asyncio.run(scenario())
        finally:
            gate.set()
    assert innocent.status_code == 200, innocent.text[:300]
    assert pending, "the upload answered only once the slow requests were done"
    assert [r.status_code for r in slow] == [200] * slow_n


@contextmanager
def item_server(blob: bytes, **settings: Any) -> Iterator[tuple[str, str, Host]]:
    with (
        late_host(blob) as (base, host),
        running_server(model="identity", allowed_url_domains=["127.0.0.1"], **settings) as url,
    ):
        yield base, url, host


def _post_items(url: str, base: str) -> httpx.Response:
    data = {f"m{k}": f"{base}/item{k}.json" for k in range(8)}  # 8 Items x 64 files
    return httpx.post(f"{url}/v1/images", json={"data": data, "data_format": "url"}, timeout=300)


def test_a_stac_fan_out_stops_at_the_remote_budget(blob):
    """8 Items x 64 files (each within the Item limits): the old server made over 2,000
    requests to the host; now the request stops at its budget of 256, with a 413 naming it."""
    with item_server(blob) as (base, url, host):
        t0 = time.monotonic()
        resp = _post_items(url, base)
        asked = len(host.log)
        print(
            f"STAC fan-out: HTTP {resp.status_code}, {asked} requests to the host, "
            f"{time.monotonic() - t0:.1f} s"
        )
    assert resp.status_code == 413, resp.text[:300]
    message = resp.json()["message"]
    assert "more than 256 requests to remote hosts" in message
    assert "--max-remote-requests" in message
    assert asked <= 256, asked


def test_max_pixels_stops_a_stac_request_at_the_first_file_over(blob):
    """A limit of ten files' pixels: the request is refused at the eleventh file GDAL opens,
    not after all 512 (the old server opened every one first)."""
    with item_server(blob, max_pixels=10 * SIDE * SIDE) as (base, url, host):
        resp = _post_items(url, base)
        opened = host.gdal_files()
        print(f"max-pixels: HTTP {resp.status_code}, {len(opened)} files opened by GDAL")
    assert resp.status_code == 413, resp.text[:300]
    message = resp.json()["message"]
    assert f"hold {11 * SIDE * SIDE} pixels, over the limit of {10 * SIDE * SIDE}" in message
    assert "asset 'b10'" in message
    assert len(opened) == 11, sorted(opened)
