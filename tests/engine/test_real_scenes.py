"""The real Sentinel-2, HLS and Landsat files (data/, tests/data/), end to end."""

import numpy as np
import pytest
import rasterio

from geoserve import Engine
from tests.conftest import FLOOD, FLOOD_LABEL, HLS, LAKE, RGB, needs_shared


def _profile(path):
    with rasterio.open(path) as src:
        return src.crs, src.transform, src.width, src.height, src.nodata, src.tags()


@needs_shared(LAKE)
def test_lake_scene_identity_is_lossless_and_aligned(tmp_path):
    out = tmp_path / "lake_id.tif"
    Engine("identity").generate_image(LAKE, output_path=out)
    crs, transform, w, h, _, _ = _profile(LAKE)
    with rasterio.open(out) as dst, rasterio.open(LAKE) as src:
        assert (dst.crs, dst.transform, dst.width, dst.height) == (crs, transform, w, h)
        assert (w, h) == (1536, 768)
        assert dst.profile["tiled"]
        assert dst.profile["compress"] == "zstd"  # the default codec
        assert dst.descriptions == src.descriptions
        np.testing.assert_array_equal(dst.read(), src.read().astype(np.float32))
        assert dst.nodata is None  # the input declares none: no spurious nodata


@needs_shared(FLOOD)
@pytest.mark.parametrize("blend", ["center", "cosine", "mean", "none"])
def test_flood_chip_geographic_crs_preserved(tmp_path, blend):
    out = tmp_path / f"flood_{blend}.tif"
    Engine("ndwi-water", blend=blend).generate_image(FLOOD, output_path=out)
    crs, transform, w, h, nodata, _ = _profile(FLOOD)
    assert crs.to_epsg() == 4326
    assert nodata == 0
    with rasterio.open(out) as dst:
        assert (dst.crs, dst.transform, dst.width, dst.height) == (crs, transform, w, h)
        assert dst.nodata == 255
        assert dst.dtypes[0] == "uint8"
        assert dst.colormap(1)[1][:3] == (31, 120, 220)
        assert dst.descriptions == ("class",)
        assert dst.tags()["CLASS_NAMES"] == "not water,water"


@needs_shared(FLOOD)
def test_ndwi_water_matches_hand_labels_like_the_published_rule(tmp_path):
    out = tmp_path / "flood.tif"
    Engine("ndwi-water").generate_image(FLOOD, output_path=out)
    with rasterio.open(out) as p, rasterio.open(FLOOD_LABEL) as y:
        pred, label = p.read(1), y.read(1)
    valid = label >= 0
    water, truth = (pred == 1) & valid, (label == 1) & valid
    iou = (water & truth).sum() / (water | truth).sum()
    acc = (pred[valid] == label[valid]).mean()
    # NDWI(B3, B8) > 0 on this chip: IoU 0.68, accuracy 0.91 (reference/demo_model_feasibility.md)
    assert 0.64 < iou < 0.72
    assert 0.88 < acc < 0.93


@needs_shared(HLS)
def test_hls_float_chip_with_nodata(tmp_path):
    out = tmp_path / "hls.tif"
    Engine("identity", bands=[1, 2, 3, 4, 5, 6]).generate_image(HLS, output_path=out)
    crs, transform, w, h, nodata, _ = _profile(HLS)
    with rasterio.open(out) as dst, rasterio.open(HLS) as src:
        assert (dst.crs, dst.transform, dst.width, dst.height) == (crs, transform, w, h)
        assert np.isnan(dst.nodata)  # float outputs mark nodata with NaN
        np.testing.assert_array_equal(dst.read(), src.read([2, 3, 4, 5, 6, 7]))


@needs_shared(RGB)
def test_landsat_nodata_border_carried(tmp_path):
    out = tmp_path / "rgb.tif"
    Engine("identity").generate_image(RGB, output_path=out)
    with rasterio.open(out) as dst, rasterio.open(RGB) as src:
        a, b = src.read(), dst.read()
        invalid = a == 0  # band by band: identity keeps each band's own nodata
        assert invalid.any(axis=0).mean() > 0.2
        assert (invalid.any(axis=0) & ~invalid).sum() > 1000  # valid values beside nodata
        np.testing.assert_array_equal(np.isnan(b), invalid)
        np.testing.assert_array_equal(b[~invalid], a[~invalid].astype(np.float32))
        assert (dst.crs, dst.transform) == (src.crs, src.transform)


@needs_shared(RGB)
def test_wrong_band_count_for_a_real_file():
    from geoserve.errors import BandMismatchError

    with pytest.raises(BandMismatchError, match=r"RGB\.byte\.tif.*no band named 'B3'"):
        Engine("ndwi-water").generate_image(RGB)
