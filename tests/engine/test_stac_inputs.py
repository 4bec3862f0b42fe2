"""STAC Item inputs through the engine: the bands each model reads, dates, modalities, failures."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import rasterio
import torch
from torch import nn

from geoserve import Engine, RawReassembler, RequestSpec
from geoserve.errors import BandMismatchError, RasterReadError
from geoserve.processors.multimodal import Modality, MultimodalPatcher
from geoserve.raster.stac_item import StacItem
from tests.conftest import read, serve_ranges
from tests.multimodal_scenes import s2_array, write_s1, write_s2
from tests.stac_items import SCL_CLASSES, write_s1_item, write_s2_item

SIZE = 64


@pytest.fixture(scope="module")
def scenes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("stac")
    write_s2_item(root / "s2", SIZE)
    write_s1_item(root / "s1", SIZE)
    write_s2(root / "s2.tif", SIZE)
    write_s1(root / "s1.tif", SIZE)
    return root


@pytest.fixture(scope="module")
def identity() -> Engine:
    return Engine("identity", warmup=False)


def band(path: Path) -> np.ndarray:
    with rasterio.open(path) as src:
        return src.read(1)


def test_identity_reads_every_data_band_on_the_finest_grid(scenes, identity, tmp_path):
    out = identity.generate_image(
        str(scenes / "s2" / "s2_item.json"), output_path=tmp_path / "o.tif"
    )
    data, profile = read(out.outputs.path)
    with rasterio.open(tmp_path / "o.tif") as dst:
        descriptions = dst.descriptions
    assert descriptions == ("B02", "B03", "B04", "B08", "B8A", "B11", "B12", "scl")
    assert (profile["width"], profile["transform"].a) == (SIZE, 10.0)
    np.testing.assert_array_equal(data[:4], s2_array(SIZE).astype(np.float32))  # exact
    assert set(np.unique(data[7])) <= set(SCL_CLASSES)  # classes resampled by nearest
    assert not np.isnan(data).any()


def test_band_names_select_files_whatever_their_spelling(scenes, tmp_path):
    """ndwi-water reads B3 and B8: an Item names them B03 and B08, in files of their own.
    The water map equals the one from the same scene as one 4-band file."""
    engine = Engine("ndwi-water", warmup=False)
    from_item = engine.generate_image(
        str(scenes / "s2" / "s2_item.json"), output_path=tmp_path / "a.tif"
    )
    from_file = engine.generate_image(str(scenes / "s2.tif"), output_path=tmp_path / "b.tif")
    a, b = band(from_item.outputs.path), band(from_file.outputs.path)
    np.testing.assert_array_equal(a, b)
    assert 0.1 < (a == 1).mean() < 0.3  # the disc


def test_positional_bands_are_read_by_the_models_roles(scenes, tmp_path):
    """test-roles selects bands 0..5 and declares BLUE ... SWIR_2: from an Item it reads blue,
    green, red, nir08, swir16, swir22 (the 20 m ones resampled onto the 10 m grid)."""
    engine = Engine("test-roles", warmup=False)
    assert engine.in_proc.bands == (0, 1, 2, 3, 4, 5)
    out = engine.generate_image(str(scenes / "s2" / "s2_item.json"), output_path=tmp_path / "o.tif")
    data, _ = read(out.outputs.path)
    ten = s2_array(SIZE).astype(np.float32)
    np.testing.assert_array_equal(data[:3], ten[:3])  # blue, green, red; not nir (B08)
    from geoserve.raster.source import open_raster
    from geoserve.raster.stac_stack import open_item, wanted_bands

    def opener(href: str):
        return open_raster(href, "path")

    stac = StacItem.read(scenes / "s2" / "s2_item.json")
    with open_item(stac, wanted_bands(["B02", "B8A", "B11", "B12"]), opener) as stack:
        expected = stack.read_rows(0, SIZE, [1, 2, 3])  # (on B02's 10 m grid)
    np.testing.assert_array_equal(data[3:], expected)
    assert engine.in_proc.bands == (0, 1, 2, 3, 4, 5)  # the engine's own processor unchanged


def test_positional_bands_without_roles_ask_for_names(scenes, tmp_path):
    engine = Engine("test-three-for-six", warmup=False)
    item = str(scenes / "s2" / "s2_item.json")
    with pytest.raises(BandMismatchError) as err:
        engine.prepare_request(RequestSpec(item))
    assert f"{scenes / 's2' / 's2_item.json'}: the model selects bands by position" in str(
        err.value
    )
    assert "--bands" in str(err.value)
    req = engine.prepare_request(RequestSpec(item, bands=["red", "green", "blue"]))  # by name: fine
    assert req.ctx.band_names == ("red", "green", "blue")
    req.close()


def test_item_dates_reach_the_model_and_explicit_dates_win(scenes, tmp_path):
    second = json.loads((scenes / "s2" / "s2_item.json").read_text())
    second["properties"]["datetime"] = "2020-07-15T10:00:00Z"
    later = scenes / "s2" / "s2_item_later.json"
    later.write_text(json.dumps(second))
    engine = Engine("test-coords", warmup=False, bands=["green"])
    items = [str(scenes / "s2" / "s2_item.json"), str(later)]
    out = engine.generate_image([items], output_path=tmp_path)[0]
    data, _ = read(out.raise_for_error().outputs.path)
    np.testing.assert_array_equal(data[0], s2_array(SIZE)[1].astype(np.float32))
    assert [data[i, 0, 0] for i in (2, 3, 4, 5)] == [2020, 153, 2020, 197]  # 1 June, 15 July
    out = engine.generate_image([items], output_path=tmp_path / "b", dates=[["2021-01-02", None]])[
        0
    ]
    data, _ = read(out.raise_for_error().outputs.path)
    assert [data[i, 0, 0] for i in (2, 3, 4, 5)] == [2021, 2, 2020, 197]


class Echo(nn.Module):
    """Returns the s2 bands, then the s1 bands (zeros when absent)."""

    def forward(self, x: dict[str, torch.Tensor]) -> torch.Tensor:
        s2 = x["s2"]
        s1 = x.get("s1", torch.zeros_like(s2))
        return torch.cat([s2, s1], dim=1)


def test_modalities_as_items_equal_modalities_as_files(scenes, tmp_path, register_model):
    """A multimodal model given an S2 Item (band files, B03/B08) and an S1 Item (VV and VH
    files, EPSG:4326, partial cover) gives exactly what it gives for the same scenes as two
    stacked files: each file is warped onto the S2 grid once, from its own pixels."""
    proc = MultimodalPatcher(
        modalities=(
            Modality("s2", bands=("B3", "B8")),
            Modality("s1", bands=("VV", "VH"), required=False, fill=float("nan")),
        ),
        patch_size=32,
        blend="none",
    )
    name = register_model("test-stac-mm", Echo, proc, RawReassembler())
    engine = Engine(name, warmup=False)
    items = {"s2": str(scenes / "s2" / "s2_item.json"), "s1": str(scenes / "s1" / "s1_item.json")}
    files = {"s2": str(scenes / "s2.tif"), "s1": str(scenes / "s1.tif")}
    a = engine.generate_image(items, output_path=tmp_path / "a.tif")
    b = engine.generate_image(files, output_path=tmp_path / "b.tif")
    got, _ = read(a.outputs.path)
    want, _ = read(b.outputs.path)
    np.testing.assert_array_equal(got, want)
    assert np.isnan(got[2]).any()  # S1 covers part of the scene only
    assert not np.isnan(got[2]).all()


def test_a_dict_of_items_for_a_plain_model_stacks_their_bands(scenes, identity, tmp_path):
    items = {"s2": str(scenes / "s2" / "s2_item.json"), "s1": str(scenes / "s1" / "s1_item.json")}
    out = identity.generate_image(items, output_path=tmp_path / "o.tif")
    with rasterio.open(out.outputs.path) as dst:
        assert dst.count == 10
        assert dst.descriptions[-2:] == ("VV", "VH")


def test_a_bad_item_fails_alone_naming_item_asset_and_file(scenes, identity, tmp_path):
    broken = json.loads((scenes / "s2" / "s2_item.json").read_text())
    broken["assets"]["green"]["href"] = "gone/B03.tif"
    path = scenes / "s2" / "broken.json"
    path.write_text(json.dumps(broken))
    good, bad = identity.generate_image(
        [str(scenes / "s2" / "s2_item.json"), str(path)], output_path=tmp_path
    )
    assert good.ok
    assert isinstance(bad.error, RasterReadError)
    assert (
        str(bad.error)
        == f"{path}: asset 'green': {scenes / 's2' / 'gone' / 'B03.tif'}: no such file"
    )


def test_an_item_is_never_read_through_a_path_input(scenes, identity):
    """With data_format="path" a path string is a raster: an Item file is then just a JSON file,
    refused unread. (The server reads a client's Item itself, as a StacItem with its guards.)"""
    with pytest.raises(RasterReadError, match=r"not a readable raster \(the content is a JSON"):
        identity.prepare_request(
            RequestSpec(str(scenes / "s2" / "s2_item.json"), data_format="path")
        )


def test_an_item_url_is_read_in_place(scenes, identity, tmp_path):
    with serve_ranges(scenes / "s2") as (base, log):
        out = identity.generate_image(f"{base}/s2_item.json", output_path=tmp_path / "o.tif")
    data, _ = read(out.outputs.path)
    np.testing.assert_array_equal(data[:4], s2_array(SIZE).astype(np.float32))
    assert all(r is not None for m, p, r in log if m == "GET" and p.endswith(".tif"))


def test_cli_predict_takes_an_item(scenes, tmp_path):
    from geoserve.cli import main

    out = tmp_path / "water.tif"
    item = str(scenes / "s2" / "s2_item.json")
    assert main(["predict", item, "-o", str(out), "-m", "ndwi-water", "-q"]) == 0
    ref = tmp_path / "ref.tif"
    assert main(["predict", str(scenes / "s2.tif"), "-o", str(ref), "-m", "ndwi-water", "-q"]) == 0
    np.testing.assert_array_equal(band(out), band(ref))
    # --bands names the Item's bands; the default model (positional bands, with roles) runs too
    assert (
        main(
            [
                "predict",
                item,
                "-o",
                str(tmp_path / "b.tif"),
                "-m",
                "identity",
                "-q",
                "--bands",
                "B04,nir08",
            ]
        )
        == 0
    )
    with rasterio.open(tmp_path / "b.tif") as dst:
        assert dst.descriptions == ("B04", "nir08")
    assert main(["predict", item, "-o", str(tmp_path / "d.tif"), "-q"]) == 0
    assert band(tmp_path / "d.tif").dtype == np.uint8


def test_an_item_under_another_name_is_read_once_it_is_no_raster(scenes, identity, tmp_path):
    """Only a .json name is taken for an Item before opening; any other file is opened as a
    raster first (no extra read for ordinary inputs), and read as an Item if it is one."""
    item = scenes / "s2" / "s2_item.json"
    other = scenes / "s2" / "s2_item.stac"  # (beside it: its relative hrefs still resolve)
    other.write_bytes(item.read_bytes())
    want = identity.generate_image(str(item), out_format="tensor").outputs.tensor
    got = identity.generate_image(str(other), out_format="tensor").outputs.tensor
    assert torch.equal(got, want)
