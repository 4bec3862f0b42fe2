"""Output codecs: every one lossless through the real row writer, the knob, old readers.

Whatever the codec, level, predictor, band heights or COG layout, a written output reads back
as exactly the values written (NaN included) with the same georeferencing; the default
(ZSTD 1, no predictor for class maps) is read by Debian 12's GDAL 3.6 (QGIS 3.22's) as well.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest
import rasterio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from geoserve import Engine
from geoserve.cli.parser import build_parser
from geoserve.config import EngineConfig
from geoserve.errors import ConfigError
from geoserve.raster.codecs import LEVELS, Codec
from geoserve.raster.sinks import make_sink
from geoserve.raster.write import OutputRaster
from tests.conftest import UTM_TRANSFORM, read
from tests.system_python import imports

PROFILE = {"crs": rasterio.crs.CRS.from_epsg(32633), "transform": UTM_TRANSFORM}
SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's, with Debian's GDAL (python3-gdal)


def _values(rng: np.random.Generator, dtype: str, shape: tuple[int, int, int], smooth: bool):
    if dtype == "float32":
        data = rng.standard_normal(shape).astype(np.float32)
        data[:, ::7, ::5] = np.nan
        return np.cumsum(data, axis=2) if smooth else data
    high = 10 if dtype == "uint8" else 3000
    data = rng.integers(0, high, shape).astype(dtype)
    return np.sort(data, axis=2) if smooth else data


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    compression=st.sampled_from(sorted(LEVELS)),
    dtype=st.sampled_from(["uint8", "uint16", "float32"]),
    bands=st.integers(1, 3),
    height=st.integers(1, 600),
    width=st.integers(1, 300),
    smooth=st.booleans(),
    predictor=st.sampled_from([None, True, False]),
    cog=st.booleans(),
    data=st.data(),
)
def test_every_codec_reads_back_bit_for_bit(
    tmp_path_factory, compression, dtype, bands, height, width, smooth, predictor, cog, data
):
    bounds = LEVELS[compression]
    level = data.draw(st.none() | st.integers(*bounds)) if bounds else None
    band_rows = data.draw(st.integers(1, 300))  # how many rows each write hands over
    codec = Codec(compression, level, predictor, data.draw(st.integers(1, 2)))
    rng = np.random.default_rng(height * 1000 + width)
    values = _values(rng, dtype, (bands, height, width), smooth)
    out = tmp_path_factory.mktemp("codec") / "o.tif"
    sink = make_sink("path", out, PROFILE, height, width, cog=cog, codec=codec)
    nodata = None if dtype == "float32" else 0
    for row in range(0, height, band_rows):
        sink.write(row, OutputRaster(values[:, row : row + band_rows], nodata=nodata))
    sink.commit("path")
    got, profile = read(out)
    np.testing.assert_array_equal(got, values)  # NaN where NaN was
    assert (profile["crs"], profile["transform"]) == (PROFILE["crs"], PROFILE["transform"])
    with rasterio.open(out) as ds:
        expected = "none" if compression == "none" else compression
        assert (ds.compression.value.lower() if ds.compression else "none") == expected


def test_the_default_writes_class_maps_as_zstd_1_without_predictor(tmp_path):
    classes = np.random.default_rng(0).integers(0, 4, (1, 300, 280), dtype=np.uint8)
    probabilities = classes.astype(np.float32) / 4
    for name, values in (("classes", classes), ("floats", probabilities)):
        sink = make_sink("path", tmp_path / f"{name}.tif", PROFILE, 300, 280)
        sink.write(0, OutputRaster(values))
        sink.commit("path")
    with rasterio.open(tmp_path / "classes.tif") as ds:
        image = ds.tags(ns="IMAGE_STRUCTURE")
        assert ds.compression.value == "ZSTD"
        assert image.get("PREDICTOR", "1") == "1"  # class codes are not differenced
    with rasterio.open(tmp_path / "floats.tif") as ds:
        assert ds.compression.value == "ZSTD"
        assert ds.tags(ns="IMAGE_STRUCTURE")["PREDICTOR"] == "3"


def test_deflate_writes_what_geoserve_always_wrote():
    old_class_map = {"compress": "deflate", "predictor": 2, "ZLEVEL": 6}
    old_floats = {"compress": "deflate", "predictor": 3, "ZLEVEL": 1}
    codec = Codec("deflate")
    for dtype, old in ((np.uint8, old_class_map), (np.float32, old_floats)):
        options = codec.gtiff_options(np.dtype(dtype))
        assert {k: options[k] for k in old} == old


def test_the_knob_reaches_the_file_and_flags_and_refuses_bad_levels(tmp_path, make_geotiff):
    src = make_geotiff(bands=3, height=40, width=50)
    out = tmp_path / "o.tif"
    cfg = EngineConfig(output_compression="deflate", output_compression_level=9)
    Engine("identity", cfg).generate_image(src, output_path=out).raise_for_error()
    with rasterio.open(out) as ds:
        assert ds.compression.value == "DEFLATE"
    np.testing.assert_array_equal(read(out)[0], read(src)[0].astype(np.float32))
    args = build_parser().parse_args(
        ["predict", "a.tif", "-o", "b.tif", "--output-compression", "lzw"]
    )
    assert args.output_compression == "lzw"
    with pytest.raises(ConfigError, match="output_compression_level.*deflate takes levels 1 to 12"):
        EngineConfig.build(output_compression="deflate", output_compression_level=13)
    with pytest.raises(ConfigError, match="output_compression_level.*lzw has no"):
        EngineConfig.build(output_compression="lzw", output_compression_level=3)


READ_WITH_SYSTEM_GDAL = textwrap.dedent(
    """
    import json, sys
    from osgeo import gdal
    gdal.UseExceptions()
    ds = gdal.Open(sys.argv[1])
    band = ds.GetRasterBand(1)
    print(json.dumps({
        "gdal": gdal.__version__,
        "values": band.ReadAsArray().ravel().tolist(),
        "compression": ds.GetMetadata("IMAGE_STRUCTURE").get("COMPRESSION"),
        "transform": list(ds.GetGeoTransform()),
    }))
    """
)


@pytest.mark.skipif(
    not imports(SYSTEM_PYTHON, "osgeo.gdal"), reason="no system Python with Debian's GDAL"
)
@pytest.mark.parametrize("cog", [False, True])
def test_debian_12s_gdal_reads_the_default_output(tmp_path, cog):
    classes = np.random.default_rng(1).integers(0, 10, (1, 70, 90), dtype=np.uint8)
    sink = make_sink("path", tmp_path / "c.tif", PROFILE, 70, 90, cog=cog)
    sink.write(0, OutputRaster(classes, nodata=255))
    sink.commit("path")
    found = subprocess.run(
        [SYSTEM_PYTHON, "-c", READ_WITH_SYSTEM_GDAL, str(tmp_path / "c.tif")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert found.returncode == 0, found.stderr
    seen = json.loads(found.stdout)
    assert seen["compression"] == "ZSTD"
    assert seen["values"] == classes.ravel().tolist()
    assert seen["transform"] == list(UTM_TRANSFORM.to_gdal())
    assert Path(tmp_path / "c.tif").stat().st_size > 0
