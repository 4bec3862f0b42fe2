"""JobRunner: jobs survive a server that stops mid-job (a real ``geoserve serve`` process)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np

from geoserve.jobs import open_job_store
from tests.conftest import write_geotiff
from tests.server.conftest import free_port, wait_ready

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def serve(out: Path, inputs: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``geoserve serve`` of the slow test model in a subprocess, jobs under ``out``."""
    port = free_port()
    code = (
        "import sys, tests.stub_models; from geoserve.cli import main; "
        f"sys.exit(main(['serve', '--model', 'test-slow', '--port', '{port}', "
        f"'--batch-size', '1', '--output-dir', {str(out)!r}, "
        f"'--allowed-input-dir', {str(inputs)!r}, '--job-lease-s', '3']))"
    )
    env = {**os.environ, "GEOSERVE_TEST_SLOW": "0.1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, 120, proc)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_job_killed_mid_run_completes_once_after_restart(tmp_path: Path) -> None:
    inputs, out = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    rng = np.random.default_rng(5)
    write_geotiff(inputs / "s.tif", rng.integers(0, 400, (3, 64, 64)).astype(np.uint16))
    with serve(out, inputs) as (url, proc):
        answer = httpx.post(
            f"{url}/v1/jobs", json={"data": str(inputs / "s.tif"), "data_format": "path"}
        )
        assert answer.status_code == 201, answer.text
        location = answer.headers["location"].replace(url, "")
        job_id = answer.json()["jobID"]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            info = httpx.get(url + location).json()
            if info["status"] == "running" and info["progress"] > 0:
                break
            time.sleep(0.05)
        assert info["status"] == "running", info
        assert info["progress"] < 100, info
        proc.send_signal(signal.SIGKILL)  # a crash: nothing is cleaned up
        proc.wait()
    with serve(out, inputs) as (url, _):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            info = httpx.get(url + location).json()
            if info["status"] in ("successful", "failed", "dismissed"):
                break
            time.sleep(0.1)
        assert info["status"] == "successful", info
        results = httpx.get(f"{url}{location}/results").json()
        assert httpx.get(results["raw"]["href"]).status_code == 200
    with open_job_store(out / "jobs.sqlite3") as store:
        job = store.get(job_id)
        assert job.attempts == 2
        assert job.status == "successful"
        assert store.count() == 1
    assert sorted(p.name for p in (out / "jobs" / job_id).iterdir()) == ["item.json", "out.tif"]
