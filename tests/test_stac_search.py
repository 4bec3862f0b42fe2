"""STAC API searches as inputs, against a real STAC API (rustac serve) on 127.0.0.1.

The catalogue (:mod:`tests.stac_catalogue`): four Sentinel-2-like Items in two UTM zones on two
days, band files served by a loopback range server. Every expected value is made by hand with
rasterio (``reproject`` onto the search's grid, first valid pixel wins) from the same files.
"""

from __future__ import annotations

import http.server
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rasterio
from affine import Affine
from rasterio.enums import Resampling
from rasterio.warp import reproject

import geoserve
from geoserve.errors import ForbiddenInputError, InputError
from geoserve.raster.stac_mosaic import CLOUD_CLASSES, plan_search
from geoserve.stac_query import StacSearch, stac_search
from tests.cli_process import run_in_process as run_cli
from tests.conftest import http_server
from tests.stac_catalogue import (
    BBOX,
    COLLECTION,
    DAYS,
    Catalogue,
    scenes,
    served_catalogue,
    stac_api,
)

pytest.importorskip("odc.stac")  # (the stac extra, which ./scripts/setup.sh installs)


@pytest.fixture(scope="module")
def catalogue(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Catalogue]:
    with served_catalogue(tmp_path_factory.mktemp("stac")) as served:
        yield served


def _grid(out: Any) -> tuple[Affine, Any, tuple[int, int]]:
    return out.rio.transform(), out.rio.crs, (out.sizes["y"], out.sizes["x"])


def _hand(cat: Catalogue, name: str, grid: tuple[Affine, Any, tuple[int, int]], day: str,
          resampling: Resampling) -> np.ndarray:  # fmt: skip
    """One band of one day placed on ``grid`` by hand: each Item reprojected, first valid wins
    (the Items in id order, as odc-stac orders a day's Items of one time)."""
    transform, crs, shape = grid
    out = np.full(shape, np.nan, np.float32)
    for s in sorted((s for s in scenes() if s.day == day), key=lambda s: s.item_id):
        with rasterio.open(cat.root / s.item_id / f"{name}.tif") as src:
            one = np.full(shape, np.nan, np.float32)
            reproject(rasterio.band(src, 1), one, src_nodata=0, dst_transform=transform,
                      dst_crs=crs, dst_nodata=np.nan, resampling=resampling)  # fmt: skip
        out = np.where(np.isnan(out), one, out)
    return out


def _hand_clear(cat: Catalogue, name: str, grid: Any, day: str) -> np.ndarray:
    """A 10 m band of one day, its cloudy pixels (by the day's SCL) NaN."""
    band = _hand(cat, name, grid, day, Resampling.bilinear)
    scl = _hand(cat, "SCL", grid, day, Resampling.nearest)
    return np.where(np.isin(scl, CLOUD_CLASSES), np.nan, band)


def test_search_finds_the_items_clearest_first(catalogue: Catalogue) -> None:
    ids = [i.id for i in catalogue.search().find()]
    assert ids == ["S2_T32_20240601", "S2_T33_20240601", "S2_T32_20240611", "S2_T33_20240611"]
    later = catalogue.search(datetime="2024-06-05/2024-06-30").find()
    assert {i.id for i in later} == {"S2_T32_20240611", "S2_T33_20240611"}
    clear = catalogue.search(max_cloud=20).find()
    assert {i.id for i in clear} == {"S2_T32_20240601", "S2_T33_20240601"}
    west = stac_search(catalogue.url, COLLECTION, (11.96, 44.996, 11.98, 45.004)).find()
    assert {i.id for i in west} == {"S2_T32_20240601", "S2_T32_20240611"}


