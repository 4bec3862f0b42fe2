"""Real uvicorn servers on 127.0.0.1 (in a thread) and httpx clients for the server tests."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest
import uvicorn

from geoserve.server import ServerSettings, create_app
from tests.conftest import write_geotiff

API_KEY = "test-key-123"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(url: str, timeout: float, proc: subprocess.Popen[str] | None = None) -> None:
    """Poll ``/health/ready`` until it answers 200 (a server subprocess must stay alive)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{url}/health/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError("server did not become ready")
        time.sleep(0.05)


@contextmanager
def running_server(**overrides: object) -> Iterator[str]:
    """Start the app under uvicorn on a free loopback port; yield its base URL."""
    settings = ServerSettings(**{"model": "test-seg", "port": free_port(), **overrides})
    app = create_app(settings)
    config = uvicorn.Config(
        app, host="127.0.0.1", port=settings.port, log_level="warning", lifespan="on"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{settings.port}"
    wait_ready(url, 60)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=20)


@contextmanager
def serve_subprocess(
    *args: str, model: str = "identity", preexec_fn: Callable[[], None] | None = None
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``geoserve serve -m model *args`` in a subprocess on a free loopback port, once ready;
    yields its base URL and the process (its stderr piped), and stops it on leaving."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "geoserve", "serve", "-m", model, "--port", str(port), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=preexec_fn,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, 120, proc)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Allowed input directory with a few scenes of different sizes."""
    root = tmp_path_factory.mktemp("inputs")
    rng = np.random.default_rng(7)
    for name, (h, w) in {"a": (40, 52), "b": (17, 9), "c": (64, 30)}.items():
        write_geotiff(root / f"{name}.tif", rng.integers(0, 400, (3, h, w)).astype(np.uint16))
    return root


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("outputs")


@pytest.fixture(scope="module")
def server(data_dir: Path, out_dir: Path) -> Iterator[str]:
    """The main test server: test-seg, paths under data_dir, outputs to out_dir, an API key."""
    with running_server(
        allowed_input_dirs=[data_dir],
        output_dir=out_dir,
        api_key=API_KEY,
        allowed_url_domains=["127.0.0.1"],
        max_body_mb=2,
        max_pixels=3 * 300 * 300,
        max_batch_patches=8,
    ) as url:
        yield url


@pytest.fixture
def client(server: str) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=server, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60
    ) as c:
        yield c
