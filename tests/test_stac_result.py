"""A STAC Item for every result: :mod:`geoserve.stac_result` and ``predict --stac-item``.

Items are built from real runs of ``demo-water`` on a corner of the bundled scene, read back
with pystac and validated offline against the core and extension schemas
(:mod:`tests.stac_validation`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pystac
import pytest
import rasterio
import shapely
from rasterio.warp import transform_bounds

from geoserve import Engine, RequestSpec
from geoserve.cli import main
from geoserve.errors import (
    ConfigError,
    NotGeoreferencedWarning,
    OutputWriteError,
    RasterReadError,
)
from geoserve.models.demo import weights_path
from geoserve.schemas import ImageRequestOutput
from geoserve.stac_result import model_info, request_options, result_item, weights_info, write_item
from tests.conftest import BUNDLED_SCENE, write_bundled_corner, write_geotiff
from tests.docs_shell import argv_of, doc_commands
from tests.stac_items import write_s2_item
from tests.stac_validation import validate_offline

ROOT = Path(__file__).resolve().parents[1]
DEMO_CLASSES = [("not_water", "not water", "E6E6DC"), ("water", "water", "1F78DC")]


@pytest.fixture(scope="module")
def engine():
    with Engine("demo-water", prefetch_rows=0) as eng:
        yield eng


@pytest.fixture(scope="module")
def scene(tmp_path_factory) -> Path:
    return write_bundled_corner(tmp_path_factory.mktemp("scene"), 96)


def item_of(result, engine, *, hrefs=None, inputs=("scene.tif",), **kwargs) -> pystac.Item:
    hrefs = hrefs or (lambda kind, out: Path(out.path).name)
    return result_item(
        result,
        model=model_info(engine),
        inputs=list(inputs),
        options=request_options(RequestSpec("scene.tif")),
        item_id="scene",
        hrefs=hrefs,
        **kwargs,
    )


def reread(item: pystac.Item, tmp_path: Path) -> dict:
    """The Item as a file holds it, read back (plain JSON: no NaN, no tuples)."""
    path = write_item(item, tmp_path / "item.json")
    text = path.read_text()
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in the Item"))
    validate_offline(data)
    return data


def test_a_class_map_item_describes_its_grid_classes_and_provenance(engine, scene, tmp_path):
    out = tmp_path / "water.tif"
    result = engine.generate_image(str(scene), output_path=out)
    data = reread(item_of(result, engine, hrefs={"classes": "water.tif"}), tmp_path)
    with rasterio.open(out) as ds:
        bounds = transform_bounds(ds.crs, "EPSG:4326", *ds.bounds, densify_pts=21)
        np.testing.assert_allclose(data["bbox"], bounds, rtol=0, atol=1e-9)
        footprint = shapely.geometry.shape(data["geometry"])
        assert footprint.is_valid
        assert footprint.exterior.is_ccw  # RFC 7946
        np.testing.assert_allclose(footprint.bounds, bounds, atol=1e-7)
        asset = data["assets"]["classes"]
        assert asset["href"] == "water.tif"
        assert asset["type"] == "image/tiff; application=geotiff"
        assert asset["roles"] == ["data", "classification"]
        assert asset["proj:code"] == f"EPSG:{ds.crs.to_epsg()}" == "EPSG:32633"
        assert asset["proj:shape"] == [ds.height, ds.width] == [96, 96]
        assert asset["proj:transform"] == list(ds.transform)[:6]
        assert asset["raster:bands"] == [
            {"data_type": "uint8", "nodata": 255, "spatial_resolution": 10.0}
        ]
        assert asset["file:size"] == out.stat().st_size
        digest = hashlib.sha256(out.read_bytes()).hexdigest()
        assert asset["file:checksum"] == "1220" + digest
        colormap = ds.colormap(1)
    classes = asset["classification:classes"]
    assert [(c["name"], c["title"], c["color_hint"]) for c in classes] == DEMO_CLASSES
    for c in classes:  # the colours are the file's colour table's
        assert (
            tuple(int(c["color_hint"][i : i + 2], 16) for i in (0, 2, 4))
            == colormap[c["value"]][:3]
        )
    props = data["properties"]
    weights = hashlib.sha256(weights_path().read_bytes()).hexdigest()
    assert props["geoserve:weights"] == {"file": "demo_water.safetensors", "sha256": weights}
    assert str(weights_path().parent) not in json.dumps(data)  # the file's name, not its folder
    assert props["geoserve:model"]["name"] == "demo-water"
    assert props["geoserve:model"]["architecture"] == "DemoWater"
    assert props["geoserve:model"]["tasks"] == ["semantic-segmentation"]
    assert props["geoserve:inputs"] == ["scene.tif"]
    assert props["geoserve:options"]["out_format"] == "path"
    assert "inputs" not in props["geoserve:options"]
    assert props["geoserve:patches"] == result.num_patches
    assert props["geoserve:seconds"] == round(result.timings.total, 3)
    assert props["processing:software"] == {"geoserve": "0.1.0"}
    assert props["processing:datetime"].endswith("Z")
    assert "demo-water" in props["processing:lineage"]


def test_several_kinds_one_asset_each_with_the_callers_hrefs(engine, scene, tmp_path):
    result = engine.generate_image(
        str(scene), output_path=tmp_path / "lake", output_kind=["classes", "confidence", "polygons"]
    )
    urls = {k: f"https://example.org/v1/jobs/7/results/{k}" for k in result.outputs_by_kind}
    data = reread(item_of(result, engine, hrefs=urls), tmp_path)
    assets = data["assets"]
    assert list(assets) == ["classes", "confidence", "polygons"]
    assert {k: a["href"] for k, a in assets.items()} == urls
    confidence = assets["confidence"]
    assert confidence["roles"] == ["data", "confidence"]
    with rasterio.open(tmp_path / "lake_confidence.tif") as ds:
        (band,) = confidence["raster:bands"]
        assert band["data_type"] == ds.dtypes[0] == "float32"
        assert band.get("nodata") == ("nan" if ds.nodata is not None else None)
    polygons = assets["polygons"]
    assert polygons["type"] == "application/geopackage+sqlite3"
    assert polygons["roles"] == ["data", "classification"]
    assert polygons["proj:code"] == "EPSG:32633"
    assert polygons["geoserve:features"] == result.outputs_by_kind["polygons"].count > 0
    assert "proj:shape" not in polygons  # a vector file has no grid
    named = [(c["name"], c["title"], c["color_hint"]) for c in polygons["classification:classes"]]
    assert named == DEMO_CLASSES
    assert "classification:classes" not in confidence


def test_polygons_alone_take_their_features_extent(engine, scene, tmp_path):
    out = tmp_path / "lake.parquet"
    result = engine.generate_image(str(scene), output_path=out, output_kind="polygons")
    data = reread(item_of(result, engine), tmp_path)
    asset = data["assets"]["polygons"]
    assert asset["type"] == "application/vnd.apache.parquet"
    assert asset["proj:code"] == "EPSG:32633"
    table = pq.read_table(out)
    left, bottom, right, top = shapely.total_bounds(shapely.from_wkb(table["geometry"]))
    wgs84 = transform_bounds("EPSG:32633", "EPSG:4326", left, bottom, right, top, densify_pts=21)
    np.testing.assert_allclose(data["bbox"], wgs84, atol=1e-9)


def test_an_ungeoreferenced_output_has_no_geometry(engine, tmp_path):
    with rasterio.open(ROOT / BUNDLED_SCENE) as src:
        pixels = src.read(window=((0, 64), (0, 64)))
    path = write_geotiff(tmp_path / "plain.tif", pixels, crs=None, transform=None)
    with pytest.warns(NotGeoreferencedWarning):
        result = engine.generate_image(str(path), output_path=tmp_path / "plain_water.tif")
    data = reread(item_of(result, engine), tmp_path)
    assert data["geometry"] is None
    assert "bbox" not in data
    asset = data["assets"]["classes"]
    assert asset["proj:code"] is None  # explicitly: no CRS
    assert asset["proj:shape"] == [64, 64]
    assert "proj:transform" not in asset
    assert "spatial_resolution" not in asset["raster:bands"][0]


def test_a_bytes_answer_is_described_from_its_bytes(engine, scene, tmp_path):
    result = engine.generate_image(str(scene), out_format="b64")
    raw = base64.b64decode(result.outputs.b64)
    data = reread(item_of(result, engine, hrefs={"classes": "answer.tif"}), tmp_path)
    asset = data["assets"]["classes"]
    assert asset["file:size"] == len(raw)
    assert asset["file:checksum"] == "1220" + hashlib.sha256(raw).hexdigest()
    assert asset["proj:shape"] == [96, 96]


def test_what_cannot_make_an_item_is_refused(engine, scene, tmp_path):
    failed = ImageRequestOutput("x", finished=True, error=RasterReadError("x.tif: no such file"))
    with pytest.raises(ConfigError, match="failed request"):
        item_of(failed, engine)
    result = engine.generate_image(str(scene), output_path=tmp_path / "w.tif")
    with pytest.raises(ConfigError, match=r"inputs\[1\]: a string is needed"):
        item_of(result, engine, inputs=["a.tif", Path("b.tif")])
    with pytest.raises(ConfigError, match="no href for the 'classes' asset"):
        item_of(result, engine, hrefs={"confidence": "c.tif"})
    with pytest.raises(ConfigError, match="options: plain JSON"):
        result_item(
            result,
            model=model_info(engine),
            inputs="scene.tif",
            options={"when": object()},
            item_id="w",
            hrefs={"classes": "w.tif"},
        )
    tensor = engine.generate_image(str(scene), out_format="tensor")
    with pytest.raises(OutputWriteError, match="describes files"):
        item_of(tensor, engine)


def test_weights_are_named_by_file_name_and_hashed(tmp_path):
    weights = tmp_path / "private" / "folder" / "model.pt"
    weights.parent.mkdir(parents=True)
    weights.write_bytes(b"weights")
    info = weights_info(weights)
    assert info is not None
    assert (info.file, info.sha256) == ("model.pt", hashlib.sha256(b"weights").hexdigest())
    assert "private" not in json.dumps(info.to_json())
    assert weights_info(None) is None  # a model without weights (ndwi-water)
    weights.write_bytes(b"retrained")  # a new version of the file: hashed again
    assert weights_info(weights).sha256 == hashlib.sha256(b"retrained").hexdigest()


def test_request_options_leave_out_inputs_paths_and_ids():
    spec = RequestSpec(
        ["a.tif", "b.tif"],
        request_id="secret-id",
        output_path="/srv/out/x.tif",
        bands=[1, 2],
        output_kind="classes,confidence",
        dates=["2020-06-01", None],
    )
    assert request_options(spec) == {
        "out_format": "path",
        "data_format": "auto",
        "bands": [1, 2],
        "output_kind": ["classes", "confidence"],
        "priority": 0,
        "seed": 0,
        "dates": ["2020-06-01", None],
    }


# -- the command line ----------------------------------------------------------------------------


@pytest.fixture
def workdir(tmp_path, monkeypatch, scene) -> Path:
    shutil.copy(scene, tmp_path / "scene.tif")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_predict_stac_item_writes_one_beside_each_output(workdir, capsys):
    shutil.copy("scene.tif", "other.tif")
    assert main(["predict", "scene.tif", "other.tif", "-o", "out/", "--stac-item"]) == 0
    assert "wrote out/scene_pred.json (STAC Item)" in capsys.readouterr().out
    for stem in ("scene", "other"):
        data = json.loads((workdir / "out" / f"{stem}_pred.json").read_text())
        validate_offline(data)
        assert data["id"] == f"{stem}_pred"
        assert data["assets"]["classes"]["href"] == f"{stem}_pred.tif"  # beside the Item
        assert data["properties"]["geoserve:inputs"] == [f"{stem}.tif"]  # as given
        item = pystac.Item.from_file(str(workdir / "out" / f"{stem}_pred.json"))
        assert Path(item.assets["classes"].get_absolute_href()) == (
            workdir / "out" / f"{stem}_pred.tif"
        )


def test_predict_stac_item_path_for_one_input(workdir):
    (workdir / "maps").mkdir()  # (items/ is created for the Item)
    argv = ["predict", "scene.tif", "-o", "maps/water", "--output-kind", "classes,confidence"]
    assert main([*argv, "--stac-item=items/water.json"]) == 0
    data = json.loads((workdir / "items" / "water.json").read_text())
    validate_offline(data)
    hrefs = {k: a["href"] for k, a in data["assets"].items()}
    assert hrefs == {
        "classes": "../maps/water_classes.tif",
        "confidence": "../maps/water_confidence.tif",
    }
    assert data["properties"]["geoserve:options"]["output_kind"] is None  # the engine's kinds


def test_predict_stac_item_refusals(workdir, capsys):
    shutil.copy("scene.tif", "other.tif")
    assert main(["predict", "scene.tif", "other.tif", "-o", "out/", "--stac-item=a.json"]) == 1
    assert "one Item names one request" in capsys.readouterr().err
    assert main(["predict", "scene.tif", "-o", "w.tif", "--stac-item=w.tif"]) == 1
    assert "must end in .json" in capsys.readouterr().err
    write_s2_item(workdir, 32, name="item.json")  # a STAC Item input: never replaced
    before = (workdir / "item.json").read_text()
    argv = ["predict", "item.json", "-o", "item.tif", "--model", "ndwi-water", "--stac-item"]
    assert main(argv) == 1
    assert "would replace the input item.json" in capsys.readouterr().err
    assert (workdir / "item.json").read_text() == before
    assert not (workdir / "item.tif").exists()


def test_outputs_md_stac_item_command(workdir):
    """docs/outputs.md's ``--stac-item`` line, as written, on the bundled scene's corner."""
    write_bundled_corner(workdir, 96)
    (command,) = [c for c in doc_commands("outputs.md") if "--stac-item" in c]
    assert main(argv_of(command)) == 0
    data = json.loads((workdir / "water.json").read_text())
    validate_offline(data)
    assert sorted(data["assets"]) == ["classes", "confidence", "polygons"]
    for asset in data["assets"].values():
        assert (workdir / asset["href"]).is_file()


def test_outputs_md_python_example(workdir):
    """docs/outputs.md's Python example of ``geoserve.stac_result``, run as written."""
    page = (ROOT / "docs" / "outputs.md").read_text()
    (code,) = [
        b for b in re.findall(r"^```python\n(.*?)^```", page, re.S | re.M) if "stac_result" in b
    ]
    exec(compile(code, "outputs.md", "exec"), {})
    data = json.loads((workdir / "water.json").read_text())
    validate_offline(data)
    assert data["assets"]["classes"]["href"] == "water.tif"
