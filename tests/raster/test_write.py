import base64

import numpy as np
import pytest
import rasterio
from rasterio.errors import RasterioError
from rasterio.io import MemoryFile

import geoserve.raster.write as write_mod
from geoserve import Engine
from geoserve.errors import OutputWriteError
from geoserve.raster import OutputRaster, geotiff_bytes, write_geotiff
from tests.conftest import UTM_TRANSFORM

PROFILE = {"crs": rasterio.crs.CRS.from_epsg(32633), "transform": UTM_TRANSFORM}


def test_written_file_is_tiled_compressed_and_aligned(tmp_path):
    out = OutputRaster(
        np.arange(2 * 300 * 270, dtype=np.float32).reshape(2, 300, 270),
        nodata=float("nan"),
        descriptions=("a", "b"),
        tags={"K": "v"},
    )
    path = write_geotiff(tmp_path / "o.tif", out, PROFILE)
    with rasterio.open(path) as dst:
        assert dst.profile["tiled"]
        assert dst.block_shapes[0] == (256, 256)
        assert dst.compression.value == "ZSTD"  # (the default codec, geoserve.raster.codecs)
        assert dst.crs == PROFILE["crs"]
        assert dst.transform == UTM_TRANSFORM
        assert dst.descriptions == ("a", "b")
        assert dst.tags()["K"] == "v"
        np.testing.assert_array_equal(dst.read(), out.data)


def test_failed_write_leaves_no_partial_file(tmp_path, monkeypatch):
    target = tmp_path / "o.tif"
    target.write_bytes(b"previous result")

    real_flush = write_mod.RowWriter._flush

    def broken(self, stop):
        real_flush(self, stop)
        raise RasterioError("disk full (simulated)")

    monkeypatch.setattr(write_mod.RowWriter, "_flush", broken)
    out = OutputRaster(np.zeros((1, 64, 64), dtype=np.uint8))
    with pytest.raises(OutputWriteError, match=r"o\.tif: cannot write output.*disk full"):
        write_geotiff(target, out, PROFILE)
    assert target.read_bytes() == b"previous result"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.tif"]


def test_missing_output_directory(tmp_path):
    with pytest.raises(OutputWriteError, match="does not exist"):
        write_geotiff(tmp_path / "no" / "o.tif", OutputRaster(np.zeros((1, 4, 4))), PROFILE)


def test_in_memory_outputs_match_file_output(make_geotiff, tmp_path):
    src = make_geotiff(bands=3, descriptions=["B2", "B3", "B8"])
    engine = Engine("ndwi-water", bands=["B3", "B8"])
    path_out = engine.generate_image(src, output_path=tmp_path / "p.tif").outputs
    b64_out = engine.generate_image(src, out_format="b64").outputs
    bytes_out = engine.generate_image(src.read_bytes(), out_format="bytes").outputs
    tensor_out = engine.generate_image(src, out_format="tensor").outputs
    with rasterio.open(path_out.path) as a:
        expected, transform = a.read(), a.transform
    for raw in (base64.b64decode(b64_out.b64), bytes_out.data):
        with MemoryFile(raw) as mem, mem.open() as ds:
            np.testing.assert_array_equal(ds.read(), expected)
            assert ds.transform == transform
    np.testing.assert_array_equal(tensor_out.tensor.numpy(), expected)
    assert geotiff_bytes(OutputRaster(expected), PROFILE)[:2] in (b"II", b"MM")


def test_class_names_go_to_the_gdal_sidecar(tmp_path):
    import xml.etree.ElementTree as ET

    out = OutputRaster(
        np.zeros((1, 20, 20), dtype=np.uint8),
        nodata=255,
        categories=("not water", "water & wetland"),
    )
    path = write_geotiff(tmp_path / "c.tif", out, PROFILE)
    sidecar = tmp_path / "c.tif.aux.xml"
    root = ET.parse(sidecar).getroot()
    names = [c.text for c in root.iter("Category")]
    assert names == ["not water", "water & wetland"]
    with rasterio.open(path) as ds:  # GDAL still opens it, sidecar and all
        assert ds.read().shape == (1, 20, 20)
