"""STAC Items: reading and checking one, resolving its hrefs, picking bands, opening them."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rasterio
from rasterio.warp import Resampling, reproject

from geoserve.errors import BandMismatchError, InputError, RasterReadError
from geoserve.raster.align import StackedSource, TargetGrid, WarpedSource, align
from geoserve.raster.source import open_raster
from geoserve.raster.stac_item import StacItem, is_stac_input
from geoserve.raster.stac_stack import Wanted, open_item, select_bands, wanted_bands
from tests.conftest import serve_ranges
from tests.multimodal_scenes import s2_array
from tests.stac_items import (
    SCL_CLASSES,
    asset,
    item,
    scl,
    write_band,
    write_item,
    write_s1_item,
    write_s2_item,
)


def opener(href: str) -> Any:
    return open_raster(href, "url" if href.startswith("http") else "path")


def names(*labels: str) -> list[Wanted]:
    wanted = wanted_bands(labels)
    assert wanted is not None
    return wanted


# -- reading an Item ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[1, 2]", "a JSON object is needed"),
        ('{"type": "FeatureCollection", "assets": {}}', "'type' is not 'Feature'"),
        ('{"type": "Feature", "assets": {}}', "without assets"),
        ('{"type": "Feature", "assets": {"red": {"type": "image/tiff"}}}', "'red' has no href"),
        ('{"type": "Feature", "assets": {"red": {"href": 5}}}', "'red' has no href"),
        (
            '{"type": "Feature", "properties": [], "assets": {"a": {"href": "a.tif"}}}',
            "'properties'",
        ),
        ('{"type": "Feature", "assets": ', "not valid JSON"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ],
)
def test_a_file_that_is_no_stac_item_is_refused_naming_it(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(InputError, match=message) as err:
        StacItem.read(path)
    assert str(path) in str(err.value)


def test_item_read_limits_and_missing_file(tmp_path):
    path = write_item(tmp_path / "i.json", item({"a": asset("a.tif", "A", None)}))
    with pytest.raises(InputError, match="larger than 100 bytes"):
        StacItem.read(path, max_bytes=100)
    with pytest.raises(RasterReadError, match="no such file"):
        StacItem.read(tmp_path / "nothing.json")


def test_item_date_id_and_bom(tmp_path):
    path = tmp_path / "i.json"
    data = item({"a": asset("a.tif", "A", None)}, datetime=None)
    data["properties"]["start_datetime"] = "2021-03-04T00:00:00Z"
    data["properties"]["end_datetime"] = "2021-03-05T00:00:00Z"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(data).encode())
    stac = StacItem.read(path)
    assert stac.date == dt.date(2021, 3, 4)
    assert stac.id == "S2B_33UUU_20200601_0_L2A"
    assert StacItem(item({"a": asset("a.tif", "A", None)}, "2020-06-01T10:21:01Z")).date == (
        dt.date(2020, 6, 1)
    )
    with pytest.raises(InputError, match="not a STAC Item"):  # pystac reads the datetime
        StacItem(item({"a": asset("a.tif", "A", None)}, "June"))


# -- hrefs ------------------------------------------------------------------------------------


def test_hrefs_resolve_against_where_the_item_is(tmp_path):
    local = StacItem(item({"a": asset("a.tif", "A", None)}), str(tmp_path / "dir" / "i.json"))
    assert local.resolve("a", "b/../a.tif") == str(tmp_path / "dir" / "a.tif")
    assert local.resolve("a", "/data/a.tif") == "/data/a.tif"
    assert local.resolve("a", "file:///data/my%20a.tif") == "/data/my a.tif"
    assert local.resolve("a", "https://h.example/a.tif") == "https://h.example/a.tif"
    remote = StacItem(item({"a": asset("a.tif", "A", None)}), "https://h.example/c/i.json")
    assert remote.resolve("a", "../x/a.tif") == "https://h.example/x/a.tif"
    assert remote.resolve("a", "/x/a.tif") == "https://h.example/x/a.tif"


@pytest.mark.parametrize(
    ("location", "href", "message"),
    [
        (None, "a.tif", "relative href 'a.tif', but the Item's location is unknown"),
        ("/d/i.json", "s3://bucket/a.tif", "s3:// hrefs are not read"),
        ("/d/i.json", "gs://bucket/a.tif", "gs:// hrefs are not read"),
        ("/d/i.json", "file://otherhost/a.tif", "another host"),
        ("https://h.example/i.json", "file:///etc/passwd", "may not name local files"),
        ("/d/i.json", "", "empty or invalid href"),
    ],
)
def test_hrefs_that_may_not_be_read_are_refused_naming_the_asset(location, href, message):
    stac = StacItem(item({"red": asset(href, "B04", "red")}), location)
    with pytest.raises(InputError, match=message) as err:
        stac.bands()
    assert "asset 'red'" in str(err.value)


def test_an_inline_item_uses_its_absolute_self_link(tmp_path):
    data = item({"a": asset("a.tif", "A", None)})
    data["links"] = [{"rel": "self", "href": "https://h.example/items/i.json"}]
    stac = StacItem(data)
    assert stac.remote
    assert stac.bands()[0].href == "https://h.example/items/a.tif"
    data["links"] = [{"rel": "self", "href": "relative/i.json"}]  # not absolute: not used
    assert StacItem(data).location is None


def test_what_counts_as_an_item_input(tmp_path, make_geotiff):
    path = write_item(tmp_path / "i.json", item({"a": asset("a.tif", "A", None)}))
    odd = write_item(tmp_path / "item.txt", item({"a": asset("a.tif", "A", None)}))
    assert is_stac_input(str(path))
    assert is_stac_input(path)
    assert is_stac_input(str(odd))
    assert is_stac_input(StacItem.read(path), "path")  # an object is one whatever the format
    assert not is_stac_input(str(path), "path")  # (the server passes "path": never an Item)
    assert not is_stac_input(str(make_geotiff()))
    assert not is_stac_input(json.loads(path.read_text()))  # a dict is modalities
    assert not is_stac_input(path.read_bytes())
    assert is_stac_input("https://h.example/a/item.json?x=1")
    assert is_stac_input("https://h.example/v1/collections/sentinel-2-l2a/items/S2B_1")
    assert not is_stac_input("https://h.example/a/B04.tif")
    assert not is_stac_input("/vsicurl/https://h.example/a/item.json")
    assert not is_stac_input(str(tmp_path / "missing.json"))


def test_a_pystac_item_is_read_with_its_self_href(tmp_path):
    pystac = pytest.importorskip("pystac")
    path = write_s2_item(tmp_path, size=32)
    obj = pystac.Item.from_file(str(path))
    assert is_stac_input(obj)
    stac = StacItem.of(obj)
    hrefs = {b.asset: b.href for b in stac.bands()}
    assert hrefs["green"] == str(tmp_path / "B03.tif")


# -- picking bands ----------------------------------------------------------------------------


@pytest.fixture
def s2(tmp_path: Path) -> StacItem:
    return StacItem.read(write_s2_item(tmp_path / "s2", size=32))


@pytest.mark.parametrize(
    ("selector", "asset_key"),
    [
        ("red", "red"),  # asset key (before the JPEG 2000 copy, which is never read)
        ("B04", "red"),  # band name
        ("b4", "red"),  # B4 and B04 are one band
        ("B8A", "nir08"),
        ("B8", "nir"),  # not B8A
        ("NIR", "nir"),  # common name, any case
        ("swir16", "swir16"),
        ("NIR_NARROW", "nir08"),  # a band role: its common name
        ("SWIR_2", "swir22"),
        ("scl", "scl"),  # an asset whose bands the Item does not list: by its key
    ],
)
def test_selectors_find_their_band(s2, selector, asset_key):
    ((w, band),) = select_bands(s2, names(selector))
    assert band.asset == asset_key
    assert w.label == selector


def test_every_data_band_without_selectors(s2):
    picked = [b.asset for _, b in select_bands(s2, None)]
    assert picked == ["blue", "green", "red", "nir", "nir08", "swir16", "swir22", "scl"]


def test_bad_selections_are_refused_naming_the_item_and_the_bands(s2):
    with pytest.raises(BandMismatchError) as err:
        select_bands(s2, names("B05"))
    text = str(err.value)
    assert s2.name in text
    assert "no band 'B05'" in text
    assert "B04 (red), B08 (nir)" in text
    assert "B04 (red)" in text
    assert text.count("B04") == 1
    with pytest.raises(BandMismatchError, match="by position"):
        wanted_bands((0, 1))
    assert [w.label for w, _ in select_bands(s2, names("B05", "B03"), partial=True)] == ["B03"]


def test_ambiguous_and_unreadable_bands(tmp_path):
    twice = StacItem(
        item({"a": asset("a.tif", "B04", "red"), "b": asset("b.tif", "B04", "red")}),
        str(tmp_path / "i.json"),
    )
    with pytest.raises(InputError, match="band 'B04' is in several assets \\('a', 'b'\\)"):
        select_bands(twice, names("B04"))
    jp2 = StacItem(
        item({"red": asset("r.jp2", "B04", "red", media="image/jp2")}), str(tmp_path / "i.json")
    )
    with pytest.raises(InputError, match="asset 'red', which is image/jp2; only GeoTIFF"):
        select_bands(jp2, names("red"))


# -- opening ----------------------------------------------------------------------------------


def bilinear(src: np.ndarray, src_transform: Any, grid: TargetGrid, nodata: float) -> np.ndarray:
    out = np.full((grid.height, grid.width), np.nan, np.float32)
    reproject(
        src.astype(np.float32), out, src_transform=src_transform, src_crs=grid.crs,
        dst_transform=grid.transform, dst_crs=grid.crs, resampling=Resampling.bilinear,
        src_nodata=nodata, dst_nodata=np.nan,
    )  # fmt: skip
    return out


def test_bands_open_as_one_stack_on_the_finest_grid(s2, tmp_path):
    size = 32
    with open_item(s2, names("B03", "swir16", "B8", "scl"), opener) as stack:
        info = stack.info
        assert (info.width, info.height, info.transform.a) == (size, size, 10.0)
        assert info.descriptions == ("B03", "swir16", "B8", "scl")
        assert info.date == dt.date(2020, 6, 1)
        assert info.name == s2.name
        got = stack.read_rows(0, size, [0, 1, 2, 3])
    ten = s2_array(size)
    np.testing.assert_array_equal(got[0], ten[1])  # files on the grid: exact
    np.testing.assert_array_equal(got[2], ten[3])
    with rasterio.open(tmp_path / "s2" / "B11.tif") as src:
        expected = bilinear(src.read(1), src.transform, TargetGrid.of(info), 0)
    np.testing.assert_array_equal(got[1], expected)  # as a whole-scene reproject, exactly
    assert set(np.unique(got[3])) <= set(SCL_CLASSES)  # classes: nearest, never averaged
    np.testing.assert_array_equal(got[3], np.repeat(np.repeat(scl(size), 2, 0), 2, 1))


def test_bands_of_one_file_are_read_from_it_once(tmp_path):
    data = np.arange(3 * 8 * 8, dtype=np.uint16).reshape(3, 8, 8) + 1
    write_band(tmp_path / "rgb.tif", data, rasterio.Affine(10, 0, 0, 0, -10, 80))
    bands = [{"name": n, "common_name": n.lower()} for n in ("R", "G", "B")]
    path = write_item(
        tmp_path / "i.json", item({"visual": asset("rgb.tif", None, None, **{"eo:bands": bands})})
    )
    stac = StacItem.read(path)
    opened: list[str] = []

    def counting(href: str) -> Any:
        opened.append(href)
        return opener(href)

    with open_item(stac, names("b", "r"), counting) as stack:
        assert stack.info.descriptions == ("b", "r")
        np.testing.assert_array_equal(stack.read_rows(0, 8, [0, 1]), data[[2, 0]])
    assert opened == [str(tmp_path / "rgb.tif")]
    write_band(tmp_path / "rgb.tif", data[:1], rasterio.Affine(10, 0, 0, 0, -10, 80))
    with pytest.raises(BandMismatchError, match="the Item lists 3 bands, but .* has 1 band"):
        open_item(stac, names("b"), opener)


def test_the_items_nodata_applies_where_the_file_declares_none(tmp_path):
    data = np.array([[[0, 5], [7, 9]]], dtype=np.uint16)
    write_band(tmp_path / "a.tif", data, rasterio.Affine(10, 0, 0, 0, -10, 20), nodata=None)
    band = asset("a.tif", "A", None, **{"raster:bands": [{"nodata": 0}]})
    stac = StacItem.read(write_item(tmp_path / "i.json", item({"a": band})))
    with open_item(stac, names("A"), opener) as stack:
        assert stack.info.nodata == 0


def test_a_missing_file_is_reported_naming_item_asset_and_file(s2, tmp_path):
    (tmp_path / "s2" / "B03.tif").unlink()
    with pytest.raises(RasterReadError) as err:
        open_item(s2, names("B04", "B03"), opener)
    assert f"{s2.name}: asset 'green': {tmp_path / 's2' / 'B03.tif'}: no such file" in str(
        err.value
    )


def test_a_stack_moves_to_another_grid_from_its_files_pixels(tmp_path):
    """align() of an Item stack warps each file once, from its own pixels: the same values as
    warping each file directly, even for a band already resampled into the stack."""
    s2 = StacItem.read(write_s2_item(tmp_path / "s2", size=32))
    s1 = StacItem.read(write_s1_item(tmp_path / "s1", size=32))
    target = TargetGrid.of(open_item(s2, names("B03"), opener).info)
    with open_item(s1, names("VH", "VV"), opener) as stack:
        moved = align(stack, target)
        assert isinstance(moved, StackedSource)
        assert moved is not stack
        assert moved.info.descriptions == ("VH", "VV")
        assert moved.info.date == dt.date(2020, 6, 2)
        got = moved.read_rows(0, 32, [0, 1])
        for i, pol in enumerate(("VH", "VV")):
            with WarpedSource(opener(str(tmp_path / "s1" / f"{pol}.tif")), target) as direct:
                np.testing.assert_array_equal(got[i], direct.read_rows(0, 32, [0])[0])
        assert np.isnan(got).any()
        assert not np.isnan(got).all()
        moved.close()
    with open_item(s2, names("B11"), opener) as coarse:  # B11 alone: its own 20 m grid
        assert coarse.info.transform.a == 20.0
        moved = align(coarse, target)
        with WarpedSource(opener(str(tmp_path / "s2" / "B11.tif")), target) as direct:
            np.testing.assert_array_equal(moved.read_rows(0, 32, [0]), direct.read_rows(0, 32, [0]))
        moved.close()


def test_an_item_over_http_is_read_in_place(tmp_path):
    write_s2_item(tmp_path, size=64)
    with serve_ranges(tmp_path) as (base, log):
        url = f"{base}/s2_item.json"
        assert is_stac_input(url)
        stac = StacItem.of(url)
        assert stac.remote
        assert stac.bands()[1].href == f"{base}/B03.tif"
        with open_item(stac, names("B03", "B8A"), opener) as stack:
            assert stack.info.name == url
            got = stack.read_rows(0, 64, [0])[0]
    np.testing.assert_array_equal(got, s2_array(64)[1])
    tif_reads = [(m, p, r) for m, p, r in log if p.endswith(".tif") and m == "GET"]
    assert tif_reads
    assert all(r is not None for _, _, r in tif_reads)
    assert {p for _, p, _ in tif_reads} == {"/B03.tif", "/B8A.tif"}  # only the bands wanted


def test_a_failed_item_download_is_an_input_error(tmp_path):
    with (
        serve_ranges(tmp_path) as (base, _),
        pytest.raises(InputError, match="cannot fetch the STAC Item \\(HTTP 404\\)"),
    ):
        StacItem.of(f"{base}/missing.json")
