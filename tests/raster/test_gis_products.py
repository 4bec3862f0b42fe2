"""Products as GIS users open them: QGIS 3.22 and GDAL 3.6 (Debian 12's), rasterio, sqlite.

The QGIS test runs ``tests/qgis_probe.py`` with the system Python that has QGIS's bindings
(``scripts/setup_gis.sh`` installs Debian's ``python3-qgis``; ``GEOSERVE_QGIS_PYTHON`` names
another); where there is none it is skipped, saying so.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pyogrio
import pytest
import rasterio

from geoserve import Engine
from geoserve.errors import ConfigError
from geoserve.processors.reassemblers import PALETTE
from tests.conftest import write_geotiff
from tests.system_python import imports
from tests.test_cli import run

QGIS_PYTHON = os.environ.get("GEOSERVE_QGIS_PYTHON", "/usr/bin/python3")
PROBE = Path(__file__).resolve().parents[1] / "qgis_probe.py"
NAMES = ["not water", "water"]  # ndwi-water's classes
COLOURS = [PALETTE[0], PALETTE[1]]  # ... and their colours (the default palette's first two)


@pytest.fixture
def water_scene(tmp_path: Path) -> Path:
    """B3, B8 bands, 80 x 100: water (B3 > B8) on the left, land on the right, and a nodata
    corner (the input declares nodata 0)."""
    b3 = np.full((80, 100), 400, np.uint16)
    b8 = np.full((80, 100), 200, np.uint16)
    b8[:, 50:] = 900  # land
    data = np.stack([b3, b8])
    data[:, :10, :10] = 0
    return write_geotiff(tmp_path / "lake.tif", data, nodata=0, descriptions=["B3", "B8"])


def _products(scene: Path, out: Path, **config: object) -> dict[str, Path]:
    out.mkdir(exist_ok=True)
    with Engine("ndwi-water", output_kind=["classes", "polygons"], **config) as engine:
        result = engine.generate_image(scene, output_path=out)
    return {kind: o.path for kind, o in result.outputs_by_kind.items()}


def _hex(rgb: tuple[int, int, int]) -> str:
    return "#{:02x}{:02x}{:02x}".format(*rgb)


@pytest.mark.skipif(
    not imports(QGIS_PYTHON, "qgis.core"), reason=f"no QGIS Python bindings for {QGIS_PYTHON}"
)
def test_qgis_shows_exactly_the_models_classes_nodata_transparent_and_opens_the_polygons(
    water_scene, tmp_path
):
    products = _products(water_scene, tmp_path / "out")
    pixels = ["5,5", "40,20", "40,80"]  # nodata, water, land
    probe = subprocess.run(
        [QGIS_PYTHON, str(PROBE), str(products["classes"]), str(products["polygons"]), *pixels],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "QT_QPA_PLATFORM": "offscreen"},
    )
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    assert found["valid"]
    assert found["renderer"] == "paletted"
    expected = [[i, n, _hex(c), 255] for i, (n, c) in enumerate(zip(NAMES, COLOURS, strict=True))]
    assert found["classes"] == expected  # not 256 entries (the classes, then black 2 ... 255)
    assert found["legend"] == [row[1:] for row in expected]
    assert found["nodata"] == 255
    assert found["drawn"]["5,5"][3] == 0  # nodata is transparent
    assert found["drawn"]["40,20"] == [*COLOURS[1], 255]
    assert found["drawn"]["40,80"] == [*COLOURS[0], 255]
    assert products["polygons"].suffix == ".gpkg"  # the default: QGIS 3.22 reads no Parquet
    assert found["polygons_valid"]
    assert found["polygons_features"] == 2
    assert "partially supported" not in probe.stderr  # GDAL 3.6's word for a GeoPackage 1.4
    assert "Warning" not in probe.stderr


def test_gdal_reads_one_colour_and_one_name_per_class(water_scene, tmp_path):
    """GDAL (so QGIS, rasterio, gdalinfo) reads the colour table and class names from the
    sidecar: exactly the classes. The file's own table, for tools that read it alone, is
    GeoTIFF's 256 entries, the nodata entry transparent."""
    classes = _products(water_scene, tmp_path / "out")["classes"]
    with rasterio.open(classes) as ds:
        assert ds.colormap(1) == {i: (*c, 255) for i, c in enumerate(COLOURS)}
        assert ds.nodata == 255
    sidecar = ET.parse(classes.with_name(classes.name + ".aux.xml")).getroot()
    assert [c.text for c in sidecar.iter("Category")] == NAMES
    alone = tmp_path / "alone.tif"  # the file without its sidecar
    alone.write_bytes(classes.read_bytes())
    with rasterio.open(alone) as ds:
        table = ds.colormap(1)
    assert len(table) == 256
    assert table[0] == (*COLOURS[0], 255)
    assert table[255][3] == 0


