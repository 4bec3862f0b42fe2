"""Shared fixtures: tiny GeoTIFF factories, the real sample files, and test-only models."""

from __future__ import annotations

import http.server
import io
import itertools
import os
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rasterio
import torch
from affine import Affine
from rasterio.crs import CRS
from torch import nn

import tests.stub_models  # noqa: F401  (registers the test-only models)
from geoserve import INPUT_REGISTRY, MODEL_REGISTRY, OUTPUT_REGISTRY
from geoserve.processors import InputProcessor, OutputProcessor

if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest-xdist's workers set COLUMNS=80 and LINES=24: the commands the tests run would then
    # lay out their tables for 80 columns, where a serial run's get the default width
    for _name in ("COLUMNS", "LINES"):
        os.environ.pop(_name, None)

#: Tests that share one local Ray cluster (``ray_cluster``): on several workers they
#: run on one, one after another, so that one cluster is started, not one per worker. (The
#: docs' ``--ray`` commands start a cluster of their own for a few seconds and stay with their
#: module.)
RAY_TESTS = ("tests/distributed/",)

#: Test modules that take longest, started first on several workers so that none of them is
#: left running alone at the end.
LONG_MODULES = (
    "tests/engine/test_streaming.py",
    "tests/trust/test_tile_memory.py",
    "tests/trust/test_limits.py",
    "tests/test_plugins.py",
    "tests/test_docs_shell.py",
    "tests/engine/test_streaming_multimodal.py",
    "tests/test_cli_output_kinds.py",
    "tests/engine/test_streaming_kinds.py",
    "tests/trust/test_faults.py",
    "tests/test_cli.py",
)


def scope_of(nodeid: str) -> str:
    """Which tests run together on one worker: ``"ray"`` for :data:`RAY_TESTS`, else the
    module (so a module's fixtures are built once)."""
    if nodeid.startswith(RAY_TESTS):
        return "ray"
    return nodeid.split("::")[0]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pytest-xdist (``-n``), tests are sent to the workers by :func:`scope_of`.

    (pytest-xdist's own ``--dist loadgroup`` marks do not group on pytest 9.2: see
    pytest-dev/pytest-xdist#1386; this scheduler does not depend on them.)
    """
    from xdist.scheduler import LoadScopeScheduling

    class ByScope(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return ByScope(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On several workers, the Ray tests and the longest modules go first (each worker
    collects the same order); without ``-n`` the order is pytest's own."""

    def rank(item: pytest.Item) -> int:
        if scope_of(item.nodeid) == "ray":
            return 0
        path = item.nodeid.split("::")[0]
        hits = [i for i, prefix in enumerate(LONG_MODULES) if path.startswith(prefix)]
        return 1 + (hits[0] if hits else len(LONG_MODULES))

    if getattr(config.option, "numprocesses", None) or os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=rank)  # (stable: pytest's order within each rank)


#: Only the Sen1Floods11 files (not redistributable) come from outside the repository.
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
LAKE = Path(__file__).resolve().parents[1] / "data" / "S2_L1C_T33UUU_20170216T102101_13band_10m.tif"
FLOOD = SHARED_DATA / "Spain_7370579_S2Hand.tif"
FLOOD_LABEL = SHARED_DATA / "Spain_7370579_LabelHand.tif"
HLS = Path(__file__).with_name("data") / "terratorch_hls_10band_224.tif"
RGB = Path(__file__).with_name("data") / "RGB.byte.tif"

UTM_TRANSFORM = Affine(10.0, 0.0, 399960.5, 0.0, -10.0, 5800020.25)  # non-integer origin


def write_geotiff(
    path: Path,
    data: np.ndarray,
    *,
    crs: Any = "EPSG:32633",
    transform: Affine | None = UTM_TRANSFORM,
    nodata: float | None = None,
    descriptions: Sequence[str] | None = None,
    tags: dict[str, str] | None = None,
    **profile: Any,
) -> Path:
    """Write (bands, H, W) ``data`` as a GeoTIFF and return its path."""
    count, height, width = data.shape
    kwargs: dict[str, Any] = {
        "driver": "GTiff",
        "width": width,
        "height": height,
        "count": count,
        "dtype": data.dtype.name,
        "nodata": nodata,
        **profile,
    }
    if crs is not None:
        kwargs["crs"] = CRS.from_user_input(crs)
    if transform is not None:
        kwargs["transform"] = transform
    with rasterio.open(path, "w", **kwargs) as dst:
        dst.write(data)
        for i, d in enumerate(descriptions or (), start=1):
            dst.set_band_description(i, d)
        if tags:
            dst.update_tags(**tags)
    return path


@pytest.fixture
def make_geotiff(tmp_path: Path) -> Callable[..., Path]:
    """Factory: ``make_geotiff(bands=3, height=40, width=50, dtype="uint16", ...)``.

    Values are unique per pixel and band (an arange), so any misplaced pixel shows.
    """
    counter = iter(range(10_000))

    def make(
        bands: int = 3,
        height: int = 40,
        width: int = 50,
        dtype: str = "uint16",
        data: np.ndarray | None = None,
        name: str | None = None,
        **kwargs: Any,
    ) -> Path:
        if data is None:
            n = bands * height * width
            data = (np.arange(n) % 60000 + 1).reshape(bands, height, width).astype(dtype)
        path = tmp_path / (name or f"img{next(counter)}.tif")
        return write_geotiff(path, data, **kwargs)

    return make


