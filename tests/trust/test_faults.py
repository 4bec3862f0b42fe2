"""Faults an operator meets: a read-only or full output disk, a poisoned batch, a dead loop.

No fault is ever reported as success, no partial file is left, and the engine keeps serving
every other request.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from geoserve import Engine
from geoserve.server import ServerSettings, create_app
from tests.cli_process import run_in_process
from tests.conftest import read, write_geotiff
from tests.server.conftest import free_port, running_server, serve_subprocess, wait_ready
from tests.trust.conftest import OutputDir, can_mount, small_disk, unmount


def scene(path: Path, size: int, value: float | None = None, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    data = (
        np.full((3, size, size), value, np.float32)
        if value is not None
        else rng.random((3, size, size), dtype=np.float32)
    )
    return write_geotiff(path, data)


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name != "lost+found")


# -- a read-only output directory ------------------------------------------------------------


@pytest.fixture
def out_dir(tmp_path: Path) -> Iterator[OutputDir]:
    with contextlib.closing(OutputDir(tmp_path / "out")) as d:
        yield d


def test_output_dir_turning_read_only_mid_run_fails_that_request_alone(
    tmp_path, out_dir, monkeypatch
):
    monkeypatch.setenv("GEOSERVE_TEST_SLOW", "0.05")
    scene(tmp_path / "big.tif", 16 * 24)  # 576 patches of 16 px: ~30 s of model time
    small = scene(tmp_path / "small.tif", 32, seed=1)
    with (
        running_server(
            model="test-slow", output_dir=out_dir.path, allowed_input_dirs=[tmp_path]
        ) as url,
        httpx.Client(base_url=url, timeout=120) as client,
    ):
        first = client.post(
            "/v1/images",
            json={"data": "small.tif", "data_format": "path", "out_data_format": "path"},
        )
        assert first.status_code == 200, first.text

        answer: dict[str, httpx.Response] = {}
        body = {"data": "big.tif", "data_format": "path", "out_data_format": "path"}
        worker = threading.Thread(
            target=lambda: answer.setdefault("r", client.post("/v1/images", json=body))
        )
        worker.start()
        deadline = time.monotonic() + 30
        while not any(p.name.endswith(".tmp") for p in out_dir.path.iterdir()):
            assert time.monotonic() < deadline, "the big request never started writing"
            time.sleep(0.05)
        out_dir.read_only()
        worker.join(timeout=120)
        resp = answer["r"]
        assert resp.status_code == 500, resp.text
        assert "not writable" in resp.json()["message"] or "Read-only" in resp.json()["message"]
        assert "Traceback" not in resp.text
        # the engine lives on: health says so and in-memory answers still work
        assert httpx.get(f"{url}/health/ready").status_code == 200
        assert httpx.get(f"{url}/health/live").status_code == 200
        ok = client.post("/v1/images", json={"data": "small.tif", "data_format": "path"})
        assert ok.status_code == 200, ok.text
        out_dir.writable()
        again = client.post(
            "/v1/images",
            json={"data": "small.tif", "data_format": "path", "out_data_format": "path"},
        )
        assert again.status_code == 200, again.text
        np.testing.assert_array_equal(read(again.json()["data"])[0], read(small)[0])
    names = leftovers(out_dir.path)
    assert not [n for n in names if not n.endswith(".tif")], names  # no temporaries left


# -- a full disk ------------------------------------------------------------------------------


@pytest.fixture
def full(tmp_path: Path) -> Iterator[tuple[Path, object]]:
    """A 256 KB output disk: a real tmpfs (as root), which the tests fill from this process,
    or else a file size limit that only a child process can be given (``preexec``)."""
    path, preexec = small_disk(tmp_path / "tiny", 256 * 1024)
    try:
        yield path, preexec
    finally:
        unmount(path)


def _no_output(directory: Path) -> None:
    assert leftovers(directory) == []


def test_full_disk_fails_the_cli_and_leaves_nothing(tmp_path, full):
    disk, preexec = full
    src = scene(tmp_path / "s.tif", 384)  # ~1.7 MB of float32 noise: does not fit
    args = ["predict", str(src), "-o", str(disk / "o.tif"), "-m", "identity"]
    args += ["--patch-size", "64", "--stride", "64", "--blend", "none"]
    if preexec is None:  # a full tmpfs: the CLI's main() here
        res = run_in_process(*args)
    else:
        res = subprocess.run(
            [sys.executable, "-m", "geoserve", *args],
            capture_output=True,
            text=True,
            timeout=300,
            preexec_fn=preexec,  # type: ignore[arg-type]
        )
    assert res.returncode == 1, res.stdout + res.stderr
    assert "no space left for the output" in res.stderr
    assert "wrote" not in res.stdout
    _no_output(disk)


def test_full_disk_fails_the_python_api_and_leaves_nothing(tmp_path, full):
    disk, preexec = full
    src = scene(tmp_path / "s.tif", 384)
    if preexec is None:  # a full tmpfs: the API here
        from geoserve.errors import OutputSpaceError

        eng = Engine("identity", patch_size=64, stride=64, blend="none")
        with eng, pytest.raises(OutputSpaceError, match="no space left for the output"):
            eng.generate_image(str(src), output_path=str(disk / "o.tif"))
        _no_output(disk)
        return
    code = (
        "from geoserve import Engine\n"
        "from geoserve.errors import OutputSpaceError\n"
        "eng = Engine('identity', patch_size=64, stride=64, blend='none')\n"
        "try:\n"
        f"    eng.generate_image({str(src)!r}, output_path={str(disk / 'o.tif')!r})\n"
        "except OutputSpaceError as exc:\n"
        "    print('REFUSED', exc)\n"
        "else:\n"
        "    print('REPORTED SUCCESS')\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=preexec,  # type: ignore[arg-type]
    )
    assert "REFUSED" in res.stdout, res.stdout + res.stderr
    assert "no space left for the output" in res.stdout
    _no_output(disk)


def test_full_disk_fails_the_server_request_and_the_server_keeps_serving(tmp_path, full):
    disk, preexec = full
    scene(tmp_path / "s.tif", 384)
    options = {"output_dir": disk, "allowed_input_dirs": [tmp_path], "model": "identity"}
    server = (  # a full tmpfs: a server in this process; else a child with the size limit
        running_server(**options)
        if preexec is None
        else serve_subprocess(
            "--output-dir", str(disk), "--allowed-input-dir", str(tmp_path), preexec_fn=preexec
        )
    )
    with server as started:
        url = started if isinstance(started, str) else started[0]
        body = {"data": "s.tif", "data_format": "path", "out_data_format": "path"}
        resp = httpx.post(f"{url}/v1/images", json=body, timeout=120)
        assert resp.status_code == 507, resp.text
        assert "no space left for the output" in resp.json()["message"]
        _no_output(disk)
        small = scene(tmp_path / "small.tif", 24, seed=2)
        ok = httpx.post(
            f"{url}/v1/images", json={"data": small.name, "data_format": "path"}, timeout=60
        )
        assert ok.status_code == 200, ok.text
        raw = base64.b64decode(ok.json()["data"])
        assert len(raw) > 0


# -- a poisoned batch -------------------------------------------------------------------------


def test_a_poisoned_patch_fails_only_its_own_request(tmp_path):
    fine = [scene(tmp_path / f"f{i}.tif", 16, value=float(i + 1)) for i in range(7)]
    poisoned = scene(tmp_path / "p.tif", 16, value=5e6)
    inputs = [str(p) for p in fine[:3]] + [str(poisoned)] + [str(p) for p in fine[3:]]
    with Engine("test-fragile", max_batch_patches=16) as engine:
        outs = engine.generate_image(inputs, out_format="tensor")
    assert [o.ok for o in outs] == [True, True, True, False, True, True, True, True]
    assert "poisoned patch" in str(outs[3].error)
    for i, o in enumerate(o for o in outs if o.ok):
        assert float(o.outputs.tensor[0, 0, 0]) == i + 1


def test_poisoned_requests_among_concurrent_ones_over_http(tmp_path):
    fine = [scene(tmp_path / f"f{i}.tif", 32, value=float(i + 1)) for i in range(12)]
    poisoned = scene(tmp_path / "p.tif", 32, value=5e6)
    order = fine[:6] + [poisoned] + fine[6:]
    with running_server(model="test-fragile", max_batch_patches=16, max_wait_ms=200) as url:

        async def all_at_once() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=url, timeout=60) as ac:
                return list(
                    await asyncio.gather(
                        *(
                            ac.post("/v1/images", files={"file": ("x.tif", p.read_bytes())})
                            for p in order
                        )
                    )
                )

        answers = asyncio.run(all_at_once())
    codes = [a.status_code for a in answers]
    assert codes == [200] * 6 + [500] + [200] * 6, codes
    assert "poisoned patch" in answers[6].json()["message"]


# -- the loop itself ----------------------------------------------------------------------------


class _BrokenLoop(Engine):
    """An engine whose loop bookkeeping breaks after start-up (a bug, not a request's fault)."""

    broken = False

    def has_unfinished(self) -> bool:
        if self.broken:
            raise SystemError("engine bookkeeping broke")
        return super().has_unfinished()


def test_a_crashed_engine_loop_makes_health_fail():
    engine = _BrokenLoop("test-seg")
    settings = ServerSettings(model="test-seg", port=free_port())
    import uvicorn

    app = create_app(settings, engine=engine)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=settings.port, log_level="error")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{settings.port}"
    try:
        wait_ready(url, 30)
        engine.broken = True
        # wake the loop: a request arrives, the loop's own bookkeeping raises
        # (that request itself may still be answered: the loop breaks when it looks for more)
        resp = httpx.post(f"{url}/v1/images", files={"file": ("x.tif", _tiny())}, timeout=30)
        assert resp.status_code in (200, 503), resp.text
        deadline = time.monotonic() + 10
        while httpx.get(f"{url}/health/live").status_code != 503:
            assert time.monotonic() < deadline, "a dead engine loop still reports live"
            time.sleep(0.05)
        assert httpx.get(f"{url}/health/ready").status_code == 503
        again = httpx.post(f"{url}/v1/images", files={"file": ("x.tif", _tiny())}, timeout=30)
        assert again.status_code == 503
        assert "engine loop stopped" in again.json()["message"]
    finally:
        server.should_exit = True
        thread.join(timeout=20)


