"""Quicklooks: which bands are drawn, how the panels are laid out, and what reading costs."""

import re
from pathlib import Path

import numpy as np
import pytest
import rasterio
from PIL import Image
from rasterio.enums import Resampling
from rasterio.env import get_gdal_config, set_gdal_config

from geoserve.quicklook import render_quicklook
from geoserve.raster.source import open_raster
from geoserve.raster.thumbnail import read_thumbnail, thumbnail_shape
from geoserve.raster.true_colour import choose_bands
from tests.conftest import write_geotiff

PURE_RED, CYAN = (255, 0, 0), (0, 255, 255)


def count(png, rgb):
    img = np.asarray(Image.open(png).convert("RGB"))
    return int(np.all(img == rgb, axis=-1).sum())


# -- which bands ---------------------------------------------------------------------------


def _bands(tmp_path, n, descriptions=None):
    path = write_geotiff(
        tmp_path / f"b{n}.tif", np.ones((n, 8, 8), np.uint16), descriptions=descriptions
    )
    with open_raster(path) as src:
        return src.info


def test_band_descriptions_pick_red_green_blue_in_any_order(tmp_path):
    info = _bands(tmp_path, 4, ["B2", "B3", "B4", "B8"])
    bands, shown = choose_bands(info, {0: "RED", 1: "GREEN", 2: "BLUE"})  # the file wins
    assert bands == [2, 1, 0]  # (0-based, as every read takes them)
    assert shown == "true colour: red, green, blue = B4, B3, B2"


def test_the_models_band_roles_pick_them_for_unnamed_bands(tmp_path):
    info = _bands(tmp_path, 6)
    bands, shown = choose_bands(info, {0: "BLUE", 1: "GREEN", 2: "RED", 3: "NIR_NARROW"})
    assert bands == [2, 1, 0]
    assert "bands 3, 2, 1 (the model's band roles)" in shown  # (counted from 1 for people)


def test_unnamed_bands_without_roles_are_not_called_true_colour(tmp_path):
    bands, shown = choose_bands(_bands(tmp_path, 6))
    assert bands == [0, 1, 2]
    assert "true colour" not in shown
    assert shown == "bands 1, 2, 3 as red, green, blue (bands not named)"
    assert choose_bands(_bands(tmp_path, 1)) == ([0], "band 1 in grey")
    assert choose_bands(_bands(tmp_path, 13))[0] == [3, 2, 1]  # Sentinel-2's B4, B3, B2


def test_band_roles_follow_the_models_band_selection(tmp_path):
    from geoserve import GeoTiffPatcher
    from geoserve.errors import ConfigError
    from geoserve.raster import open_raster

    proc = GeoTiffPatcher(bands=("B2", "B3", "B4"), band_roles=("BLUE", "GREEN", "RED"))
    path = write_geotiff(
        tmp_path / "named.tif", np.ones((4, 8, 8), np.uint16), descriptions=["B8", "B4", "B3", "B2"]
    )
    with open_raster(path) as src:
        assert proc.band_roles_for(src.info) == {3: "BLUE", 2: "GREEN", 1: "RED"}
    assert proc.replace(bands=(0, 1, 2)).band_roles is None  # other bands: roles unknown
    with pytest.raises(
        ConfigError, match="3 bands selected, but the model's band_roles has 2 values"
    ):
        GeoTiffPatcher(bands=(0, 1, 2), band_roles=("BLUE", "GREEN"))


def _hls_like(tmp_path):
    """Six unnamed bands in HLS order; "red" (band 3) is bright on the left, blue and green
    (bands 1, 2) on the right: pure red on the left, cyan on the right when drawn right."""
    data = np.zeros((6, 64, 64), np.uint16)
    data[2, :, :32] = 1000
    data[0:2, :, 32:] = 1000
    return write_geotiff(tmp_path / "hls.tif", data)


def test_predict_quicklook_draws_red_from_the_models_red_band(tmp_path, capsys):
    from geoserve.cli import main

    src, out, png = _hls_like(tmp_path), tmp_path / "o.tif", tmp_path / "o.png"
    assert (
        main(["predict", str(src), "-o", str(out), "-m", "test-roles", "--quicklook", str(png)])
        == 0
    )
    assert count(png, PURE_RED) > 10_000  # bands 1, 2, 3 as R, G, B would draw it blue
    assert count(png, CYAN) > 10_000


def test_predict_prints_the_tif_then_draws_the_quicklook(tmp_path, capsys):
    from geoserve.cli import main

    src, out, png = _hls_like(tmp_path), tmp_path / "o.tif", tmp_path / "o.png"
    assert (
        main(["predict", str(src), "-o", str(out), "-m", "identity", "--quicklook", str(png)]) == 0
    )
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert re.match(rf"wrote {re.escape(str(out))} \(64x64, 6 band\(s\) float32", lines[0]), lines
    assert lines[1] == f"wrote {png} (quicklook)"
    err = captured.err.splitlines()
    assert err[-1] == "drawing quicklook…"
    assert err[-2].startswith("progress: 1/1 patches (100%)")


def test_quiet_predict_prints_nothing_about_the_quicklook(tmp_path, capsys):
    from geoserve.cli import main

    src, png = _hls_like(tmp_path), tmp_path / "q.png"
    args = ["predict", str(src), "-o", str(tmp_path / "q.tif"), "-m", "test-roles", "-q"]
    assert main([*args, "--quicklook", str(png)]) == 0
    assert png.stat().st_size > 1000
    assert capsys.readouterr() == ("", "")


