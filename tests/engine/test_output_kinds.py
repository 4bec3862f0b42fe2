"""Several output kinds from one model pass: each equal to its own run, each checked by hand."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pyogrio
import pytest
import rasterio
import shapely
import torch

from geoserve import Engine, RequestSpec
from geoserve.errors import ConfigError, GeoServeError, OutputWriteError
from tests.conftest import read, write_geotiff

NODATA = 0


@pytest.fixture
def scene(make_geotiff) -> Path:
    """A 3-band uint16 scene, 70 x 90, with a nodata corner and a nodata value declared."""
    rng = np.random.default_rng(5)
    data = rng.integers(1, 600, size=(3, 70, 90)).astype("uint16")
    data[:, :20, :25] = NODATA
    return make_geotiff(data=data, nodata=NODATA, name="scene.tif")


#: Rows read in turn, not ahead: the same batches in every run (a CPU convolution may round
#: differently at another batch size, and reads ahead make batches follow timing).
SAME_BATCHES = {"max_batch_patches": 3, "prefetch": False}


def _alone(scene: Path, kind: str, tmp_path: Path) -> np.ndarray:
    with Engine("test-seg", output_kind=kind, **SAME_BATCHES) as engine:
        out = engine.generate_image(scene, output_path=tmp_path / f"alone_{kind}.tif")
    return read(out.outputs.path)[0]


def test_several_kinds_equal_their_single_kind_runs_bit_for_bit(scene, tmp_path):
    kinds = ["classes", "probabilities", "confidence", "raw"]
    (tmp_path / "many").mkdir()
    with Engine("test-seg", output_kind=kinds, **SAME_BATCHES) as engine:
        result = engine.generate_image(scene, output_path=tmp_path / "many" / "scene")
    assert list(result.outputs_by_kind) == kinds
    assert result.outputs is result.outputs_by_kind["classes"]  # the first kind's, as before
    for kind in kinds:
        out = result.outputs_by_kind[kind]
        assert out.kind == kind
        assert out.path == tmp_path / "many" / f"scene_{kind}.tif"
        together, profile = read(out.path)
        np.testing.assert_array_equal(together, _alone(scene, kind, tmp_path))
        with rasterio.open(scene) as src:  # georeferencing unchanged
            assert profile["transform"] == src.transform
            assert profile["crs"] == src.crs


def test_confidence_is_the_largest_softmax_value_nan_on_nodata(scene, tmp_path):
    with Engine("test-seg", output_kind="raw,confidence,classes") as engine:
        result = engine.generate_image(scene, output_path=tmp_path / "s")
    logits = read(result.outputs_by_kind["raw"].path)[0].astype(np.float64)
    confidence, profile = read(result.outputs_by_kind["confidence"].path)
    classes = read(result.outputs_by_kind["classes"].path)[0][0]
    e = np.exp(logits - logits.max(axis=0))
    by_hand = (e / e.sum(axis=0)).max(axis=0)
    assert confidence.dtype == np.float32
    assert confidence.shape == (1, 70, 90)
    nodata = np.isnan(by_hand)
    assert nodata[:20, :25].all()
    assert not nodata[20:].any()
    np.testing.assert_array_equal(np.isnan(confidence[0]), nodata)
    np.testing.assert_allclose(confidence[0][~nodata], by_hand[~nodata], rtol=1e-6)
    assert np.isnan(profile["nodata"])
    assert (confidence[0][~nodata] >= 0.25).all()  # 4 classes: the winner has at least 1/4
    # the winner's probability is the class map's class
    np.testing.assert_array_equal(classes[~nodata], logits.argmax(axis=0)[~nodata])


def test_one_forward_per_patch_whatever_the_kinds(scene, tmp_path, spy_model):
    counts = []
    for kinds in (["classes"], ["classes", "confidence", "probabilities", "polygons"]):
        name, seen = spy_model("test-seg")
        with Engine(name, output_kind=kinds, max_batch_patches=4) as engine:
            seen.clear()  # (the warm-up pass)
            result = engine.generate_image(scene, output_path=tmp_path / "-".join(kinds))
        counts.append(sum(len(x) for x in seen))
        assert counts[-1] == result.num_patches
    assert counts[0] == counts[1] > 0


def _pixel_area(path: Path) -> float:
    with rasterio.open(path) as src:
        return abs(src.transform.a * src.transform.e)


def test_polygons_cover_each_class_exactly(scene, tmp_path):
    (tmp_path / "out").mkdir()
    kinds = ["classes", "polygons"]
    with Engine("test-seg", output_kind=kinds, polygon_format="parquet") as engine:
        result = engine.generate_image(scene, output_path=tmp_path / "out" / "scene")
    poly = result.outputs_by_kind["polygons"]
    assert poly.path == tmp_path / "out" / "scene_polygons.parquet"
    assert poly.dtype == "parquet"
    classes = read(result.outputs_by_kind["classes"].path)[0][0]
    table = pq.read_table(poly.path)
    assert table.num_rows == poly.count > 0
    assert table.schema.field("class_id").type == "int32"
    geoms = shapely.from_wkb(table["geometry"].to_numpy(zero_copy_only=False))
    area: Counter[int] = Counter()
    for cid, geom in zip(table["class_id"].to_pylist(), geoms, strict=True):
        assert geom.geom_type in ("Polygon", "MultiPolygon")
        assert geom.is_valid
        area[cid] += geom.area
    pixel = _pixel_area(scene)
    ids, counts = np.unique(classes[classes != 255], return_counts=True)
    assert dict(area) == {int(i): float(c) * pixel for i, c in zip(ids, counts, strict=True)}
    assert 255 not in area  # nodata makes no polygon
    names = dict(zip(table["class_id"].to_pylist(), table["class_name"].to_pylist(), strict=True))
    assert all(names[i] == "abcd"[i] for i in names)
    geo = json.loads(table.schema.metadata[b"geo"])
    assert geo["version"] == "1.1.0"
    assert geo["primary_column"] == "geometry"
    column = geo["columns"]["geometry"]
    assert column["encoding"] == "WKB"
    assert column["geometry_types"] == ["Polygon", "MultiPolygon"]
    assert rasterio.crs.CRS.from_user_input(json.dumps(column["crs"])).to_epsg() == 32633
    # every polygon lies inside the scene's bounds
    with rasterio.open(scene) as src:
        bounds = shapely.box(*src.bounds)
    assert all(bounds.covers(g) for g in geoms)


@pytest.mark.parametrize(("suffix", "driver"), [(".geojson", "GeoJSON"), (".gpkg", "GPKG")])
def test_polygons_alone_by_the_outputs_extension(scene, tmp_path, suffix, driver):
    target = tmp_path / f"regions{suffix}"
    with Engine("test-seg", output_kind="polygons") as engine:
        result = engine.generate_image(scene, output_path=target)
    assert result.outputs.path == target
    assert result.outputs.kind == "polygons"
    info = pyogrio.read_info(target)
    assert info["driver"] == driver
    assert info["features"] == result.outputs.count > 0
    assert list(info["fields"]) == ["class_id", "class_name"]
    meta, _, geometry, fields = pyogrio.raw.read(target)
    classes = _alone(scene, "classes", tmp_path)[0]
    area: Counter[int] = Counter()
    for cid, wkb in zip(fields[0], geometry, strict=True):
        area[int(cid)] += shapely.from_wkb(wkb).area
    pixel = _pixel_area(scene)
    ids, counts = np.unique(classes[classes != 255], return_counts=True)
    expected = {int(i): float(c) * pixel for i, c in zip(ids, counts, strict=True)}
    assert area.keys() == expected.keys()
    for k, v in expected.items():  # (GeoJSON writes coordinates as decimal text)
        assert area[k] == pytest.approx(v, rel=1e-9)
    assert rasterio.crs.CRS.from_user_input(meta["crs"]).to_epsg() == 32633


def test_min_area_drops_small_polygons(scene, tmp_path):
    counts = {}
    for min_area in (0, 5):
        with Engine("test-seg", output_kind="polygons", min_area=min_area) as engine:
            out = engine.generate_image(scene, output_path=tmp_path / f"m{min_area}.parquet")
        table = pq.read_table(out.outputs.path)
        geoms = shapely.from_wkb(table["geometry"].to_numpy(zero_copy_only=False))
        pixels = shapely.area(geoms) / _pixel_area(scene)
        counts[min_area] = len(pixels)
        if min_area:
            assert (pixels >= min_area).all()
    assert 0 < counts[5] < counts[0]


def test_bytes_and_base64_outputs_of_several_kinds(scene, tmp_path):
    (tmp_path / "d").mkdir()
    kinds = ["confidence", "polygons"]
    with Engine("test-seg", output_kind=kinds, polygon_format="parquet") as engine:
        on_disk = engine.generate_image(scene, output_path=tmp_path / "d" / "s")
        in_memory = engine.generate_image(scene, out_format="bytes")
        tensors = engine.add_request(scene, out_format="tensor")
        (failed,) = engine.run_until_done()
    assert failed.request_id == tensors
    assert "tensor" in str(failed.error)
    conf = in_memory.outputs_by_kind["confidence"]
    with rasterio.MemoryFile(conf.data) as mem, mem.open() as src:
        np.testing.assert_array_equal(
            src.read(), read(on_disk.outputs_by_kind["confidence"].path)[0]
        )
    polygons = tmp_path / "p.parquet"
    polygons.write_bytes(in_memory.outputs_by_kind["polygons"].data)
    assert pq.read_table(polygons).equals(pq.read_table(on_disk.outputs_by_kind["polygons"].path))


def test_a_list_of_inputs_names_each_kind_after_its_input(make_geotiff, tmp_path):
    a, b = make_geotiff(name="north.tif"), make_geotiff(name="south.tif")
    with Engine("test-seg", output_kind=["classes", "polygons"]) as engine:
        results = engine.generate_image([a, b], output_path=tmp_path / "out")
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == [
        "north_classes.tif",
        "north_classes.tif.aux.xml",  # (its class names, for GIS tools)
        "north_polygons.gpkg",
        "south_classes.tif",
        "south_classes.tif.aux.xml",
        "south_polygons.gpkg",
    ]
    assert all(r.ok for r in results)
    with Engine("test-seg", output_kind="polygons") as engine:  # one kind: today's names
        (one,) = engine.generate_image([a], output_path=tmp_path / "one")
    assert one.outputs.path == tmp_path / "one" / "north_pred.gpkg"


def test_kinds_a_model_cannot_produce_are_refused_naming_what_it_offers(scene, tmp_path):
    with pytest.raises(ConfigError, match=r"'identity'.*cannot produce 'confidence'.*offers raw"):
        Engine("identity", output_kind=["raw", "confidence"])
    with pytest.raises(ConfigError, match="classes asked for more than once"):
        Engine("test-seg", output_kind="classes,classes")
    with Engine("test-seg", output_kind="polygons") as engine:
        with pytest.raises(ConfigError, match=r"scene\.tif.*\.parquet, .*\.gpkg"):
            engine.generate_image(scene, output_path=tmp_path / "scene.tif")
        with pytest.raises(ConfigError, match="cannot produce 'embeddings'|invalid output kind"):
            engine.prepare_request(RequestSpec(scene, output_kind=["classes", "embeddings"]))
    assert not list(tmp_path.glob("*.tif.*"))
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_failed_kind_leaves_no_output_of_any_kind(scene, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "scene_polygons.gpkg").mkdir()  # the polygons' name is taken by a directory
    with Engine("test-seg", output_kind=["classes", "confidence", "polygons"]) as engine:
        (result,) = engine.generate_image([scene], output_path=out)
    assert result.error is not None
    assert "scene_polygons.gpkg" in str(result.error)
    assert sorted(p.name for p in out.iterdir()) == ["scene_polygons.gpkg"]


def test_transform_and_warm_up_work_with_a_vector_kind(scene):
    with Engine("test-seg", output_kind="polygons") as engine:
        (out,) = engine.transform([torch.zeros(3, 20, 20)])
    assert out.ok
    assert out.tensors is not None
    assert out.tensors.shape == (4, 20, 20)


def test_one_input_into_a_directory_is_named_after_the_input(scene, tmp_path):
    (tmp_path / "here").mkdir()
    with Engine("test-seg", output_kind=["classes", "confidence"]) as engine:
        into_dir = engine.generate_image(scene, output_path=tmp_path / "here")
        new_dir = engine.generate_image(scene, output_path=f"{tmp_path / 'new'}/")
    assert into_dir.outputs_by_kind["confidence"].path == tmp_path / "here" / "scene_confidence.tif"
    assert new_dir.outputs_by_kind["classes"].path == tmp_path / "new" / "scene_classes.tif"


def test_a_token_kind_first_leaves_every_kind_available(make_geotiff, tmp_path):
    src = make_geotiff(bands=13, height=64, width=64)
    with Engine("demo-water", output_kind=["embeddings", "classes"]) as engine:
        result = engine.generate_image(src, output_path=tmp_path / "e")
        assert list(result.outputs_by_kind) == ["embeddings", "classes"]
        assert (
            engine.prepare_request(RequestSpec(src, output_kind=["confidence"])).out_proc.kind
            == "confidence"
        )


def test_requests_with_and_without_tokens_share_batches_cleanly(make_geotiff, caplog):
    a, b = (
        make_geotiff(bands=13, height=300, width=300),
        make_geotiff(bands=13, height=300, width=300),
    )
    with Engine("demo-water", max_batch_patches=16) as engine:
        plain = engine.prepare_request(RequestSpec(a, output_kind=["classes"], out_format="tensor"))
        tokens = engine.prepare_request(
            RequestSpec(b, output_kind=["classes", "embeddings"], out_format="bytes")
        )
        engine.admit(plain)
        engine.admit(tokens)
        with caplog.at_level("WARNING"):
            results = list(engine.run_until_done())
    assert all(r.ok for r in results)
    assert not [r for r in caplog.records if "retrying" in r.getMessage()]


def test_a_failed_kind_puts_back_the_files_it_would_have_replaced(scene, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "st_classes.tif").write_bytes(b"an earlier run's map")
    (out / "st_polygons.gpkg").mkdir()  # this kind cannot be written
    engine = Engine("test-seg", output_kind=["classes", "polygons"])
    with engine, pytest.raises(OutputWriteError, match="st_polygons.gpkg"):
        engine.generate_image(scene, output_path=out / "st")
    assert (out / "st_classes.tif").read_bytes() == b"an earlier run's map"
    assert sorted(p.name for p in out.iterdir()) == ["st_classes.tif", "st_polygons.gpkg"]


def test_output_suffixes_choose_the_polygons_format_and_raster_names_are_checked(scene, tmp_path):
    with Engine("test-seg", output_kind=["classes", "polygons"]) as engine:
        result = engine.generate_image(scene, output_path=tmp_path / "regions.geojson")
    assert result.outputs_by_kind["polygons"].path == tmp_path / "regions_polygons.geojson"
    assert result.outputs_by_kind["polygons"].dtype == "geojson"
    assert result.outputs_by_kind["classes"].path == tmp_path / "regions_classes.tif"
    engine = Engine("test-seg", output_kind="confidence")
    with engine, pytest.raises(ConfigError, match=r"x\.parquet: confidence is a GeoTIFF"):
        engine.generate_image(scene, output_path=tmp_path / "x.parquet")


def checkerboard(n: int) -> np.ndarray:
    """B3, B8 bands of an n x n scene whose ndwi-water class map is a 1-pixel checkerboard.

    Its polygons: one 8-connected region per class, a MultiPolygon of n² / 2 squares, about
    5 vertices per pixel in all.
    """
    data = np.full((2, n, n), 1000, dtype="uint16")
    cells = (np.add.outer(np.arange(n), np.arange(n)) % 2).astype(bool)
    data[0][cells], data[1][cells] = 3000, 500  # B3 > B8: water on every other pixel
    return data


def checkered_tiles(tiles: int, tile: int, apart: int = 2) -> np.ndarray:
    """``tiles`` x ``tiles`` checkerboards of ``tile`` pixels, ``apart`` nodata (0) pixels apart.

    Many regions of a few thousand vertices each: slow to trace in all, every polygon quick.
    """
    size = tiles * (tile + apart)
    data = checkerboard(size)
    gap = np.arange(size) % (tile + apart) >= tile
    data[:, gap, :] = 0
    data[:, :, gap] = 0
    return data


def test_a_checkerboard_fails_alone_at_the_vertex_bound_before_it_is_all_traced(tmp_path):
    """The polygons' vertices are counted as they come: the request fails at the bound
    (naming the count, the bound and the options), without tracing the rest of the map; the
    other request of the same run is written, and the failed one leaves no file."""
    n = 160  # two regions of about 64,000 vertices: the first one is over the 50,000
    checker = write_geotiff(tmp_path / "checker.tif", checkerboard(n), descriptions=["B3", "B8"])
    small = write_geotiff(tmp_path / "small.tif", checkerboard(8), descriptions=["B3", "B8"])
    with Engine("ndwi-water", output_kind=["classes", "polygons"]) as engine:
        bad, good = engine.generate_image([checker, small], output_path=tmp_path / "out")
    assert good.error is None
    assert good.outputs_by_kind["polygons"].count == 2
    assert type(bad.error).__name__ == "OutputTooComplexError", bad.error
    message = str(bad.error)
    assert "checker_polygons.gpkg: polygons output too complex" in message
    assert "over the bound of 50,000 for a 160x160 class map" in message
    assert "--max-polygon-vertices-per-pixel" in message
    assert "--min-area" in message
    traced = int(re.search(r"([\d,]+) vertices traced", message)[1].replace(",", ""))
    assert 50_000 < traced < 4 * n * n  # the first region only, not the map's 5 per pixel
    out = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert out == ["small_classes.tif", "small_classes.tif.aux.xml", "small_polygons.gpkg"]


def test_one_region_too_large_to_repair_fails_before_it_is_repaired(tmp_path):
    """A 240 x 240 checkerboard in a 720 x 720 map: two regions of about 144,000 vertices,
    under the map's bound of 518,400, but each touches itself and its repair (which cannot be
    interrupted) would take half a minute: the request fails at the first, naming its size."""
    data = np.full((2, 720, 720), 1000, dtype="uint16")
    data[:, :240, :240] = checkerboard(240)
    path = write_geotiff(tmp_path / "board.tif", data, descriptions=["B3", "B8"])
    engine = Engine("ndwi-water", output_kind="polygons")
    with engine, pytest.raises(GeoServeError, match=r"vertices needs repair .* over the 100,000"):
        engine.generate_image(path, output_path=tmp_path / "out.gpkg")
    assert not list(tmp_path.glob("out*"))
    assert not list(tmp_path.glob(".*"))


def test_the_vertex_bound_counts_the_polygons_kept_and_can_be_switched_off(tmp_path):
    """A speckled map (thousands of 2-pixel regions) is over the bound, but the bound counts
    only the polygons kept: with --min-area they are dropped and it is traced; with the
    bound off (0) a checkerboard is traced whole."""
    specks = checkered_tiles(56, 2)  # 3,136 tiles of two diagonal 2-pixel regions each
    path = write_geotiff(tmp_path / "specks.tif", specks, nodata=0, descriptions=["B3", "B8"])
    engine = Engine("ndwi-water", output_kind="polygons")
    with engine, pytest.raises(GeoServeError, match="polygons output too complex"):
        engine.generate_image(path, output_path=tmp_path / "specks.parquet")
    with Engine("ndwi-water", output_kind="polygons", min_area=3) as engine:
        out = engine.generate_image(path, output_path=tmp_path / "specks.parquet").outputs
    assert out.count == 0
    checker = write_geotiff(tmp_path / "checker.tif", checkerboard(120), descriptions=["B3", "B8"])
    with Engine("ndwi-water", output_kind="polygons", max_polygon_vertices_per_pixel=0) as e:
        out = e.generate_image(checker, output_path=tmp_path / "checker.parquet").outputs
    assert out.count == 2
    table = pq.read_table(out.path)
    geoms = shapely.from_wkb(table["geometry"].to_numpy(zero_copy_only=False))
    assert shapely.get_num_coordinates(geoms).sum() > 50_000  # over the bound it switched off
    assert e.config.max_polygon_vertices_per_pixel is None
    assert not list(tmp_path.glob(".*"))  # no temporary left by the failed one


def test_a_slow_commit_holds_up_no_other_request(tmp_path):
    """Tracing a pathological map (a checkerboard: one 8-connected region per class, a
    MultiPolygon of thousands of parts) takes seconds; a small request behind it is done
    first, and aborting the slow one while it commits leaves none of its files."""
    data = checkerboard(100)
    slow = write_geotiff(tmp_path / "checker.tif", data, descriptions=["B3", "B8"])
    small = write_geotiff(tmp_path / "small.tif", data[:, :8, :8], descriptions=["B3", "B8"])
    kinds = ["classes", "polygons"]
    with Engine("ndwi-water", output_kind=kinds, max_polygon_vertices_per_pixel=0) as engine:
        engine.admit(engine.prepare_request(RequestSpec(slow, "slow", tmp_path / "slow")))
        engine.admit(engine.prepare_request(RequestSpec(small, "small", tmp_path / "s")))
        order = [r.request_id for r in engine.run_until_done()]
        assert order == ["small", "slow"]
        engine.admit(engine.prepare_request(RequestSpec(slow, "x", tmp_path / "gone")))
        while not engine.committing:  # until it is being committed
            engine.step()
        assert engine.abort_request("x")
        assert [r.request_id for r in engine.run_until_done()] == []
    assert not list(tmp_path.glob("gone*"))
    assert not list(tmp_path.glob(".gone*"))
