"""Inputs are opened only by allowed GDAL drivers: a VRT (or any other format) is refused unread.

Every variant goes through a public entry point (the Python API, the CLI) and must leave the
bait untouched: the FIFO never opened, the listener never connected to, the secret never read.
"""

from __future__ import annotations

import base64
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import rasterio
from pydantic import ValidationError

from geoserve import Engine
from geoserve.errors import ConfigError, InputFormatError, RasterReadError
from geoserve.raster.source import open_raster
from geoserve.server import ServerSettings
from tests.cli_process import run_in_process
from tests.conftest import write_geotiff


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    with Engine("identity", patch_size=16, stride=16, blend="none") as eng:
        yield eng


def _as(form: str, vrt: bytes, tmp_path: Path) -> object:
    if form == "bytes":
        return vrt
    if form == "base64":
        return base64.b64encode(vrt).decode()
    name = {"path .vrt": "evil.vrt", "path .tif": "evil.tif"}[form]
    (tmp_path / name).write_bytes(vrt)
    return str(tmp_path / name)


@pytest.mark.parametrize("form", ["bytes", "base64", "path .vrt", "path .tif"])
def test_vrt_is_refused_by_the_python_api_without_touching_what_it_names(
    engine, bait, tmp_path, form
):
    obj = _as(form, bait.vrt(), tmp_path)
    with pytest.raises(InputFormatError, match=r"VRT.*allowed input formats: GTiff"):
        engine.generate_image(obj, out_format="tensor")
    assert bait.untouched()


def test_a_vrt_cannot_return_a_local_file_as_pixels(engine, bait):
    with pytest.raises(InputFormatError, match="VRT"):
        engine.generate_image(bait.vrt(only_secret=True), out_format="tensor")


def test_vrt_is_refused_by_the_cli(bait, tmp_path):
    evil = tmp_path / "scene.tif"
    evil.write_bytes(bait.vrt())
    out = tmp_path / "out.tif"
    res = run_in_process("predict", str(evil), "-o", str(out), "-m", "identity")
    assert res.returncode == 1
    assert f"{evil}: the content is a GDAL virtual raster (VRT)" in res.stderr
    assert "Traceback" not in res.stderr
    assert not out.exists()
    assert bait.untouched()


def test_other_formats_are_refused_by_default_and_allowed_by_name(tmp_path):
    png = tmp_path / "scene.png"
    data = np.arange(3 * 20 * 24, dtype=np.uint8).reshape(3, 20, 24)
    with rasterio.open(png, "w", driver="PNG", width=24, height=20, count=3, dtype="uint8") as d:
        d.write(data)
    with (
        Engine("identity", patch_size=16, stride=16, blend="none") as eng,
        pytest.raises(InputFormatError, match=r"PNG \(format PNG\); allowed input formats"),
    ):
        eng.generate_image(str(png), out_format="tensor")
    with (
        Engine(
            "identity", patch_size=16, stride=16, blend="none", allowed_formats=["GTiff", "PNG"]
        ) as eng,
        pytest.warns(UserWarning, match="no CRS or geotransform"),
    ):
        out = eng.generate_image(str(png), out_format="tensor")
    np.testing.assert_array_equal(out.outputs.tensor.numpy(), data)


@pytest.mark.parametrize("formats", [["VRT"], ["GTiff", "MBTiles"], []])
def test_formats_that_chain_files_cannot_be_allowed(formats):
    with pytest.raises(ConfigError, match="allowed input formats"):
        Engine("identity", allowed_formats=formats, warmup=False)
    with pytest.raises(ValidationError):
        ServerSettings(model="identity", allowed_formats=formats)


@pytest.mark.parametrize(
    "name", ["/vsizip//tmp/x.zip/a.tif", "GTIFF_DIR:1:/tmp/a.tif", "/vsicurl_streaming/a"]
)
def test_gdal_path_syntax_is_not_a_local_path(engine, name):
    with pytest.raises(RasterReadError, match="not a local file path"):
        engine.generate_image(name, out_format="tensor")


def test_a_fifo_input_is_refused_without_blocking(engine, tmp_path):
    fifo = tmp_path / "pipe.tif"
    os.mkfifo(fifo)
    with pytest.raises(RasterReadError, match="not a regular file"):
        engine.generate_image(str(fifo), out_format="tensor")


def test_a_geotiff_still_reads_and_its_sidecars_are_ignored(engine, tmp_path):
    data = np.arange(2 * 20 * 20, dtype=np.uint16).reshape(2, 20, 20)
    path = write_geotiff(tmp_path / "scene.tif", data)
    # a sidecar beside the input that would rename and re-describe its bands
    (tmp_path / "scene.tif.aux.xml").write_text(
        '<PAMDataset><PAMRasterBand band="1"><Description>EVIL</Description>'
        "</PAMRasterBand></PAMDataset>"
    )
    out = engine.generate_image(str(path), out_format="tensor")
    np.testing.assert_array_equal(out.outputs.tensor.numpy(), data.astype(np.float32))
    with open_raster(str(path)) as src:
        assert "EVIL" not in src.info.descriptions


def test_bait_works_when_gdal_is_let_loose(bait):
    """The bait itself: opening the VRT with GDAL's sniffing does touch what it names."""
    from rasterio.io import MemoryFile

    with MemoryFile(bait.vrt()) as mem, mem.open() as ds:
        secret = ds.read(2)
        with contextlib.suppress(Exception):
            ds.read(3)
    assert secret.tobytes()[:11] == b"TOP-SECRET-"
    assert bait.fifo.opened.wait(5)
    assert bait.listener.connections >= 1