def test_class_maps_declare_nodata_whatever_the_input(tmp_path):
    """NoData = 255 on every class map (docs/outputs.md): one whose input has no nodata has
    no such pixel, unless the model returned NaN there, which is then nodata, drawn
    transparent and traced into no polygon, not a class 255."""
    plain = write_geotiff(
        tmp_path / "plain.tif", np.full((2, 40, 40), 300, np.uint16), descriptions=["B3", "B8"]
    )
    with Engine("ndwi-water") as engine:
        out = engine.generate_image(plain, output_path=tmp_path / "plain_classes.tif").outputs
    with rasterio.open(out.path) as ds:
        assert ds.nodata == 255
        assert ds.read_masks(1).all()  # no pixel of it is nodata
    data = np.full((1, 32, 32), 5, np.uint32)  # integers: no NaN in the input, no nodata
    data[0, :8, :8] = 500_000  # where test-nan's model returns NaN
    broken = write_geotiff(tmp_path / "broken.tif", data)
    with Engine("test-nan", output_kind=["classes", "polygons"]) as engine:
        result = engine.generate_image(broken, output_path=tmp_path / "nan")
    with rasterio.open(result.outputs_by_kind["classes"].path) as ds:
        assert ds.nodata == 255
        assert (ds.read(1)[:8, :8] == 255).all()
        assert not ds.read_masks(1)[:8, :8].any()
        assert ds.colormap(1)[1] == (*PALETTE[1], 255)
    _, _, _, (class_ids, _) = pyogrio.raw.read(result.outputs_by_kind["polygons"].path)
    assert class_ids.tolist() == [1]  # the NaN corner is no polygon of a "class_255"


def _gpkg_version(path: Path) -> tuple[int, int]:
    with sqlite3.connect(path) as db:
        (app,) = db.execute("PRAGMA application_id").fetchone()
        (version,) = db.execute("PRAGMA user_version").fetchone()
    return app, version


def test_polygons_default_to_geopackage_1_2_and_the_format_is_an_option(water_scene, tmp_path):
    """GeoPackage 1.2 (GDAL 3.6 warns on every open of 1.4, GDAL >= 3.7's default) by
    default, for files the engine names and for bytes answers; polygon_format picks another;
    a name's own suffix wins."""
    polygons = _products(water_scene, tmp_path / "a")["polygons"]
    assert polygons.name == "lake_polygons.gpkg"
    assert _gpkg_version(polygons) == (0x47504B47, 10200)  # "GPKG", 1.2.0
    assert pyogrio.read_info(polygons)["features"] == 2
    geojson = _products(water_scene, tmp_path / "b", polygon_format="geojson")["polygons"]
    assert geojson.name == "lake_polygons.geojson"
    assert pyogrio.read_info(geojson)["driver"] == "GeoJSON"
    with Engine("ndwi-water", output_kind="polygons", polygon_format="parquet") as engine:
        named = engine.generate_image(water_scene, output_path=tmp_path / "mine.gpkg").outputs
        answer = engine.generate_image(water_scene, out_format="bytes").outputs
    assert named.dtype == "gpkg"
    assert answer.dtype == "parquet"
    assert answer.data[:4] == b"PAR1"
    with Engine("ndwi-water", output_kind="polygons") as engine:
        answer = engine.generate_image(water_scene, out_format="bytes").outputs
    assert answer.dtype == "gpkg"
    assert answer.data[:16] == b"SQLite format 3\x00"
    assert not list(tmp_path.rglob(".*"))  # no temporary left


def test_a_geotiff_named_as_another_format_is_refused_pointing_to_quicklook(water_scene, tmp_path):
    with Engine("ndwi-water") as engine:
        for name in ("a.png", "a.jpg", "a.gpkg", "a.vrt"):
            with pytest.raises(ConfigError, match=rf"a\.{name[2:]}: classes is a GeoTIFF"):
                engine.generate_image(water_scene, output_path=tmp_path / name)
        with pytest.raises(ConfigError, match=r"--quicklook a\.png"):
            engine.generate_image(water_scene, output_path=tmp_path / "a.png")
        for name in ("b.tif", "b.TIFF", "b"):  # what a GeoTIFF may be called
            assert engine.generate_image(water_scene, output_path=tmp_path / name).ok
    assert not list(tmp_path.glob("a.*"))


def test_predict_refuses_a_png_output_in_one_line(water_scene, tmp_path):
    out = tmp_path / "a.png"
    res = run("predict", str(water_scene), "-m", "ndwi-water", "-o", str(out), "-q")
    assert res.returncode == 1
    assert f"{out}: classes is a GeoTIFF: name it .tif or .tiff, not .png" in res.stderr
    assert "--quicklook" in res.stderr
    assert "Traceback" not in res.stderr
    assert not out.exists()


def test_serve_creates_its_output_directory_as_predict_does(tmp_path, monkeypatch):
    from geoserve.cli.parser import build_parser
    from geoserve.cli.serve import server_settings

    monkeypatch.chdir(tmp_path)  # a fresh checkout: no out/ yet
    args = build_parser().parse_args(["serve", "--ui", "--output-dir", "out/"])
    assert server_settings(args).output_dir == Path("out")
    assert (tmp_path / "out").is_dir()
    (tmp_path / "taken").write_text("a file")
    args = build_parser().parse_args(["serve", "--output-dir", "taken"])
    with pytest.raises(ConfigError, match="output_dir: taken: not a directory"):
        server_settings(args)
    args = build_parser().parse_args(["serve", "--allowed-input-dirs", "gone"])
    with pytest.raises(ConfigError, match="allowed_input_dirs: gone: does not exist"):
        server_settings(args)