def test_one_day_mosaic_equals_the_hand_made_one(catalogue: Catalogue) -> None:
    """One day across the zone line: both Items placed on one grid, clouds nodata."""
    engine = geoserve.Engine("identity")
    search = catalogue.search(datetime="2024-06-01")
    out = engine.generate_image(search, out_format="xarray", bands=["B3", "B8"]).outputs.xarray
    transform, crs, shape = grid = _grid(out)
    assert crs.to_epsg() == 32633
    assert transform.a == 10
    assert transform.e == -10
    assert transform.c % 10 == 0
    assert transform.f % 10 == 0
    for i, name in enumerate(("B03", "B08")):
        want = _hand_clear(catalogue, name, grid, DAYS[0])
        np.testing.assert_allclose(out.values[i], want, rtol=1e-6, equal_nan=True)
    scl = _hand(catalogue, "SCL", grid, DAYS[0], Resampling.nearest)
    cloudy = np.isin(scl, CLOUD_CLASSES)
    assert cloudy.sum() > 100
    assert np.isnan(out.values[:, cloudy]).all()
    west = _hand(catalogue, "B03", grid, DAYS[0], Resampling.bilinear)
    assert np.isfinite(out.values[0][~cloudy & np.isfinite(west)]).all()  # (both zones read)
    assert shape[1] > 200
    assert np.isfinite(out.values[0][:, 0]).any()
    assert np.isfinite(out.values[0][:, -1]).any()


def test_composite_fills_clouds_from_the_next_clearest_day(catalogue: Catalogue) -> None:
    engine = geoserve.Engine("identity")
    out = engine.generate_image(catalogue.search(), out_format="xarray", bands=["B3", "B11"])
    cube = out.outputs.xarray
    grid = _grid(cube)
    first = _hand_clear(catalogue, "B03", grid, DAYS[0])
    second = _hand_clear(catalogue, "B03", grid, DAYS[1])
    want = np.where(np.isnan(first), second, first)
    np.testing.assert_allclose(cube.values[0], want, rtol=1e-6, equal_nan=True)
    assert np.isnan(first).sum() > 100
    assert not np.isnan(cube.values[0]).any()
    swir = [_hand(catalogue, "B11", grid, d, Resampling.bilinear) for d in DAYS]  # 20 m bands
    scl = [_hand(catalogue, "SCL", grid, d, Resampling.nearest) for d in DAYS]
    clear = [np.where(np.isin(c, CLOUD_CLASSES), np.nan, b) for b, c in zip(swir, scl, strict=True)]
    np.testing.assert_allclose(
        cube.values[1], np.where(np.isnan(clear[0]), clear[1], clear[0]), rtol=1e-6, equal_nan=True
    )


def test_ndwi_over_the_search_equals_it_over_the_hand_made_mosaic(
    catalogue: Catalogue, tmp_path: Path
) -> None:
    engine = geoserve.Engine("ndwi-water")
    res = engine.generate_image(catalogue.search(), output_path=tmp_path / "search.tif")
    with rasterio.open(res.outputs.path) as ds:
        got, grid, tags = ds.read(1), (ds.transform, ds.crs, ds.shape), ds.tags()
    bands = []
    for name in ("B03", "B08"):
        a, b = (_hand_clear(catalogue, name, grid, d) for d in DAYS)
        bands.append(np.where(np.isnan(a), b, a))
    hand = tmp_path / "hand.tif"
    rows, cols = grid[2]
    profile = {"width": cols, "height": rows, "count": 2, "dtype": "float32", "nodata": np.nan}
    with rasterio.open(hand, "w", driver="GTiff", crs=grid[1], transform=grid[0], **profile) as dst:
        dst.write(np.stack(bands))
        dst.descriptions = ("B3", "B8")
    with rasterio.open(
        engine.generate_image(str(hand), output_path=tmp_path / "h.tif").outputs.path
    ) as ds:
        want = ds.read(1)
    np.testing.assert_array_equal(got, want)
    assert 0 < (got == 1).mean() < 0.5  # (the lakes are water)
    assert tags["STAC_API"] == catalogue.url
    assert tags["STAC_DAYS"] == ",".join(DAYS)
    assert tags["STAC_ITEMS"].split(",") == [s.item_id for s in scenes()]  # (day by day)
    xr_out = engine.generate_image(catalogue.search(), out_format="xarray").outputs.xarray
    np.testing.assert_array_equal(xr_out.values[0], got)  # xarray and GeoTIFF: bit for bit


