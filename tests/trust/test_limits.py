"""What a request may cost: memory, time, size; and client mistakes answered as such.

Each limit is checked on the header, before pixels are decoded, and named in the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import numpy as np
import pytest
from rasterio.io import MemoryFile

from geoserve import Engine, RequestSpec
from geoserve.errors import PayloadTooLargeError
from tests.cli_process import run_in_process
from tests.conftest import http_server, write_geotiff
from tests.server.conftest import running_server, serve_subprocess


def strip(width: int, bands: int = 13, height: int = 1) -> bytes:
    """A tiny upload whose padded rows are huge: ``height`` x ``width`` pixels."""
    with MemoryFile() as mem:
        with mem.open(
            driver="GTiff",
            width=width,
            height=height,
            count=bands,
            dtype="uint16",
            compress="deflate",
        ) as ds:
            ds.write(np.ones((bands, height, width), np.uint16))
        return bytes(mem.read())


def test_a_thin_strip_is_refused_for_what_it_would_cost_not_its_pixels():
    raw = strip(200_704)
    assert len(raw) < 200_000  # a small upload, a tiny pixel count...
    with running_server(model="identity") as url:
        resp = httpx.post(f"{url}/v1/images", files={"file": ("s.tif", raw)}, timeout=60)
    assert resp.status_code == 413, resp.text
    message = resp.json()["message"]
    assert "streaming it would hold about" in message
    assert "over the limit of 1024 MB" in message


def test_admitted_requests_share_one_memory_bound(tmp_path, monkeypatch):
    monkeypatch.setenv("GEOSERVE_TEST_SLOW", "0.2")
    # one row of 40 patches, 0.2 s each: the first is still running when the second comes
    path = write_geotiff(tmp_path / "s.tif", np.ones((1, 16, 640), np.float32))
    with Engine("test-slow") as eng:
        req = eng.prepare_request(RequestSpec(str(path), out_format="bytes"))
        need = req.memory_bytes
        req.close()
    limit_mb = 1.5 * need / 2**20  # one fits, two do not
    raw = path.read_bytes()
    with running_server(model="test-slow", max_batch_patches=1, max_memory_mb=limit_mb) as url:

        async def two() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=url, timeout=60) as ac:
                first = asyncio.create_task(ac.post("/v1/images", files={"file": ("a.tif", raw)}))
                await asyncio.sleep(0.5)
                second = await ac.post("/v1/images", files={"file": ("b.tif", raw)})
                return [await first, second]

        first, second = asyncio.run(two())
    assert first.status_code == 200, first.text
    assert second.status_code == 503, second.text
    assert "Retry-After" in second.headers
    assert "server busy" in second.json()["message"]


def test_the_python_api_and_cli_refuse_inputs_over_the_patch_limit(tmp_path):
    path = write_geotiff(tmp_path / "big.tif", np.ones((3, 64, 64), np.uint16))
    with (
        Engine("test-seg", max_patches=10) as eng,
        pytest.raises(PayloadTooLargeError, match=r"makes 36 patches, over the limit of 10"),
    ):
        eng.generate_image(str(path), out_format="tensor")
    out = tmp_path / "o.tif"
    args = ["predict", str(path), "-o", str(out), "-m", "identity", "--patch-size", "16"]
    res = run_in_process(*args, "--stride", "16", "--max-patches", "10")
    assert res.returncode == 1
    assert "makes 16 patches, over the limit of 10 (raise it with" in res.stderr
    assert not out.exists()


# -- remote inputs that never finish ------------------------------------------------------------


#: What a shutdown may take beyond --shutdown-timeout: uvicorn's last second, closing the
#: engine and the process (about 3.6 s alone, more with the test suite on both cores); plus,
#: for a remote read GDAL is in, GDAL_HTTP_LOW_SPEED_TIME.
SHUTDOWN_SLACK_S = {"download": 10, "range": 10 + 10}


@contextmanager
def trickle_server(
    bytes_per_s: float = 10.0, ranges: bool = False
) -> Iterator[tuple[str, dict[str, Any]]]:
    """A loopback HTTP server that sends bodies very slowly (the first 4 KB of a GeoTIFF
    header fast when ``ranges``, so the in-place read gets as far as GDAL)."""
    state: dict[str, Any] = {"open": 0, "closed": 0}
    head = strip(4096, bands=1, height=4096)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", str(len(head) if ranges else 100000))
            if ranges:
                self.send_header("Accept-Ranges", "bytes")
            self.end_headers()

        def do_GET(self) -> None:  # noqa: N802
            rng = self.headers.get("Range")
            if ranges and rng:
                start, _, stop = rng.removeprefix("bytes=").partition("-")
                a, b = int(start), min(int(stop or len(head) - 1), len(head) - 1)
                if a == 0 and b < 16384:  # the header: at once
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {a}-{b}/{len(head)}")
                    self.send_header("Content-Length", str(b - a + 1))
                    self.end_headers()
                    self.wfile.write(head[a : b + 1])
                    return
            state["open"] += 1
            self.send_response(206 if rng else 200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            try:
                for _ in range(100000):
                    self.wfile.write(b"I")
                    self.wfile.flush()
                    time.sleep(1 / bytes_per_s)
            except OSError:
                pass
            finally:
                state["closed"] += 1

        def log_message(self, *args: Any) -> None:
            pass

    with http_server(Handler) as base:
        yield base, state


def test_a_trickling_url_is_cut_off_at_the_request_deadline():
    with (
        trickle_server() as (base, state),
        running_server(
            model="test-seg", allowed_url_domains=["127.0.0.1"], request_timeout_s=2
        ) as url,
    ):
        t0 = time.monotonic()
        resp = httpx.post(
            f"{url}/v1/images", json={"data": f"{base}/s.tif", "data_format": "url"}, timeout=60
        )
        took = time.monotonic() - t0
        assert resp.status_code == 504, resp.text
        assert "did not finish within 2 s" in resp.json()["message"]
        assert took < 5
        deadline = time.monotonic() + 5
        while state["closed"] < state["open"]:
            assert time.monotonic() < deadline, "the download was left running"
            time.sleep(0.05)


def test_a_client_leaving_cancels_its_download():
    with (
        trickle_server() as (base, state),
        running_server(model="test-seg", allowed_url_domains=["127.0.0.1"]) as url,
    ):

        async def leave() -> None:
            async with httpx.AsyncClient(base_url=url, timeout=60) as ac:
                body = {"data": f"{base}/s.tif", "data_format": "url"}
                task = asyncio.create_task(ac.post("/v1/images", json=body))
                while not state["open"]:
                    await asyncio.sleep(0.05)
                task.cancel()

        asyncio.run(leave())
        deadline = time.monotonic() + 5
        while state["closed"] < state["open"]:
            assert time.monotonic() < deadline, "the download outlived its client"
            time.sleep(0.05)


# -- client mistakes are 4xx with a message -----------------------------------------------------


@pytest.fixture(scope="module")
def plain_server() -> Iterator[str]:
    with running_server(model="test-seg") as url:
        yield url


@pytest.mark.parametrize(
    ("kwargs", "status", "needle"),
    [
        ({"files": {"file": ("e.tif", b"")}}, 400, "'file' part 0 (upload 'e.tif') is empty"),
        ({"json": {"data": ""}}, 422, "data"),
        ({"json": {"data": []}}, 422, "data"),
        ({"json": {"data": ["ok", ""]}}, 422, "data"),
        ({"content": b"", "headers": {"content-type": "application/json"}}, 400, "body is empty"),
        (
            {
                "content": b"[" * 100_000 + b"]" * 100_000,
                "headers": {"content-type": "application/json"},
            },
            400,
            "nested too deeply",
        ),
        ({"content": b"{}", "headers": {"content-type": "text/plain"}}, 415, "application/json"),
        # a dict is modalities: this one's value is not base64
        ({"json": {"data": {"data": "x"}}}, 400, "modality 'data': input is not valid base64"),
    ],
)
def test_client_mistakes_are_4xx(plain_server, kwargs, status, needle):
    resp = httpx.post(f"{plain_server}/v1/images", timeout=30, **kwargs)
    assert resp.status_code == status, resp.text
    assert needle in resp.json()["message"]
    assert "Traceback" not in resp.text
    pooled = httpx.post(f"{plain_server}/pooling", json={"data": {"data": ""}}, timeout=30)
    assert pooled.status_code == 422


def test_infinite_input_values_are_nodata(tmp_path):
    data = np.full((3, 20, 20), 150.0, np.float32)
    data[0, 3, 4] = np.inf
    data[1, 10, 11] = -np.inf
    path = write_geotiff(tmp_path / "inf.tif", data)
    with Engine("test-seg") as eng:
        out = eng.generate_image(str(path), out_format="tensor").outputs.tensor.numpy()
    assert out[0, 3, 4] == 255
    assert out[0, 10, 11] == 255
    assert (out != 255).sum() == 400 - 2


@pytest.mark.parametrize("preprocess", ["host", "device"])
def test_nan_model_outputs_are_nodata_and_counted(tmp_path, preprocess):
    data = np.full((1, 20, 20), 5.0, np.float32)
    data[0, 2:4, 5:8] = 5e5  # the model returns NaN for these 6 pixels
    data[0, 10, 10] = -5.0
    path = write_geotiff(tmp_path / "s.tif", data)
    with Engine("test-nan", preprocess=preprocess) as eng:
        result = eng.generate_image(str(path), out_format="tensor")
    out = result.outputs.tensor.numpy()[0]
    assert (out[2:4, 5:8] == 255).all()
    assert out[10, 10] == 0
    assert (out == 1).sum() == 400 - 6 - 1
    assert result.nonfinite_pixels == 6


@pytest.mark.parametrize("reads", ["download", "range"])
def test_sigterm_with_a_trickling_input_in_flight_exits_within_the_drain(tmp_path, reads):
    with (
        trickle_server(ranges=reads == "range") as (base, state),
        serve_subprocess(
            "--allowed-url-domain",
            "127.0.0.1",
            "--url-reads",
            reads,
            "--shutdown-timeout",
            "2",
        ) as (url, proc),
    ):
        answers: list[httpx.Response] = []

        def post() -> None:
            with contextlib.suppress(httpx.HTTPError):
                body = {"data": f"{base}/s.tif", "data_format": "url"}
                answers.append(httpx.post(f"{url}/v1/images", json=body, timeout=60))

        client = threading.Thread(target=post, daemon=True)
        client.start()
        deadline = time.monotonic() + 30
        while not state["open"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        took = time.monotonic() - t0
        client.join(timeout=10)
    # the request still in flight when the drain ran out was told so, in JSON
    assert [a.status_code for a in answers] == [503]
    assert answers[0].json()["type"] == "ShuttingDownError"
    print(f"shutdown with a trickling {reads} input in flight took {took:.1f} s")
    assert took < 2 + SHUTDOWN_SLACK_S[reads], took


def test_a_stalled_remote_input_does_not_hold_up_other_requests(tmp_path):
    """One allowed host trickling bytes must not stall the engine loop for everyone."""
    fine = write_geotiff(tmp_path / "f.tif", np.ones((3, 24, 24), np.uint16)).read_bytes()
    with (
        trickle_server(ranges=True) as (base, state),
        running_server(
            model="identity", allowed_url_domains=["127.0.0.1"], request_timeout_s=8
        ) as url,
    ):

        async def scenario() -> tuple[httpx.Response, list[tuple[int, float]]]:
            async with httpx.AsyncClient(base_url=url, timeout=60) as ac:
                body = {"data": f"{base}/s.tif", "data_format": "url"}
                slow = asyncio.create_task(ac.post("/v1/images", json=body))
                deadline = time.monotonic() + 30
                while not state["open"]:  # then GDAL is stuck in a range read
                    assert time.monotonic() < deadline, "the slow input was never read"
                    await asyncio.sleep(0.05)
                others = []
                for _ in range(3):
                    t0 = time.monotonic()
                    r = await ac.post("/v1/images", files={"file": ("f.tif", fine)})
                    others.append((r.status_code, time.monotonic() - t0))
                return await slow, others

        slow, others = asyncio.run(scenario())
    assert [code for code, _ in others] == [200, 200, 200]
    assert max(took for _, took in others) < 3, others
    assert slow.status_code in (400, 504), slow.text  # cut off, never a success


def test_a_file_stored_as_one_huge_strip_is_costed_by_its_strip():
    """A tiny upload whose single compressed strip decodes to gigabytes is refused."""
    with MemoryFile() as mem:
        with mem.open(
            driver="GTiff",
            width=20000,
            height=8000,
            count=1,
            dtype="float64",
            compress="deflate",
            blockysize=8000,
        ) as ds:
            ds.write(np.zeros((1, 8000, 20000)))
        raw = bytes(mem.read())
    assert len(raw) < 3_000_000
    with running_server(model="identity") as url:
        resp = httpx.post(f"{url}/v1/images", files={"file": ("s.tif", raw)}, timeout=60)
    assert resp.status_code == 413, resp.text
    assert "streaming it would hold about" in resp.json()["message"]


def test_an_async_engine_survives_its_callers_event_loop_closing(tmp_path, monkeypatch):
    from geoserve.engine.async_engine import AsyncEngine
    from geoserve.errors import RequestTimeoutError

    monkeypatch.setenv("GEOSERVE_TEST_SLOW", "0.3")
    path = str(write_geotiff(tmp_path / "s.tif", np.ones((1, 64, 64), np.float32)))
    eng = AsyncEngine(Engine("test-slow", max_batch_patches=1))
    try:
        with pytest.raises(RequestTimeoutError):  # gives up, and its event loop closes
            asyncio.run(eng.submit(RequestSpec(path, "a", out_format="bytes"), timeout=0.2))
        small = str(write_geotiff(tmp_path / "t.tif", np.ones((1, 16, 16), np.float32)))
        out = asyncio.run(eng.submit(RequestSpec(small, "b", out_format="bytes"), timeout=30))
        assert out.ok
        assert eng.crashed is None
    finally:
        eng.close()
