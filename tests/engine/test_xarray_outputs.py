"""``out_format="xarray"`` and the ``da.geoserve`` accessor (the ``xarray`` extra).

Every product as xarray equals the GeoTIFF the same request writes, bit for bit, on the same
grid and CRS; a vector kind is refused by name; the accessor returns the same Dataset.
"""

from __future__ import annotations

import numpy as np
import pytest
import rasterio
import xarray as xr

import geoserve.xarray
from geoserve import Engine
from geoserve.errors import ConfigError
from tests.cubes import scene_cube

KINDS = ("classes", "confidence", "probabilities", "embeddings")


@pytest.fixture(scope="module")
def engine():
    with Engine("demo-water", embedding_dtype="float16") as eng:
        yield eng


def _tif(path):
    with rasterio.open(path) as src:
        return src.read(), src.crs, src.transform, src.nodata, src.descriptions


def test_xarray_products_equal_the_geotiffs_bit_for_bit(engine, tmp_path):
    cube = scene_cube(224, 320)
    files = engine.generate_image(cube, output_path=tmp_path / "scene", output_kind=KINDS)
    result = engine.generate_image(cube, out_format="xarray", output_kind=KINDS)
    ds = result.dataset
    assert isinstance(ds, xr.Dataset)
    assert list(ds.data_vars) == list(KINDS)
    for kind in KINDS:
        data, crs, transform, nodata, names = _tif(files.outputs_by_kind[kind].path)
        var = ds[kind]
        got = var.values if var.ndim == 3 else var.values[np.newaxis]
        assert got.dtype == data.dtype, kind
        assert got.shape == data.shape, kind
        assert got.tobytes() == data.tobytes(), kind  # bit for bit (NaN nodata too)
        single = result.outputs_by_kind[kind].xarray  # each kind's own DataArray
        assert single.rio.crs == crs
        assert single.rio.transform() == transform, kind
        assert single.rio.nodata == nodata or (np.isnan(single.rio.nodata) and np.isnan(nodata))
        if all(names):
            assert [str(b) for b in single.band.values] == list(names), kind
    # the pixel kinds share the request's grid: the cube's own coords
    assert (ds.x.values == cube.x.values).all()
    assert (ds.y.values == cube.y.values).all()
    assert ds.rio.crs == cube.rio.crs
    assert ds.rio.transform() == cube.rio.transform()
    # the token grid has its own (16 px tokens)
    assert ds["embeddings"].dims[1:] == ("y_embeddings", "x_embeddings")
    assert ds.sizes["x_embeddings"] == 320 // 16
    assert ds["probabilities"].probabilities_band.values.tolist() == ["not water", "water"]
    assert ds["classes"].attrs["flag_meanings"] == "not_water water"
    water = (ds["classes"] == 1).sum()
    assert 0 < water < ds["classes"].size  # (both classes: a real comparison)


def test_a_vector_kind_as_xarray_is_refused_by_name(engine):
    with pytest.raises(ConfigError, match="polygons are a vector file.*not xarray"):
        engine.generate_image(scene_cube(64, 64), out_format="xarray", output_kind="polygons")


def test_dataset_of_a_non_xarray_result_says_what_to_ask_for(engine):
    result = engine.generate_image(scene_cube(64, 64), out_format="tensor")
    with pytest.raises(ConfigError, match="out_format='xarray'"):
        _ = result.dataset


def test_the_accessor_returns_the_same_dataset_on_a_cached_engine(engine, tmp_path):
    cube = scene_cube(192, 192)
    want = engine.generate_image(cube, out_format="xarray", output_kind="classes,confidence")
    try:
        ds = cube.geoserve.predict("demo-water", output_kind=["classes", "confidence"])
        again = cube.geoserve.predict("demo-water", output_kind="classes")
        assert geoserve.xarray.engine_for("demo-water") is geoserve.xarray.engine_for("demo-water")
        assert len(geoserve.xarray._ENGINES) == 1  # (one engine for both calls)
    finally:
        geoserve.xarray.close_engines()
    xr.testing.assert_identical(ds, want.dataset)
    assert list(again.data_vars) == ["classes"]
    # a given engine instead of the cached one
    mine = cube.geoserve.predict(output_kind="classes", engine=engine)
    assert (mine["classes"].values == ds["classes"].values).all()
    assert not geoserve.xarray._ENGINES
