"""Overload, deadlines, disconnects, model failures and SIGTERM, on real servers."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

from tests.conftest import write_geotiff
from tests.server.conftest import free_port, running_server

ROOT = Path(__file__).resolve().parents[2]


def scene(tmp_path: Path, name: str, size: int, value: float = 1.0) -> bytes:
    data = np.full((1, size, size), value, dtype=np.float32)
    return write_geotiff(tmp_path / name, data).read_bytes()


def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    match = re.search(rf"^{name} (\S+)$", text, flags=re.M)
    assert match, name
    return float(match.group(1))


def test_queue_full_is_503_with_retry_after_before_decoding(tmp_path, monkeypatch):
    monkeypatch.setenv("GEOSERVE_TEST_SLOW", "0.2")
    with running_server(model="test-slow", max_queued_patches=10, max_batch_patches=1) as url:
        too_big = scene(tmp_path, "big.tif", 64)  # 16 patches > 10 on its own
        resp = httpx.post(f"{url}/v1/images", files={"file": ("b.tif", too_big)})
        assert resp.status_code == 503
        assert resp.headers["retry-after"] == "1"
        assert "queue full" in resp.json()["message"]

        eight = scene(tmp_path, "eight.tif", 32)  # 4 patches each

        async def burst() -> list[int]:
            async with httpx.AsyncClient(base_url=url, timeout=30) as ac:
                resps = await asyncio.gather(
                    *(ac.post("/v1/images", files={"file": ("e.tif", eight)}) for _ in range(5))
                )
                return [r.status_code for r in resps]

        codes = asyncio.run(burst())
        assert codes.count(200) >= 2, codes
        assert codes.count(503) >= 1, codes
        assert metric(url, "geoserve_queue_depth_patches") == 0


def test_request_timeout_is_504_and_drops_the_work(tmp_path, monkeypatch):
    monkeypatch.setenv("GEOSERVE_TEST_SLOW", "0.3")
    with running_server(model="test-slow", request_timeout_s=0.5, max_batch_patches=1) as url:
        resp = httpx.post(
            f"{url}/v1/images", files={"file": ("s.tif", scene(tmp_path, "s.tif", 64))}, timeout=30
        )
        assert resp.status_code == 504
        assert "did not finish within 0.5 s" in resp.json()["message"]
        time.sleep(0.7)
        assert metric(url, "geoserve_queue_depth_patches") == 0
        assert metric(url, "geoserve_patches_total") < 16


def test_client_disconnect_cancels_queued_patches(tmp_path, monkeypatch):
    monkeypatch.setenv("GEOSERVE_TEST_SLOW", "0.1")
    with running_server(model="test-slow", max_batch_patches=1) as url:
        raw = scene(tmp_path, "s.tif", 128)  # 64 patches, ~6.4 s of model time

        async def leave_early() -> None:
            async with httpx.AsyncClient(base_url=url, timeout=30) as ac:
                task = asyncio.create_task(ac.post("/v1/images", files={"file": ("s.tif", raw)}))
                for _ in range(100):
                    await asyncio.sleep(0.05)
                    if metric(url, "geoserve_patches_total") >= 2:
                        break
                task.cancel()

        asyncio.run(leave_early())
        deadline = time.monotonic() + 5
        while metric(url, "geoserve_queue_depth_patches") > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert metric(url, "geoserve_queue_depth_patches") == 0
        done = metric(url, "geoserve_patches_total")
        time.sleep(0.5)
        assert metric(url, "geoserve_patches_total") == done < 20  # nothing more ran


def test_model_failure_fails_that_request_and_server_keeps_serving(tmp_path):
    with running_server(model="test-fragile", max_batch_patches=1) as url:
        poisoned = scene(tmp_path, "p.tif", 16, value=5e6)
        fine = scene(tmp_path, "f.tif", 16, value=3.0)
        bad = httpx.post(f"{url}/v1/images", files={"file": ("p.tif", poisoned)})
        assert bad.status_code == 500
        assert bad.json()["type"] == "ModelExecutionError"
        assert "poisoned patch" in bad.json()["message"]
        assert "Traceback" not in bad.text
        good = httpx.post(f"{url}/v1/images", files={"file": ("f.tif", fine)})
        assert good.status_code == 200


def test_ready_is_503_while_loading(register_model):
    import threading

    import torch
    import uvicorn

    from geoserve import GeoTiffPatcher, RawReassembler
    from geoserve.server import ServerSettings, create_app

    class SlowToLoad(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            time.sleep(1.0)  # weights on a slow disk

        def forward(self, x):
            return x

    model = register_model(
        "test-slow-to-load", SlowToLoad, GeoTiffPatcher(patch_size=16), RawReassembler()
    )
    settings = ServerSettings(model=model, port=free_port())
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(settings), host="127.0.0.1", port=settings.port, log_level="warning"
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{settings.port}"
    try:
        for _ in range(100):
            try:
                first = httpx.get(f"{url}/health/ready")
                break
            except httpx.HTTPError:
                time.sleep(0.02)
        assert first.status_code == 503
        assert first.json() == {"status": "loading"}
        assert httpx.post(f"{url}/v1/images", json={"data": "x"}).status_code == 503
        for _ in range(100):
            if httpx.get(f"{url}/health/ready").status_code == 200:
                break
            time.sleep(0.05)
        assert httpx.get(f"{url}/health/ready").status_code == 200
    finally:
        server.should_exit = True
        thread.join(10)


def test_sigterm_drains_in_flight_and_refuses_new(tmp_path):
    port = free_port()
    code = (
        "import sys, tests.stub_models; from geoserve.cli import main; "
        f"sys.exit(main(['serve', '--model', 'test-slow', '--port', '{port}', "
        "'--batch-size', '2', '--shutdown-timeout', '20']))"
    )
    env = {**os.environ, "GEOSERVE_TEST_SLOW": "0.15"}
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(f"{url}/health/ready").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raw = scene(tmp_path, "s.tif", 48)  # 9 patches: ~0.75 s each request at batch 2

        async def scenario() -> tuple[list[int], int, int]:
            async with httpx.AsyncClient(base_url=url, timeout=60) as ac:
                inflight = [
                    asyncio.create_task(ac.post("/v1/images", files={"file": ("s", raw)}))
                    for _ in range(4)
                ]
                await asyncio.sleep(0.5)
                proc.send_signal(signal.SIGTERM)
                await asyncio.sleep(0.3)
                late = await ac.post("/v1/images", files={"file": ("s", raw)})
                ready = await ac.get("/health/ready")
                done = await asyncio.gather(*inflight)
                return [r.status_code for r in done], late.status_code, ready.status_code

        codes, late, ready = asyncio.run(scenario())
        assert codes == [200, 200, 200, 200]
        assert late == 503
        assert ready == 503
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        output = proc.communicate()[0]
    assert "draining" in output


def test_timed_out_path_output_leaves_no_file(tmp_path, monkeypatch):
    """A request that times out mid-scene has its temporary output removed with its work."""
    monkeypatch.setenv("GEOSERVE_TEST_SLOW", "0.02")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    raw = base64.b64encode(scene(tmp_path, "s.tif", 320)).decode()  # 400 patches, ~8 s
    with running_server(
        model="test-slow", request_timeout_s=1.5, max_batch_patches=4, output_dir=out_dir
    ) as url:
        body = {"data": raw, "data_format": "b64_json", "out_data_format": "path"}
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pending = pool.submit(httpx.post, f"{url}/v1/images", json=body, timeout=30)
            seen = False
            while not pending.done():
                seen = seen or any(out_dir.iterdir())  # rows are being written
                time.sleep(0.01)
            resp = pending.result()
        assert seen
        assert resp.status_code == 504
        deadline = time.monotonic() + 10
        while any(out_dir.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list(out_dir.iterdir()) == []
