"""``geoserve predict --output-kind A,B,...``: several products from one run, named per kind."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pyogrio
import rasterio

from tests.conftest import LAKE, write_geotiff
from tests.engine.test_output_kinds import checkerboard
from tests.test_cli import run

STEM = LAKE.stem


def test_several_kinds_into_a_directory_equal_single_kind_runs(tmp_path):
    out = tmp_path / "products"  # missing: created, since -o ends with /
    res = run(
        "predict",
        str(LAKE),
        "-o",
        f"{out}/",
        "--output-kind",
        "classes,confidence,polygons,embeddings",
        "--embedding-layer",
        "0",
        "--min-area",
        "4",
        "--prefetch-rows",
        "0",
    )
    assert res.returncode == 0, res.stderr
    classes, confidence = out / f"{STEM}_classes.tif", out / f"{STEM}_confidence.tif"
    polygons = out / f"{STEM}_polygons.gpkg"  # (GeoPackage: GDAL 3.6 and QGIS 3.22 open it)
    for path in (classes, confidence, polygons):
        assert f"wrote {path} (1536x768" in res.stdout
    assert "polygons, gpkg" in res.stdout
    single = tmp_path / "single.tif"
    res = run("predict", str(LAKE), "-o", str(single), "--prefetch-rows", "0", "-q")
    assert res.returncode == 0, res.stderr
    with rasterio.open(classes) as a, rasterio.open(single) as b, rasterio.open(LAKE) as src:
        np.testing.assert_array_equal(a.read(), b.read())
        assert (a.crs, a.transform) == (src.crs, src.transform)
    with rasterio.open(confidence) as c:
        assert (c.count, c.dtypes[0]) == (1, "float32")
        values = c.read(1)
        assert np.nanmin(values) >= 0.5
        assert np.nanmax(values) <= 1.0
    with rasterio.open(out / f"{STEM}_embeddings.tif") as e, rasterio.open(LAKE) as src:
        assert (e.count, e.width, e.height) == (128, 96, 48)  # 16-pixel tokens
        assert e.transform == src.transform @ rasterio.Affine.scale(16)
        assert e.tags()["EMBEDDING_LAYER"] == "0"
    _, _, _, (_, class_names) = pyogrio.raw.read(polygons)
    assert len(class_names) > 0
    assert set(class_names.tolist()) == {"not water", "water"}


def test_several_kinds_to_a_stem(tmp_path):
    res = run("predict", str(LAKE), "-o", str(tmp_path / "lake"), "--output-kind", "classes")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "lake").is_file()  # one kind: -o is the file, as always
    res = run(
        "predict", str(LAKE), "-o", str(tmp_path / "lake.tif"), "--output-kind", "raw,classes"
    )
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "lake_raw.tif").is_file()
    assert (tmp_path / "lake_classes.tif").is_file()


def test_a_kind_the_model_cannot_make_is_one_line(tmp_path):
    res = run(
        "predict",
        str(LAKE),
        "-o",
        str(tmp_path / "x.tif"),
        "--model",
        "identity",
        "--output-kind",
        "raw,polygons",
    )
    assert res.returncode == 1
    assert "model 'identity'" in res.stderr
    assert "cannot produce 'polygons'" in res.stderr
    assert "offers raw" in res.stderr
    assert "Traceback" not in res.stderr
    res = run("predict", str(LAKE), "-o", str(tmp_path / "x.tif"), "--output-kind", "sky")
    assert res.returncode == 2
    assert "sky" in res.stderr


def test_models_lists_output_kinds():
    res = run("models")
    assert res.returncode == 0, res.stderr
    assert "output kinds (--output-kind" in res.stdout
    assert "classes, probabilities, confidence, raw, polygons:" in res.stdout  # ndwi-water
    # models with a token grid offer the embeddings kinds too
    line = "classes, probabilities, confidence, raw, polygons, embeddings, patch-embeddings:"
    assert line in res.stdout


def test_a_checkerboard_is_refused_at_the_vertex_bound_in_one_line(tmp_path):
    """The bound applies on the command line too: one line naming it, no file written; with
    a higher bound given by its flag the same map is traced."""
    board = write_geotiff(tmp_path / "board.tif", checkerboard(120), descriptions=["B3", "B8"])
    out = tmp_path / "out"
    args = ("predict", str(board), "-m", "ndwi-water", "--output-kind", "classes,polygons")
    res = run(*args, "-o", f"{out}/")
    assert res.returncode == 1
    assert "polygons output too complex" in res.stderr
    assert "over the bound of 50,000 for a 120x120 class map" in res.stderr
    assert "--max-polygon-vertices-per-pixel" in res.stderr
    assert "Traceback" not in res.stderr
    assert not list(out.iterdir())  # nor its class map: all or nothing
    bound = ("--max-polygon-vertices-per-pixel", "6", "--polygon-format", "parquet")
    res = run(*args, "-o", f"{out}/", *bound, "-q")
    assert res.returncode == 0, res.stderr
    assert pq.read_table(out / "board_polygons.parquet").num_rows == 2