def test_a_model_of_two_dates_gets_the_clearest_day_of_each_window(catalogue: Catalogue) -> None:
    engine = geoserve.Engine("test-coords")  # band 0 per date, then year and day of year
    search = catalogue.search(datetime="2024-05-25/2024-06-20")
    out = engine.generate_image(search, out_format="xarray", bands=["B3"]).outputs.xarray.values
    grid = _grid(engine.generate_image(search, out_format="xarray", bands=["B3"]).outputs.xarray)
    hand = [_hand_clear(catalogue, "B03", grid, day) for day in DAYS]
    valid = np.isfinite(hand[0]) & np.isfinite(hand[1])  # (an output pixel needs every date)
    assert (~valid).sum() > 100  # the first day's clouds stay nodata: no composite here
    for t in range(2):
        np.testing.assert_allclose(out[t][valid], hand[t][valid], rtol=1e-6)
        assert np.isnan(out[t][~valid]).all()
    assert out[2, 0, 0] == 2024
    assert out[3, 0, 0] == 153
    assert out[4, 0, 0] == 2024
    assert out[5, 0, 0] == 163
    with pytest.raises(InputError, match="no scene from 2024-06-17 to 2024-06-30"):
        plan_search(catalogue.search(datetime="2024-06-05/2024-06-30"), ["B3"], 2)


def test_hostile_searches_are_refused(catalogue: Catalogue) -> None:
    engine = geoserve.Engine("ndwi-water")
    with pytest.raises(InputError, match="more than 2 Items"):
        engine.generate_image(catalogue.search(max_items=2))
    with pytest.raises(InputError, match="pixels"):  # a huge area at 10 m
        plan_search(stac_search(catalogue.url, COLLECTION, (0, 0, 60, 60)), ["B3"], 1)
    with pytest.raises(InputError, match="no Items"):
        catalogue.search(datetime="2023-01-01/2023-02-01").find()

    def no_api(url: str) -> None:
        raise ForbiddenInputError(f"{url}: host is not an allowed URL domain")

    with pytest.raises(ForbiddenInputError, match="not an allowed"):
        catalogue.search().with_guards(no_api, None).find()

    def no_files(href: str) -> str:
        raise ForbiddenInputError(f"{href}: host is not an allowed URL domain")

    with pytest.raises(ForbiddenInputError, match="S2_T32_20240601: asset 'green': http"):
        engine.generate_image(catalogue.search().with_guards(None, no_files))
    for bad in ({"url": "file:///etc"}, {"bbox": (10, 50, 9, 51)}, {"bbox": (0, 0, 200, 1)},
                {"collections": ["../x"]}, {"max_items": 10**6}, {"crs": "+proj=utm"}):  # fmt: skip
        args = {"url": catalogue.url, "collections": [COLLECTION], "bbox": BBOX, **bad}
        with pytest.raises(InputError, match=next(iter(bad))):
            StacSearch.from_json(args)


@pytest.fixture
def hostile_api(catalogue: Catalogue, tmp_path: Path) -> Iterator[str]:
    """A second real STAC API whose Item names a local file."""
    item = json.loads(json.dumps(catalogue.items[0]))
    item["assets"]["green"]["href"] = "file:///etc/passwd"
    with stac_api([item], tmp_path) as url:
        yield url


def test_an_item_naming_a_local_file_is_refused(hostile_api: str) -> None:
    engine = geoserve.Engine("ndwi-water")
    refused = "asset 'green': an Item read from a URL may not name local files"
    with pytest.raises(InputError, match=refused):
        engine.generate_image(stac_search(hostile_api, COLLECTION, BBOX))


