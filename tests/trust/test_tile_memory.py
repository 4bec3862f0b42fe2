"""A map tile reads only what the model uses, under the server's memory bound.

The attack: a tiny sparse GeoTIFF (3000 x 3000, 120 float64 bands, about 100 KB on disk)
whose tile cut-out, read whole, is gigabytes. A tile now reads the bands the model uses, a
band of rows at a time, as any request does.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import rasterio
from rasterio.warp import transform as warp_transform
from rasterio.windows import Window

from geoserve.tiles.mercator import min_zoom
from tests.conftest import UTM_TRANSFORM
from tests.server.conftest import serve_subprocess

MB = 1024 * 1024


def sparse_scene(path: Path, interleave: str, bands: int = 120, side: int = 3000) -> Path:
    profile = {
        "driver": "GTiff",
        "width": side,
        "height": side,
        "count": bands,
        "dtype": "float64",
        "crs": "EPSG:32633",
        "transform": UTM_TRANSFORM,
        "tiled": True,
        "blockxsize": 256,
        "blockysize": 256,
        "sparse_ok": True,
        "compress": "deflate",
        "interleave": interleave,
    }
    with rasterio.open(path, "w", **profile) as dst:  # one block of values; the rest sparse
        dst.write(np.full((bands, 256, 256), 500.0), window=Window(0, 0, 256, 256))
    return path


def peak_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, int]]:
    """One ``geoserve serve`` process for the module (its own peak memory is measured):
    the folder it may read, its URL and its pid."""
    root = tmp_path_factory.mktemp("tile-memory")
    args = ["--allowed-input-dir", str(root), "--max-memory-mb", "256"]
    with serve_subprocess(*args, model="demo-water") as (url, proc):
        yield root, url, proc.pid


@pytest.mark.parametrize("interleave", ["band", "pixel"])
def test_a_tile_of_a_sparse_many_band_scene_stays_within_the_memory_bound(server, interleave):
    """Band-interleaved: read within the bound (200). Pixel-interleaved, GDAL would decode all
    120 bands of every block the tile touches: refused with 413 before reading."""
    root, url, pid = server
    scene = sparse_scene(root / f"sparse-{interleave}.tif", interleave)
    # what the model reads: 13 bands (two files of this test's own, so the second is in no
    # patch cache)
    plain = [sparse_scene(root / f"plain-{interleave}{i}.tif", "band", bands=13) for i in (1, 2)]
    assert scene.stat().st_size < 2 * MB  # what the attacker sends
    with rasterio.open(scene) as src:
        z = min_zoom(src.crs, src.transform, src.width, src.height)
        cx, cy = src.transform @ (src.width / 2, src.height / 2)
        lon, lat = (v[0] for v in warp_transform(src.crs, "EPSG:4326", [cx], [cy]))
    n = 1 << z
    x = int((lon + 180) / 360 * n)
    y = int((1 - math.asinh(math.tan(math.radians(lat))) / math.pi) / 2 * n)

    def tile_growth(source: Path) -> tuple[httpx.Response, float]:
        """The tile of ``source``, and how far it lifted the server's peak memory."""
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak from now on
        before = peak_mb(pid)
        resp = httpx.get(
            f"{url}/v1/tiles/{z}/{x}/{y}.png", params={"source": str(source)}, timeout=300
        )
        return resp, peak_mb(pid) - before

    # the same tile of a 13-band scene (after a first one): the model's own memory
    assert tile_growth(plain[0])[0].status_code == 200
    ok, model_mb = tile_growth(plain[1])
    assert ok.status_code == 200, ok.text
    resp, grown = tile_growth(scene)
    if interleave == "band":
        assert resp.status_code == 200, resp.text
    else:
        assert resp.status_code == 413, resp.text
        assert "over the limit of 256 MB" in resp.json()["message"]
    # read whole, the cut-out (about 1,500^2 pixels x 120 bands x 8 bytes) is over 2 GB
    assert grown < model_mb + 64, f"120 bands: +{grown:.0f} MB, 13 bands: +{model_mb:.0f} MB"


def test_clear_refs_resets_the_peak():
    """The measurement above relies on Linux resetting VmHWM (writing 5 to clear_refs)."""
    pid = os.getpid()
    block = np.ones(64 * MB, np.uint8)  # lift the peak
    del block
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    status = Path(f"/proc/{pid}/status").read_text()
    hwm = next(int(x.split()[1]) for x in status.splitlines() if x.startswith("VmHWM:"))
    rss = next(int(x.split()[1]) for x in status.splitlines() if x.startswith("VmRSS:"))
    assert hwm <= rss + 8 * 1024
