"""Request bodies and waiting answers count against --max-memory-mb, as admitted requests do."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import numpy as np

from tests.conftest import write_geotiff
from tests.server.conftest import running_server

MB = 1024 * 1024


def test_a_body_streaming_in_counts_against_the_memory_bound(tmp_path):
    """While one client streams a 48 MB body in, a 20 MB upload does not fit a 64 MB bound."""
    scene = write_geotiff(
        tmp_path / "plain.tif", np.ones((3, 1850, 1850), np.uint16), compress=None
    ).read_bytes()
    assert len(scene) > 19 * MB
    with running_server(
        model="test-seg", max_memory_mb=64, max_body_mb=100, max_queued_patches=50_000
    ) as url:
        alone = httpx.post(f"{url}/v1/images", files={"file": ("a.tif", scene)}, timeout=120)
        assert alone.status_code == 200, alone.text  # it fits by itself

        half_sent, go_on = threading.Event(), threading.Event()

        def slow_body() -> Iterator[bytes]:
            yield (
                b'--end\r\nContent-Disposition: form-data; name="file"; filename="s.tif"'
                b"\r\nContent-Type: application/octet-stream\r\n\r\n"
            )
            for _ in range(48):
                yield b"x" * MB
            half_sent.set()
            go_on.wait(60)
            yield b"\r\n--end--\r\n"

        first: dict[str, httpx.Response] = {}

        def send_slowly() -> None:
            first["resp"] = httpx.post(
                f"{url}/v1/images",
                content=slow_body(),
                headers={"content-type": "multipart/form-data; boundary=end"},
                timeout=120,
            )

        sender = threading.Thread(target=send_slowly)
        sender.start()
        try:
            assert half_sent.wait(60)
            busy = None
            for _ in range(50):  # until the server has read what was sent
                busy = httpx.post(f"{url}/v1/images", files={"file": ("b.tif", scene)}, timeout=120)
                if busy.status_code != 200:
                    break
            assert busy is not None
            assert busy.status_code == 503, busy.text
            assert "the request body" in busy.json()["message"]
            assert busy.headers["retry-after"]
        finally:
            go_on.set()
            sender.join(60)
        assert first["resp"].status_code == 400, first["resp"].text  # (not a GeoTIFF)
        after = httpx.post(f"{url}/v1/images", files={"file": ("c.tif", scene)}, timeout=120)
        assert after.status_code == 200, after.text  # the body's memory was given back


def test_a_json_body_alone_over_the_bound_is_413(tmp_path):
    with running_server(model="test-seg", max_memory_mb=16, max_body_mb=100) as url:
        big = b'{"data": "' + b"A" * (10 * MB) + b'"}'
        resp = httpx.post(
            f"{url}/v1/images", content=big, headers={"content-type": "application/json"}
        )
    assert resp.status_code == 413, resp.text
    assert "--max-memory-mb" in resp.json()["message"]


def test_an_upload_that_fits_alone_is_admitted_on_an_idle_server(tmp_path):
    """The body's hold is replaced by the request's own estimate (which counts the upload):
    a 32 MB upload estimated under the bound is not refused for its own body."""
    scene = write_geotiff(
        tmp_path / "plain.tif", np.ones((3, 2300, 2300), np.uint16), compress=None
    ).read_bytes()
    assert len(scene) > 30 * MB
    with running_server(
        model="test-seg", max_memory_mb=72, max_body_mb=100, max_queued_patches=50_000
    ) as url:
        for _ in range(2):  # and its memory is given back
            resp = httpx.post(f"{url}/v1/images", files={"file": ("a.tif", scene)}, timeout=120)
            assert resp.status_code == 200, resp.text