# -- panel sizes ---------------------------------------------------------------------------


def _panels(png):
    """(height, width) of the two picture panels: the two long non-white runs of the middle
    row, each measured down its middle column (titles, legend and colour bar lie outside)."""
    img = np.asarray(Image.open(png).convert("RGB")).astype(int)
    ink = (img < 250).any(axis=-1)
    row = ink[img.shape[0] // 2]
    edges = np.flatnonzero(np.diff(np.r_[0, row.astype(int), 0]))
    runs = [(a, b) for a, b in zip(edges[::2], edges[1::2], strict=True) if b - a > 100]
    assert len(runs) == 2, runs
    sizes = []
    for a, b in runs:
        col = ink[:, (a + b) // 2]
        mid = img.shape[0] // 2
        top = mid - np.argmin(col[mid::-1])
        bottom = mid + np.argmin(col[mid:])
        sizes.append((int(bottom - top), int(b - a)))
    return sizes


@pytest.mark.parametrize("kind", ["raw", "classes"])
def test_a_colour_bar_leaves_the_panels_the_same_size(tmp_path, kind):
    # input: three constant bands (drawn black); outputs: a float ramp (viridis, colour bar)
    # or a class map (a colour table and legend); no white pixels inside either panel
    src = write_geotiff(tmp_path / "in.tif", np.ones((3, 300, 400), np.uint16))
    if kind == "raw":
        ramp = np.tile(np.linspace(-1, 1, 400, dtype=np.float32), (300, 1))[None]
        out = write_geotiff(tmp_path / "out.tif", ramp, tags={"GEOSERVE_OUTPUT": "raw"})
    else:
        classes = (np.arange(400)[None, None, :] // 200 * np.ones((1, 300, 1))).astype(np.uint8)
        out = write_geotiff(tmp_path / "out.tif", classes, tags={"CLASS_NAMES": "a,b"})
        with rasterio.open(out, "r+") as dst:
            dst.write_colormap(1, {0: (200, 40, 40, 255), 1: (40, 40, 200, 255)})
    png = render_quicklook(src, out, tmp_path / f"{kind}.png")
    left, right = _panels(png)
    assert abs(left[0] - right[0]) <= 2, (left, right)
    assert abs(left[1] - right[1]) <= 2, (left, right)
    assert left[1] > 400  # a panel is about half the 1200-pixel figure


# -- reading -------------------------------------------------------------------------------


@pytest.fixture
def small_gdal_cache():
    """GDAL's block cache at 1 MB, smaller than one tile of all bands; restored afterwards."""
    before = get_gdal_config("GDAL_CACHEMAX")
    set_gdal_config("GDAL_CACHEMAX", 1 << 20)
    yield
    set_gdal_config("GDAL_CACHEMAX", before)


def _scene(tmp_path, **profile):
    """13 bands of noise (compresses to about its own size), tiled, pixel-interleaved."""
    rng = np.random.default_rng(0)
    data = rng.integers(0, 10000, (13, 512, 1024), dtype=np.uint16)
    data[:, :40, :50] = 0  # a nodata corner
    return write_geotiff(
        tmp_path / "scene.tif",
        data,
        nodata=0,
        tiled=True,
        blockxsize=256,
        blockysize=256,
        compress="deflate",
        interleave="pixel",
        **profile,
    )


def _bytes_read() -> int:
    """Bytes this process has read from files so far (Linux's per-process I/O count)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar")


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux's /proc/self/io")
def test_a_thumbnail_reads_each_block_once_whatever_the_cache(tmp_path, small_gdal_cache):
    path = _scene(tmp_path)
    size = path.stat().st_size
    with open_raster(path) as src:
        read_thumbnail(src, [0], 16)  # (everything the first read imports or opens, done)
    with open_raster(path) as src:
        before = _bytes_read()
        picture = read_thumbnail(src, [3, 2, 1], 300)
        read = _bytes_read() - before
    # GDAL's own reduced read decodes a block row again for every output row it spans when
    # the cache cannot hold it: several times the file here
    assert read < 1.1 * size, (read, size)
    assert picture.shape == (3, 150, 300) == (3, *thumbnail_shape(512, 1024, 300))
    set_gdal_config("GDAL_CACHEMAX", 64 << 20)
    with rasterio.open(path) as ds:  # the same pixels as GDAL's nearest-neighbour read
        ref = ds.read(
            [4, 3, 2], out_shape=(3, 150, 300), resampling=Resampling.nearest, masked=True
        )
    np.testing.assert_array_equal(picture.data, ref.data)
    np.testing.assert_array_equal(picture.mask, ref.mask)
    assert picture.mask[:, 0, 0].all()
    assert not picture.mask[:, -1, -1].any()


def test_a_thumbnail_reads_an_overview_when_the_file_has_one(tmp_path, small_gdal_cache):
    path = _scene(tmp_path)
    with rasterio.open(path, "r+") as ds:
        ds.build_overviews([2, 4], Resampling.nearest)
    with open_raster(path) as src:
        picture = read_thumbnail(src, [0], 256)
    assert picture.shape == (1, 128, 256)
    with rasterio.open(path, overview_level=1) as ov:  # the 4x overview, exactly its size
        np.testing.assert_array_equal(picture.data, ov.read([1]))