def _tiny() -> bytes:
    from rasterio.io import MemoryFile

    with MemoryFile() as mem:
        with mem.open(driver="GTiff", width=20, height=20, count=3, dtype="uint16") as ds:
            ds.write(np.ones((3, 20, 20), np.uint16))
        return bytes(mem.read())


# -- the CLI stopped by a signal ------------------------------------------------------------------


def test_cli_sigterm_leaves_no_temporary_and_stale_ones_are_swept(tmp_path):
    src = write_geotiff(tmp_path / "s.tif", np.ones((3, 2048, 2048), np.uint16))
    out = tmp_path / "out" / "o.tif"
    out.parent.mkdir()
    host = hashlib.sha1(socket.gethostname().encode()).hexdigest()[:12]
    stale = out.parent / f".o.tif.{host}-999999999-deadbeef.tmp"  # of a process now gone
    stale.write_bytes(b"half a file")
    hour_ago = time.time() - 3600
    os.utime(stale, (hour_ago, hour_ago))
    fresh = out.parent / f".o.tif.{host}-999999998-deadbeef.tmp"  # too recent to be sure
    fresh.write_bytes(b"maybe another container's")
    args = ["predict", str(src), "-o", str(out), "-m", "identity", "--patch-size", "16"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "geoserve", *args, "--stride", "16", "--blend", "none"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not any(f"-{proc.pid}-" in p.name for p in out.parent.iterdir()):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run never started writing"
        time.sleep(0.05)
    assert not stale.exists()  # swept when the run began writing its own
    assert fresh.exists()
    fresh.unlink()
    proc.terminate()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert leftovers(out.parent) == []


def test_a_full_disk_at_the_class_names_sidecar_answers_507_and_leaves_nothing(tmp_path):
    if not can_mount():
        pytest.skip("needs a tmpfs of an exact size (root)")
    disk = tmp_path / "exact"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk)], check=True)
    try:
        scene(tmp_path / "s.tif", 64)
        body = {"data": "s.tif", "data_format": "path", "out_data_format": "path"}
        with running_server(
            model="test-seg", output_dir=disk, allowed_input_dirs=[tmp_path]
        ) as url:
            first = httpx.post(f"{url}/v1/images", json=body, timeout=60)
            assert first.status_code == 200, first.text
            names = leftovers(disk)
            assert names == [names[0], names[0] + ".aux.xml"]  # the map and its class names
            size = (disk / names[0]).stat().st_size
            for name in names:
                (disk / name).unlink()
            # room for the class map exactly: its temporary fits, its sidecar's does not
            pages = -(-size // 4096) * 4096
            subprocess.run(["mount", "-o", f"remount,size={pages}", str(disk)], check=True)
            resp = httpx.post(f"{url}/v1/images", json=body, timeout=60)
            left = leftovers(disk)
    finally:
        unmount(disk)
    assert resp.status_code == 507, resp.text
    assert "no space left for the output" in resp.json()["message"]
    assert left == []  # neither the map, nor its sidecar, nor a temporary of either