def read(path: Path | str) -> tuple[np.ndarray, dict[str, Any]]:
    """Read all bands and the profile of a GeoTIFF."""
    with rasterio.open(path) as src:
        return src.read(), dict(src.profile)


def needs_shared(path: Path) -> Any:
    """Mark for tests that need a file from outside the repository (Sen1Floods11)."""
    return pytest.mark.skipif(not path.exists(), reason=f"{path} not present")


@contextmanager
def serve_ranges(directory: Path) -> Iterator[tuple[str, list[tuple[str, str, str | None]]]]:
    """A real HTTP server on 127.0.0.1 serving ``directory`` with range requests.

    Yields its base URL and a log of (method, path, Range header) for every file request.
    """
    log: list[tuple[str, str, str | None]] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(directory), **kwargs)

        def send_head(self) -> Any:
            path = self.translate_path(self.path)
            if not os.path.isfile(path):
                self.send_error(404)
                return None
            size = os.path.getsize(path)
            rng = self.headers.get("Range")
            log.append((self.command, self.path, rng))
            match = re.match(r"bytes=(\d+)-(\d*)", rng or "")
            if match is None:
                self.send_response(200)
                self.send_header("Content-Length", str(size))
                self.send_header("Accept-Ranges", "bytes")
                self.end_headers()
                return open(path, "rb")  # noqa: SIM115 - the handler closes it
            start = int(match.group(1))
            stop = min(int(match.group(2) or size - 1), size - 1)
            with open(path, "rb") as f:
                f.seek(start)
                body = f.read(stop - start + 1)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{stop}/{size}")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            return io.BytesIO(body)

        def log_message(self, *args: Any) -> None:
            pass

    with http_server(Handler) as base:
        yield base, log


@contextmanager
def http_server(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """A real HTTP server on 127.0.0.1 answering with ``handler`` (one thread per request, none
    of them keeping the test process alive); yields its base URL."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


BUNDLED_SCENE = "data/S2_L1C_T33UUU_20170216T102101_13band_10m.tif"  # relative to the repo


def write_bundled_corner(root: Path, size: int = 256, name: str = BUNDLED_SCENE) -> Path:
    """A ``size`` x ``size`` corner of the bundled scene at ``root / name`` (bands, names kept).

    Lets tests run the docs' commands, which name the bundled scene, in a few seconds.
    """
    repo = Path(__file__).resolve().parents[1]
    dest = root / name
    dest.parent.mkdir(parents=True, exist_ok=True)
    with rasterio.open(repo / BUNDLED_SCENE) as src:
        profile = {**src.profile, "width": size, "height": size}  # same origin, same transform
        with rasterio.open(dest, "w", **profile) as dst:
            dst.write(src.read(window=((0, size), (0, size))))
            dst.descriptions = src.descriptions
    return dest


# -- test models, registered like plugin models --------------------------------------------------


def processors_of(model: str) -> tuple[InputProcessor, OutputProcessor]:
    """A registered model's input and output processors, as the public registries hold them."""
    key = MODEL_REGISTRY.get(model).key
    return INPUT_REGISTRY.get(key), OUTPUT_REGISTRY.get(key)


@pytest.fixture
def register_model() -> Iterator[Callable[..., str]]:
    """Factory: ``register_model(name, factory, input_processor, output_processor, **spec)``
    registers a model for this test alone (unregistered at teardown) and returns its name
    (``spec``: more fields of its registration, e.g. ``token_size``).

    Either processor may be ``None``: a model registered without it.
    """
    names: list[str] = []

    def register(
        name: str,
        factory: Callable[[], nn.Module],
        input_processor: InputProcessor | None = None,
        output_processor: OutputProcessor | None = None,
        **spec: Any,
    ) -> str:
        MODEL_REGISTRY.register_model(name, **spec)(factory)
        names.append(name)
        if input_processor is not None:
            INPUT_REGISTRY.register_input_processor(input_processor)(factory)
        if output_processor is not None:
            OUTPUT_REGISTRY.register_output_processor(output_processor)(factory)
        return name

    yield register
    for name in names:
        spec = MODEL_REGISTRY.remove(name)
        for reg in (INPUT_REGISTRY, OUTPUT_REGISTRY):
            if spec.key in reg:
                reg.remove(spec.key)


@pytest.fixture
def spy_model(
    register_model: Callable[..., str],
) -> Callable[[str], tuple[str, list[torch.Tensor]]]:
    """Factory: ``name, seen = spy_model("test-seg")`` registers ``name``: the same model with the
    same processors, whose every forward pass appends (a copy of) its input batch to ``seen``.

    An engine's warm-up pass is one of them: clear ``seen`` after building the engine.
    """
    serial = itertools.count()

    def spy(model: str) -> tuple[str, list[torch.Tensor]]:
        factory = MODEL_REGISTRY.get(model).factory
        seen: list[torch.Tensor] = []

        class Spy(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.inner = factory()

            def forward(self, x: torch.Tensor, **kwargs: torch.Tensor) -> torch.Tensor:
                seen.append(x.detach().cpu().clone())
                return self.inner(x, **kwargs)

        n = next(serial)
        Spy.__qualname__ = f"Spy{n}"  # (the registries key processors by qualified name)
        return register_model(f"{model}-spy{n}", Spy, *processors_of(model)), seen

    return spy
