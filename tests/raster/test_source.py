import base64
import datetime as dt

import numpy as np
import pytest

from geoserve.errors import BandMismatchError, InputError, NotGeoreferencedWarning, RasterReadError
from geoserve.raster import RasterArray, open_raster, resolve_bands
from geoserve.raster.coords import acquisition_date, centre_lonlat, year_doy
from tests.conftest import FLOOD, LAKE, needs_shared


def test_path_bytes_b64_and_array_read_the_same(make_geotiff):
    path = make_geotiff(bands=2, height=5, width=7)
    raw = path.read_bytes()
    with open_raster(str(path)) as src:
        expected = src.read_rows(0, 5, [0, 1])
        info = src.info
    for obj, fmt in (
        (raw, "auto"),
        (base64.b64encode(raw).decode(), "auto"),
        (base64.b64encode(raw).decode(), "b64"),
        (path, "path"),
    ):
        with open_raster(obj, fmt) as src:
            np.testing.assert_array_equal(src.read_rows(0, 5, [0, 1]), expected)
            assert src.info.transform == info.transform
    arr = RasterArray(expected, {"crs": info.crs, "transform": info.transform})
    with open_raster(arr) as src:
        np.testing.assert_array_equal(src.read_rows(1, 3, [1]), expected[[1], 1:3])


def test_read_rows_is_a_window(make_geotiff):
    path = make_geotiff(bands=3, height=30, width=4)
    with open_raster(path) as src:
        rows = src.read_rows(10, 13, [2, 0])
    full = (np.arange(3 * 30 * 4) % 60000 + 1).reshape(3, 30, 4)
    np.testing.assert_array_equal(rows, full[[2, 0], 10:13])


def test_resolve_bands_by_index_and_name(make_geotiff):
    path = make_geotiff(bands=3, descriptions=["B2", "B3", "B8"])
    with open_raster(path) as src:
        assert resolve_bands(src.info, ["b8", 0, "1"]) == [2, 0, 1]
        assert resolve_bands(src.info, None) == [0, 1, 2]
        with pytest.raises(BandMismatchError, match="no band named 'B11'.*B2, B3, B8"):
            resolve_bands(src.info, ["B11"])
        with pytest.raises(BandMismatchError, match="has 3 bands; band index 5"):
            resolve_bands(src.info, [5])


def test_bad_base64_is_an_input_error():
    with pytest.raises(InputError, match="not valid base64"):
        open_raster("!!!not base64!!!", "b64")


def test_base64_of_non_tiff_is_a_read_error():
    with pytest.raises(RasterReadError, match="<base64>: not a readable raster"):
        open_raster(base64.b64encode(b"hello world" * 10).decode())


def test_array_not_georeferenced_warns():
    with pytest.warns(NotGeoreferencedWarning, match="<array>"):
        open_raster(RasterArray(np.zeros((1, 3, 3), dtype=np.uint8))).close()


@needs_shared(LAKE)
def test_date_from_file_name_and_location():
    with open_raster(LAKE) as src:
        assert acquisition_date(src.info) == dt.date(2017, 2, 16)
        lon, lat = centre_lonlat(src.info)
    assert lon == pytest.approx(12.609, abs=1e-3)
    assert lat == pytest.approx(52.490, abs=1e-3)
    assert year_doy(dt.date(2017, 2, 16)) == (2017, 47)


@needs_shared(FLOOD)
def test_location_in_geographic_crs():
    with open_raster(FLOOD) as src:
        lon, lat = centre_lonlat(src.info)
        with pytest.raises(InputError, match="no acquisition date"):
            acquisition_date(src.info)
    assert (lon, lat) == pytest.approx((-0.7589, 38.1058), abs=1e-3)


def test_date_from_tag_and_julian_stamp(make_geotiff):
    p = make_geotiff(tags={"ACQUISITION_DATE": "2021-07-04T10:00:00Z"})
    with open_raster(p) as src:
        assert acquisition_date(src.info) == dt.date(2021, 7, 4)
    q = make_geotiff(name="HLS.S30.T10SEG.2020245T183919.v2.0.tif")
    with open_raster(q) as src:
        assert acquisition_date(src.info) == dt.date(2020, 9, 1)


@pytest.mark.parametrize(
    ("layout", "block"),
    [({"tiled": True, "blockxsize": 64, "blockysize": 64, "compress": "deflate"}, 64), ({}, None)],
)
@pytest.mark.parametrize(("patch", "stride"), [(32, 24), (48, 48), (100, 90)])
@pytest.mark.filterwarnings("ignore::geoserve.errors.NotGeoreferencedWarning")
def test_patch_rows_decode_each_block_once(make_geotiff, layout, block, patch, stride):
    from geoserve import GeoTiffPatcher
    from geoserve.raster import open_raster as open_

    path = make_geotiff(bands=2, height=333, width=70, **layout)
    proc = GeoTiffPatcher(patch_size=patch, stride=stride, blend="center")
    whole = open_(path).read_rows(0, 333, [0, 1])
    with open_(path, threads=2) as src:
        ctx = proc.prepare([src])
        rows = [proc.read_row([src], ctx, r) for r in range(ctx.grid.rows)]
        assert src.rows_decoded == 333  # every row, and so every block, decoded exactly once
    uncached = open_raster(RasterArray(whole))
    for r, row in enumerate(rows):
        np.testing.assert_array_equal(row.patches, proc.read_row([uncached], ctx, r).patches)


def test_gdal_block_cache_is_capped_at_64_megabytes(monkeypatch):
    """Engines cap GDAL's cache at 64 MB (rasterio takes bytes: 64 would mean 64 bytes, and
    every reduced read, such as a quicklook's, decoded each tile again per output row)."""
    from rasterio.env import get_gdal_config, set_gdal_config

    from geoserve.raster.gdal_setup import limit_gdal_cache

    monkeypatch.delenv("GDAL_CACHEMAX", raising=False)
    before = get_gdal_config("GDAL_CACHEMAX")
    try:
        limit_gdal_cache()
        assert get_gdal_config("GDAL_CACHEMAX") == 64 * 2**20
    finally:
        set_gdal_config("GDAL_CACHEMAX", before)
