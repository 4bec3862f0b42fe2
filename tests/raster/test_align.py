"""Alignment: a dict of modalities through ``identity`` is the modalities' bands on the first
one's grid, each other modality warped bilinearly; checked against ``rasterio.warp.reproject``.

The scenes: an S2-like 10 m scene in EPSG:32633 and an S1-like ~20 m scene in EPSG:4326 that
covers only its upper-left part (tests/multimodal_scenes.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import rasterio
from affine import Affine
from rasterio.crs import CRS
from rasterio.vrt import WarpedVRT
from rasterio.warp import Resampling, reproject

from geoserve import Engine, RasterArray, RequestSpec
from geoserve.errors import InputError, NotGeoreferencedWarning, RasterReadError
from geoserve.raster.align import StackedSource, TargetGrid, WarpedSource, align
from geoserve.raster.source import open_raster
from tests.multimodal_scenes import write_s1, write_s2

SIZE = 256


@pytest.fixture(scope="module")
def scenes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("align")
    s2 = write_s2(root / "s2.tif", SIZE)
    with rasterio.open(s2, "r+") as dst:  # a nodata block, partly under the S1 footprint
        dst.write(np.zeros((4, 40, 60), np.uint16), window=rasterio.windows.Window(20, 30, 60, 40))
    return s2, write_s1(root / "s1.tif", SIZE)


def _identity(inputs: object, **config: object) -> np.ndarray:
    out = Engine("identity", **{"patch_size": 64, **config}).generate_image(
        inputs, out_format="tensor"
    )
    return out.outputs.tensor.numpy()


def _reprojected(src_path: Path, onto: Path, resampling: Resampling) -> np.ndarray:
    with rasterio.open(src_path) as src, rasterio.open(onto) as ref:
        out = np.full((src.count, ref.height, ref.width), np.nan, np.float32)
        reproject(
            rasterio.band(src, list(range(1, src.count + 1))),
            out,
            dst_transform=ref.transform,
            dst_crs=ref.crs,
            dst_nodata=np.nan,
            resampling=resampling,
        )
    return out


def test_identity_over_a_dict_is_the_reprojected_stack(scenes):
    s2, s1 = scenes
    got = _identity({"s2": str(s2), "s1": str(s1)})
    assert got.shape == (6, SIZE, SIZE)
    with rasterio.open(s2) as src:
        raw = src.read()
    valid = (raw != 0).all(axis=0)
    # the first modality's bands come back exactly wherever they are valid, also where the
    # other modality is missing; its nodata is NaN
    np.testing.assert_array_equal(got[:4][:, valid], raw[:, valid].astype(np.float32))
    assert np.isnan(got[:4][:, ~valid]).all()
    # the other one: GDAL's bilinear warp; outside its footprint NaN
    want = _reprojected(s1, s2, Resampling.bilinear)
    np.testing.assert_array_equal(np.isnan(got[4:]), np.isnan(want))
    assert 0.2 < np.isnan(want).mean() < 0.9  # it covers only part of the scene
    # equal up to GDAL's approximation of the transform, cut into different blocks by a
    # whole-scene reproject (a shift of well under a pixel; the data varies ~0.3 dB per pixel)
    assert np.nanmax(np.abs(got[4:] - want)) < 0.15
    # and exactly what GDAL's warper gives when it reads the whole grid at once
    with rasterio.open(s1) as src, rasterio.open(s2) as ref:
        vrt = WarpedVRT(src, crs=ref.crs, transform=ref.transform, width=SIZE, height=SIZE,
                        resampling=Resampling.bilinear, nodata=np.nan, dtype="float32")  # fmt: skip
        with vrt:
            np.testing.assert_array_equal(got[4:], vrt.read())


def test_alignment_does_not_depend_on_how_the_scene_is_cut(scenes):
    s2, s1 = scenes
    inputs = {"s2": str(s2), "s1": str(s1)}
    first = _identity(inputs, patch_size=64)
    for config in (
        {"patch_size": 48, "stride": 40},
        {"patch_size": 128, "max_batch_patches": 1},
        {"patch_size": 64, "streaming": False, "prefetch": False},
    ):
        np.testing.assert_array_equal(_identity(inputs, **config), first)


def test_same_crs_other_resolution_and_extent_is_reproject(tmp_path):
    rng = np.random.default_rng(3)
    crs = CRS.from_epsg(32633)
    ref = RasterArray(
        rng.integers(1, 1000, (1, 90, 110)).astype(np.uint16),
        {"crs": crs, "transform": Affine(10, 0, 500000, 0, -10, 4000000)},
        name="ref",
    )
    coarse_t = Affine(30, 0, 500000 + 347, 0, -30, 4000000 - 251)
    coarse = rng.integers(-50, 50, (2, 20, 25)).astype(np.int16)
    coarse[:, 5:8, 5:9] = -99
    other = RasterArray(coarse, {"crs": crs, "transform": coarse_t, "nodata": -99}, name="dem")
    got = _identity({"ref": ref, "dem": other}, patch_size=32)
    want = np.full((2, 90, 110), np.nan, np.float32)
    reproject(coarse, want, src_transform=coarse_t, src_crs=crs, src_nodata=-99,
              dst_transform=ref.profile["transform"], dst_crs=crs, dst_nodata=np.nan,
              resampling=Resampling.bilinear)  # fmt: skip
    # nothing approximated when only resolution and extent differ: equal to float32 rounding
    # (GDAL's working type differs between its two entry points); NaN exactly where reproject's
    np.testing.assert_allclose(got[1:], want, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(np.isnan(got[1:]), np.isnan(want))
    np.testing.assert_array_equal(got[0], ref.data[0].astype(np.float32))


def test_nearest_keeps_categories(tmp_path):
    crs = CRS.from_epsg(32633)
    ref = RasterArray(
        np.ones((1, 64, 64), np.uint16), {"crs": crs, "transform": Affine(10, 0, 0, 0, -10, 0)}
    )
    classes = np.random.default_rng(0).choice([10, 20, 30], (1, 25, 25)).astype(np.uint8)
    lulc = RasterArray(classes, {"crs": crs, "transform": Affine(30, 0, 5, 0, -30, -5)})
    src = open_raster(lulc)
    warped = align(src, TargetGrid.of(open_raster(ref).info), "nearest")
    assert isinstance(warped, WarpedSource)
    rows = warped.read_rows(0, 64, [0])
    assert set(np.unique(rows[np.isfinite(rows)])) <= {10.0, 20.0, 30.0}
    bilinear = align(open_raster(lulc), TargetGrid.of(open_raster(ref).info), "bilinear")
    values = bilinear.read_rows(0, 64, [0])
    assert not set(np.unique(values[np.isfinite(values)])) <= {10.0, 20.0, 30.0}


def test_a_source_on_the_grid_is_read_as_is(scenes):
    s2, _ = scenes
    src = open_raster(str(s2))
    assert align(src, TargetGrid.of(src.info)) is src
    src.close()


def test_stacked_sources_keep_their_own_nodata():
    crs = CRS.from_epsg(32633)
    prof = {"crs": crs, "transform": Affine(10, 0, 0, 0, -10, 0)}
    a = RasterArray(np.array([[[0, 5], [6, 7]]], np.uint16), {**prof, "nodata": 0}, "a")
    b = RasterArray(np.array([[[1, -1], [3, 4]]], np.int16), {**prof, "nodata": -1}, "b")
    stack = StackedSource([open_raster(a), open_raster(b)], "a+b")
    assert stack.info.count == 2
    assert stack.info.dtype == "float32"
    rows = stack.read_rows(0, 2, [1, 0])
    np.testing.assert_array_equal(rows[0], [[1, np.nan], [3, 4]])
    np.testing.assert_array_equal(rows[1], [[np.nan, 5], [6, 7]])
    same = StackedSource([open_raster(a), open_raster(a)], "a+a")
    assert same.info.dtype == "uint16"
    assert same.info.nodata == 0


def test_inputs_that_cannot_be_aligned_are_named(scenes):
    s2, _ = scenes
    plain = RasterArray(np.ones((1, 10, 10), np.float32), name="sketch")
    with (
        pytest.warns(NotGeoreferencedWarning),
        pytest.raises(InputError, match="sketch: not on the reference"),
    ):
        Engine("identity", patch_size=32).generate_image({"s2": str(s2), "x": plain})
    with pytest.raises(RasterReadError, match="modality 'x': missing.tif: no such file"):
        Engine("identity", patch_size=32).generate_image({"s2": str(s2), "x": "missing.tif"})


def test_a_list_of_dicts_is_several_requests(scenes, tmp_path):
    s2, s1 = scenes
    eng = Engine("identity", patch_size=64)
    outs = eng.generate_image(
        [{"s2": str(s2), "s1": str(s1)}, {"s1": str(s1)}, {"s2": "nope.tif"}],
        output_path=tmp_path / "out",
    )
    assert [o.error is None for o in outs] == [True, True, False]
    assert outs[0].outputs.path.name == "s2_pred.tif"
    with rasterio.open(outs[0].outputs.path) as a, rasterio.open(s2) as ref:
        assert (a.count, a.crs, a.transform) == (6, ref.crs, ref.transform)
    with rasterio.open(outs[1].outputs.path) as b, rasterio.open(s1) as ref:
        assert (b.count, b.crs) == (2, ref.crs)  # alone, S1 is its own reference
    assert "nope.tif" in str(outs[2].error)


def test_grids_a_twentieth_of_a_pixel_apart_are_warped_not_stacked():
    crs = CRS.from_epsg(4326)
    cols = np.tile(np.arange(2000, dtype=np.float32), (4, 1))[None]
    a = RasterArray(cols, {"crs": crs, "transform": Affine(1e-4, 0, 10, 0, -1e-4, 50)}, "a")
    b = RasterArray(cols, {"crs": crs, "transform": Affine(1.05e-4, 0, 10, 0, -1.05e-4, 50)}, "b")
    got = _identity({"a": a, "b": b}, patch_size=64)
    # b's column 1904.5 lies under a's pixel 1999.5: a warp, not the same grid
    assert abs(got[1, 0, 1999] - 1904.3) < 1.0


def test_a_crs_gdal_cannot_transform_is_an_input_error_naming_the_modality(scenes):
    s2, _ = scenes
    mars = CRS.from_wkt(
        'GEOGCS["Mars 2000",DATUM["D_Mars_2000",SPHEROID["Mars_2000_IAU_IAG",3396190.0,'
        '169.89444722361179]],PRIMEM["Greenwich",0],UNIT["Decimal_Degree",0.0174532925199433]]'
    )
    red = RasterArray(
        np.ones((1, 20, 20), np.float32), {"crs": mars, "transform": Affine(0.1, 0, 0, 0, -0.1, 2)}
    )
    with pytest.raises(InputError, match="modality 'mars': .*cannot be warped"):
        Engine("identity", patch_size=32).generate_image({"s2": str(s2), "mars": red})


def test_a_warped_input_is_costed_at_its_own_size(scenes):
    s2, _ = scenes
    crs = CRS.from_epsg(32633)
    fine = RasterArray(
        np.zeros((1, 3000, 3000), np.uint8),
        {"crs": crs, "transform": Affine(1, 0, 400000, 0, -1, 5800000)},
        "fine",
    )
    eng = Engine("identity", patch_size=64)
    alone = eng.prepare_request(RequestSpec(str(s2)))
    both = eng.prepare_request(RequestSpec({"s2": str(s2), "fine": fine}))
    try:
        assert both.input_pixels == alone.input_pixels + 3000 * 3000
        # the warper may hold all of the fine input at once: it is in the memory estimate
        assert both.memory_bytes - alone.memory_bytes >= 3000 * 3000 * 4
    finally:
        alone.close()
        both.close()


def test_a_modality_that_misses_the_reference_grid_is_refused(scenes):
    s2, _ = scenes
    far = RasterArray(
        np.ones((1, 20, 20), np.float32),
        {"crs": CRS.from_epsg(32633), "transform": Affine(10, 0, 100000, 0, -10, 1000000)},
        "far",
    )
    with pytest.raises(InputError, match="modality 'x': far: covers none of the reference grid"):
        Engine("identity", patch_size=32).generate_image({"s2": str(s2), "x": far})