class _Redirecting(http.server.BaseHTTPRequestHandler):
    """Answers every request with a redirect to another host."""

    def do_GET(self) -> None:  # noqa: N802
        self.send_response(302)
        self.send_header("Location", "http://169.254.169.254/")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def redirecting() -> Iterator[str]:
    with http_server(_Redirecting) as url:
        yield url


def test_a_catalogue_that_redirects_is_refused(redirecting: str) -> None:
    with pytest.raises(InputError, match="redirects"):
        stac_search(redirecting, COLLECTION, BBOX).find()


def test_cli_predict_and_info(catalogue: Catalogue, tmp_path: Path) -> None:
    flags = ["--stac", catalogue.url, "--collection", COLLECTION, "--bbox",
             ",".join(map(str, BBOX)), "--datetime", "2024-05-25/2024-06-20"]  # fmt: skip
    info = run_cli("info", "--model", "ndwi-water", *flags)
    assert info.returncode == 0, info.stderr
    assert "4 Items" in info.stdout
    assert "B3 <- asset 'green'" in info.stdout
    assert "2024-06-01: S2_T32_20240601, S2_T33_20240601" in info.stdout
    out = tmp_path / "water.tif"
    run = run_cli("predict", "--model", "ndwi-water", "-o", str(out), *flags)
    assert run.returncode == 0, run.stderr
    want = geoserve.Engine("ndwi-water").generate_image(catalogue.search(), out_format="xarray")
    with rasterio.open(out) as ds:
        np.testing.assert_array_equal(ds.read(1), want.outputs.xarray.values[0])
    bad = run_cli("predict", "--model", "ndwi-water", "-o", str(out), "in.tif", *flags)
    assert bad.returncode == 2
    assert "not both" in bad.stderr
    lone = run_cli("predict", "--model", "ndwi-water", "-o", str(out), "--bbox", "1,2,3,4")
    assert lone.returncode == 2
    assert "--stac" in lone.stderr


def test_a_search_reaches_the_network_lane() -> None:
    """Searches are admitted in the lane of requests that reach other hosts."""
    from geoserve.engine.admission_pool import reaches_network

    assert reaches_network([stac_search("http://127.0.0.1:9", "c", BBOX)])


_ITEM = {
    "type": "Feature", "stac_version": "1.0.0", "id": "one", "collection": "c",
    "geometry": None, "properties": {"datetime": "2024-06-01T10:00:00Z"}, "links": [],
    "assets": {"b": {"href": "http://127.0.0.1:9/b.tif"}},
}  # fmt: skip


class _Paging(http.server.BaseHTTPRequestHandler):
    """A STAC API whose first page links its next one on another port, with headers."""

    def do_GET(self) -> None:  # noqa: N802
        base = f"http://127.0.0.1:{self.server.server_address[1]}"
        if self.path.startswith("/search"):
            page = {
                "type": "FeatureCollection",
                "features": [_ITEM],
                "links": [{"rel": "next", "href": "http://127.0.0.1:9/search?page=2",
                           "headers": {"Host": "elsewhere", "Authorization": "x"}}],
            }  # fmt: skip
            body = page
        else:
            body = {
                "type": "Catalog", "id": "x", "description": "x", "stac_version": "1.0.0",
                "conformsTo": ["https://api.stacspec.org/v1.0.0/core",
                               "https://api.stacspec.org/v1.0.0/item-search"],
                "links": [{"rel": "search", "href": f"{base}/search"},
                          {"rel": "self", "href": base}],
            }  # fmt: skip
        raw = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    do_POST = do_GET  # (pystac-client searches by POST where it can)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_next_page_off_the_catalogue_is_refused() -> None:
    with http_server(_Paging) as url, pytest.raises(InputError, match="off its own host"):
        stac_search(url, "c", BBOX).find()
