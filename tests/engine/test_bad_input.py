"""Each kind of bad input gives a clear error naming what is wrong, and fails alone."""

import base64
import warnings

import numpy as np
import pytest

from geoserve import Engine, RasterArray
from geoserve.errors import (
    BandMismatchError,
    GeoServeError,
    InputError,
    ModelExecutionError,
    NotGeoreferencedWarning,
    RasterReadError,
)
from tests.conftest import read


@pytest.fixture(scope="module")
def identity():
    return Engine("identity", patch_size=16, stride=12)


def test_missing_file(identity, tmp_path):
    missing = tmp_path / "nope.tif"
    with pytest.raises(RasterReadError, match=r"nope\.tif: no such file") as info:
        identity.generate_image(missing)
    assert isinstance(info.value, OSError)


def test_not_a_raster(identity, tmp_path):
    path = tmp_path / "notes.tif"
    path.write_text("this is not a GeoTIFF\n" * 20)
    with pytest.raises(RasterReadError, match=r"notes\.tif: not a readable raster"):
        identity.generate_image(path)


def test_truncated_tiff(identity, make_geotiff, tmp_path):
    rng = np.random.default_rng(0)
    src = make_geotiff(
        data=rng.integers(0, 60000, (3, 200, 200)).astype(np.uint16),
        name="full.tif",
        compress="deflate",
        tiled=True,
    )
    raw = src.read_bytes()
    cut = tmp_path / "cut.tif"
    cut.write_bytes(raw[: len(raw) // 2])
    out = tmp_path / "out.tif"
    with pytest.raises(RasterReadError, match=r"cut\.tif") as info:
        identity.generate_image(cut, output_path=out)
    assert "truncated or corrupt" in str(info.value) or "not a readable raster" in str(info.value)
    assert not out.exists()
    assert not list(tmp_path.glob(".out.tif*"))


def test_corrupt_header(identity, tmp_path, make_geotiff):
    raw = bytearray(make_geotiff(name="ok.tif").read_bytes())
    raw[4:8] = b"\xff\xff\xff\x7f"  # first IFD offset far past the end
    bad = tmp_path / "bad.tif"
    bad.write_bytes(bytes(raw))
    with pytest.raises(RasterReadError, match=r"bad\.tif"):
        identity.generate_image(bad)


def test_zero_size_image(identity):
    with pytest.raises(InputError, match="0x5; it has no pixels"):
        identity.generate_image(
            RasterArray(np.zeros((1, 5, 0), dtype=np.uint8), {"crs": "EPSG:4326"})
        )


def test_fewer_bands_than_the_model_needs(make_geotiff):
    path = make_geotiff(bands=2, name="two.tif")
    engine = Engine("test-seg")
    with pytest.raises(BandMismatchError, match=r"two\.tif has 2 bands; band index 2.*test-seg"):
        engine.generate_image(path)


def test_band_name_not_there(make_geotiff):
    path = make_geotiff(bands=3, descriptions=["B2", "B4", "B8"], name="s2.tif")
    with pytest.raises(BandMismatchError, match=r"s2\.tif: no band named 'B3'.*ndwi-water"):
        Engine("ndwi-water").generate_image(path)


def test_non_numeric_dtype(identity, make_geotiff):
    data = (np.ones((1, 8, 8)) + 1j).astype(np.complex64)
    path = make_geotiff(data=data, name="complex.tif")
    with pytest.raises(InputError, match=r"complex\.tif: data type complex64 is not supported"):
        identity.generate_image(path)


def test_not_georeferenced_warns_but_works(identity, make_geotiff, tmp_path):
    path = make_geotiff(bands=1, height=20, width=30, crs=None, transform=None, name="plain.tif")
    out = tmp_path / "plain_out.tif"
    with pytest.warns(NotGeoreferencedWarning, match=r"plain\.tif"):
        identity.generate_image(path, output_path=out)
    data, profile = read(out)
    np.testing.assert_array_equal(data, read(path)[0].astype(np.float32))
    assert profile.get("crs") is None


def test_all_nodata_image_gives_all_nodata_output(make_geotiff, tmp_path):
    path = make_geotiff(data=np.zeros((3, 30, 40), dtype=np.uint16), nodata=0, name="empty.tif")
    out = tmp_path / "empty_out.tif"
    result = Engine("test-seg").generate_image(path, output_path=out)
    data, profile = read(out)
    assert result.num_patches == 0  # nothing valid: the model never ran
    assert profile["nodata"] == 255
    assert (data == 255).all()


def test_bad_base64(identity):
    with pytest.raises(InputError, match="not valid base64"):
        identity.generate_image("%%%% not base64 %%%%", data_format="b64")


def test_one_bad_request_among_many_fails_alone(make_geotiff, tmp_path):
    good = [make_geotiff(bands=3, height=h, width=w) for h, w in ((30, 30), (17, 45))]
    missing = tmp_path / "missing.tif"
    bad_b64 = base64.b64encode(b"not a tiff at all, sorry").decode() * 4
    inputs = [good[0], missing, bad_b64, good[1]]
    engine = Engine("identity", patch_size=16, stride=12)
    outs = engine.generate_image(inputs, output_path=tmp_path / "outs")
    assert [o.ok for o in outs] == [True, False, False, True]
    assert "missing.tif: no such file" in str(outs[1].error)
    assert isinstance(outs[2].error, RasterReadError)
    for o, src in ((outs[0], good[0]), (outs[3], good[1])):
        np.testing.assert_array_equal(read(o.outputs.path)[0], read(src)[0].astype(np.float32))


def test_model_failure_fails_only_that_batch(make_geotiff):
    poisoned = np.full((1, 16, 16), 2e6, dtype=np.float32)
    fine = np.arange(16 * 16, dtype=np.float32).reshape(1, 16, 16)
    engine = Engine("test-fragile", max_batch_patches=1)
    prof = {"crs": "EPSG:4326", "transform": (1, 0, 0, 0, -1, 0)}
    outs = engine.generate_image(
        [RasterArray(fine, prof), RasterArray(poisoned, prof), RasterArray(fine, prof)],
        out_format="tensor",
    )
    assert [o.ok for o in outs] == [True, False, True]
    assert isinstance(outs[1].error, ModelExecutionError)
    assert "test-fragile" in str(outs[1].error)
    assert "poisoned patch" in str(outs[1].error)
    np.testing.assert_array_equal(outs[2].outputs.tensor.numpy(), fine)
    # the engine keeps serving afterwards
    again = engine.generate_image(RasterArray(fine, prof), out_format="tensor")
    assert again.ok


def test_errors_are_geoserve_errors_and_builtins():
    assert issubclass(RasterReadError, GeoServeError)
    assert issubclass(RasterReadError, OSError)
    assert issubclass(BandMismatchError, ValueError)


def test_nodata_masked_and_carried(make_geotiff, tmp_path):
    data = np.arange(1, 3 * 40 * 50 + 1, dtype=np.uint16).reshape(3, 40, 50) % 500 + 1
    data[:, 5:9, 10:30] = 0
    data[1, 20, 20] = 0  # one band's nodata invalidates the pixel
    path = make_geotiff(data=data, nodata=0)
    out = tmp_path / "o.tif"
    Engine("test-seg").generate_image(path, output_path=out)
    cls, profile = read(out)
    invalid = (data == 0).any(axis=0)
    assert profile["nodata"] == 255
    assert (cls[0][invalid] == 255).all()
    assert (cls[0][~invalid] < 4).all()


def test_nan_pixels_are_nodata_in_float_output(tmp_path):
    image = np.ones((1, 20, 20), dtype=np.float32)
    image[0, 3, 4] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NotGeoreferencedWarning)
        out = Engine("identity", patch_size=8, stride=8, blend="none").generate_image(
            RasterArray(image), out_format="tensor"
        )
    y = out.outputs.tensor.numpy()
    assert np.isnan(y[0, 3, 4])
    assert np.isfinite(np.delete(y.ravel(), 3 * 20 + 4)).all()


def test_a_model_that_rejects_its_input_at_warm_up_is_named_with_what_it_got():
    with pytest.raises(ModelExecutionError) as info:
        Engine("test-three-for-six")
    message = str(info.value)
    assert (
        "warm-up on a dummy input: model 'test-three-for-six' failed on input of shape" in message
    )
    assert "(1, 3, 16, 16) (3 bands from its input processor: band_1, band_2, band_3)" in message
    assert "RuntimeError: Given groups=1" in message


def test_a_processor_without_a_band_count_does_not_make_warm_up_refuse_the_model(
    make_geotiff, caplog
):
    """Its dummy input has 3 bands, which says nothing of what the model takes."""
    with Engine("test-six-bands") as engine:
        assert "warm-up skipped" in caplog.text
        out = engine.generate_image(make_geotiff(bands=6, height=16, width=16), out_format="tensor")
    assert out.ok
    assert out.outputs.tensor.shape == (1, 16, 16)


def test_a_model_that_rejects_a_request_names_the_input_shape_and_bands(make_geotiff):
    src = make_geotiff(bands=3, height=16, width=16, descriptions=["B2", "B3", "B4"])
    with Engine("test-six-bands", warmup=False) as engine, pytest.raises(ModelExecutionError) as e:
        engine.generate_image(src, out_format="tensor")
    assert str(e.value).startswith(
        f"{src}: model 'test-six-bands' failed on input of shape (1, 3, 16, 16) "
        "(3 bands from its input processor: B2, B3, B4): RuntimeError: "
    )


@pytest.mark.parametrize("keep", [9, 200])
def test_broken_uploaded_bytes_are_not_named_by_an_internal_file(identity, make_geotiff, keep):
    raw = make_geotiff(compress="deflate", tiled=True, height=64, width=64).read_bytes()
    with pytest.raises(RasterReadError) as info:
        identity.generate_image(raw[:keep])
    message = str(info.value)
    assert message.startswith("<bytes>: not a readable raster (TIFFReadDirectory")
    assert "vsimem" not in message
    assert ".tif" not in message  # GDAL named the in-memory copy <uuid>.tif
