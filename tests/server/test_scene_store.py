"""The scene store under pressure: eviction of idle scenes, what counts as use, and a store
that cannot be written (full, read-only), over a real uvicorn on 127.0.0.1."""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from torch import nn

from geoserve.registry import MODEL_REGISTRY
from tests.conftest import processors_of, write_geotiff
from tests.server.conftest import running_server, serve_subprocess
from tests.trust.conftest import OutputDir, small_disk, unmount

_serial = itertools.count()


def small_scene(path: Path, side: int = 64, seed: int = 0) -> bytes:
    """A georeferenced 3-band scene of ``side`` pixels a side (10 m, uncompressed)."""
    data = np.random.default_rng(seed).integers(0, 400, (3, side, side)).astype(np.uint16)
    return write_geotiff(path, data).read_bytes()


@pytest.fixture
def gated_model(
    register_model: Callable[..., str],
) -> Iterator[tuple[str, threading.Event, threading.Event]]:
    """test-seg whose forward passes wait while ``gate`` is clear; ``entered``: one waits."""
    factory = MODEL_REGISTRY.get("test-seg").factory
    entered, gate = threading.Event(), threading.Event()
    gate.set()

    class Gated(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = factory()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            entered.set()
            gate.wait(120)
            return self.inner(x)  # type: ignore[no-any-return]

    Gated.__qualname__ = f"Gated{next(_serial)}"  # (processors are keyed by qualified name)
    name = register_model(f"test-seg-gated{next(_serial)}", Gated, *processors_of("test-seg"))
    try:
        yield name, entered, gate
    finally:
        gate.set()


def test_a_full_store_evicts_its_least_recently_used_idle_scene(tmp_path, gated_model):
    name, entered, gate = gated_model
    small = [small_scene(tmp_path / f"s{i}.tif", seed=i) for i in range(4)]
    big = small_scene(tmp_path / "big.tif", side=128, seed=9)
    # room for one small scene beside the big one, not two
    mb = (len(big) + len(small[0]) // 2) / 2**20
    out = tmp_path / "out"
    with (
        running_server(
            model=name, output_dir=out, max_scenes=2, max_scenes_mb=mb, warmup=False
        ) as url,
        httpx.Client(base_url=url, timeout=60) as client,
    ):
        upload = lambda data: client.post("/v1/scenes", content=data)  # noqa: E731
        status = lambda sid: client.get(f"/v1/scenes/{sid}").status_code  # noqa: E731
        a, b = (upload(d).json()["id"] for d in small[:2])
        for _ in range(3):  # looking at a scene is no use of it
            assert status(a) == 200
        third = upload(small[2])
        assert third.status_code == 201, third.text
        c = third.json()["id"]
        assert [status(a), status(b), status(c)] == [404, 200, 200]  # a: the least recent

        gate.clear()  # b's prediction starts and waits: b is in use
        answer: dict[str, httpx.Response] = {}
        worker = threading.Thread(
            target=lambda: answer.setdefault("r", client.post(f"/v1/scenes/{b}/predict"))
        )
        worker.start()
        try:
            assert entered.wait(60), "the prediction never reached the model"
            fourth = upload(small[3])
            assert fourth.status_code == 201, fourth.text  # b is older, but in use: c goes
            d = fourth.json()["id"]
            assert [status(b), status(c), status(d)] == [200, 404, 200]
            refused = upload(big)  # only b's eviction would make room for it
            assert refused.status_code == 503, refused.text
            assert "in use" in refused.json()["message"]
            assert status(d) == 200  # a refused upload evicts nothing
        finally:
            gate.set()
            worker.join(timeout=120)
        assert answer["r"].status_code == 200, answer["r"].text
        assert client.get(f"/v1/scenes/{b}").json()["predicted"] is True
    stored = sorted(p.name for p in (out / "scenes").iterdir())
    assert stored == sorted(
        [f"{b}.tif", f"{b}_classes.tif", f"{b}_classes.tif.aux.xml", f"{d}.tif"]
    )


@pytest.fixture
def store_dir(tmp_path: Path) -> Iterator[OutputDir]:
    with contextlib.closing(OutputDir(tmp_path / "out" / "scenes")) as d:
        yield d


def test_a_read_only_scene_store_answers_507_and_keeps_nothing(tmp_path, store_dir):
    scene = small_scene(tmp_path / "s.tif")
    with running_server(model="test-seg", output_dir=tmp_path / "out") as url:
        first = httpx.post(f"{url}/v1/scenes", content=scene)
        assert first.status_code == 201, first.text
        store_dir.read_only()
        refused = httpx.post(f"{url}/v1/scenes", content=scene)
        store_dir.writable()
        again = httpx.post(f"{url}/v1/scenes", content=scene)
    assert refused.status_code == 507, refused.text
    assert f"the scene store {store_dir.path} is not writable" in refused.json()["message"]
    assert "Traceback" not in refused.text
    assert again.status_code == 201, again.text
    stored = sorted(p.name for p in store_dir.path.iterdir() if p.name != "lost+found")
    assert stored == sorted(f"{r.json()['id']}.tif" for r in (first, again))


def test_a_full_scene_store_answers_507_and_keeps_nothing(tmp_path):
    out = tmp_path / "out"
    disk, preexec = small_disk(out / "scenes", 64 * 1024)
    try:
        big = small_scene(tmp_path / "big.tif", side=128)  # ~100 KB: does not fit
        small = small_scene(tmp_path / "small.tif")  # ~25 KB: fits
        server = (  # a full tmpfs: a server in this process; else a child with the size limit
            running_server(model="identity", output_dir=out)
            if preexec is None
            else serve_subprocess("--output-dir", str(out), preexec_fn=preexec)
        )
        with server as started:
            url = started if isinstance(started, str) else started[0]
            refused = httpx.post(f"{url}/v1/scenes", content=big, timeout=60)
            left = sorted(p.name for p in disk.iterdir() if p.name != "lost+found")
            ok = httpx.post(f"{url}/v1/scenes", content=small, timeout=60)
    finally:
        unmount(disk)
    assert refused.status_code == 507, refused.text
    assert "has no space left for the upload" in refused.json()["message"]
    assert "Traceback" not in refused.text
    assert left == []  # nothing half-written
    assert ok.status_code == 201, ok.text  # the server keeps serving


def test_an_upload_the_model_cannot_read_is_refused_naming_the_file_and_bands(tmp_path):
    """What every prediction tile would answer, the upload answers at once (and keeps nothing)."""
    from tests.conftest import HLS, LAKE, RGB

    out = tmp_path / "out"
    # one patch a request at most: the lake (many patches) cannot run whole, but tiles cut it
    with running_server(model="demo-water", output_dir=out, max_patches=1, warmup=False) as url:
        post = lambda path: httpx.post(  # noqa: E731
            f"{url}/v1/scenes", files={"file": (path.name, path.read_bytes())}, timeout=60
        )
        rgb, hls, lake = post(RGB), post(HLS), post(LAKE)
    for answer, name, count, band in ((rgb, RGB.name, 3, 3), (hls, HLS.name, 10, 11)):
        assert answer.status_code == 400, answer.text
        message = answer.json()["message"]
        assert message.startswith(f"upload '{name}' has {count} bands; band index {band} "), message
        assert "model 'demo-water' takes a 13-band Sentinel-2 L1C stack" in message
        assert "; it reads bands 1, 2, 3, 8, 11, 12" in message
    assert lake.status_code == 201, lake.text
    assert sorted(p.name for p in (out / "scenes").iterdir()) == [f"{lake.json()['id']}.tif"]
