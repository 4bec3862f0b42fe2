"""``RequestSpec``: one request as a value, normalised, checked against the model, stored as JSON.

The checks are those admission and the HTTP API made before a request was one value: the same
errors with the same messages, whichever front asks.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from pathlib import Path

import numpy as np
import pytest
import rasterio
import torch
from rasterio.windows import Window

from geoserve import Engine, RasterArray, RequestSpec
from geoserve.engine.async_engine import AsyncEngine
from geoserve.errors import ConfigError, InputError
from geoserve.raster.input_values import NamedBytes, RasterWindow
from geoserve.raster.stac_item import StacItem

ITEM = {
    "type": "Feature",
    "stac_version": "1.0.0",
    "id": "s2-scene",
    "geometry": None,
    "properties": {"datetime": "2021-05-01T10:00:00Z"},
    "assets": {"B04": {"href": "https://host/s2/B04.tif"}},
    "links": [],
}

SPECS = [
    RequestSpec(
        ["a.tif", Path("dir/b.tif")],
        request_id="r1",
        output_path="out/scene",
        out_format="b64",
        bands=[0, "B04"],
        output_kind="classes, confidence",
        priority=3,
        dates=["2020-01-01", dt.datetime(2020, 2, 1, 10, 30)],
    ),
    RequestSpec(NamedBytes(b"II*\x00 upload", "part/2021-05-01.tif"), data_format="bytes"),
    RequestSpec(b"\x00\x01raw", out_format="bytes", output_kind=["raw"]),
    RequestSpec("aGVsbG8=", data_format="b64", out_format="tensor"),
    RequestSpec(
        {"s2": StacItem(ITEM, "https://host/items/s2.json"), "s1": ["https://host/s1.tif"]},
        dates={"s1": ["2021-05-02"]},
    ),
    RequestSpec(RasterWindow("/vsicurl/https://host/scene.tif", Window(256, 512, 300, 200), "t")),
    RequestSpec("s2.tif", output_kind="lulc", seed=9, temperature=0.5, top_p=0.9, top_k=40),
]


@pytest.mark.parametrize("spec", SPECS, ids=range(len(SPECS)))
def test_normalised_is_canonical_and_idempotent(spec):
    once = spec.normalised()
    assert once.normalised() == once
    assert isinstance(once.inputs, list | dict)
    if isinstance(once.inputs, dict):
        assert all(isinstance(v, list) for v in once.inputs.values())
    assert once.output_kind is None or isinstance(once.output_kind, tuple)
    assert once.bands is None or isinstance(once.bands, tuple)


def test_normalised_matches_dates_to_the_inputs():
    spec = SPECS[0].normalised()
    assert spec.dates == [dt.date(2020, 1, 1), dt.date(2020, 2, 1)]
    assert spec.output_kind == ("classes", "confidence")
    assert spec.output_path == Path("out/scene")
    modal = SPECS[4].normalised()
    assert modal.dates == {"s1": [dt.date(2021, 5, 2)]}
    assert RequestSpec("one.tif", dates="2020-06-01").normalised().dates == [dt.date(2020, 6, 1)]


@pytest.mark.parametrize("spec", SPECS, ids=range(len(SPECS)))
def test_json_round_trip_is_equal(spec):
    stored = json.loads(json.dumps(spec.to_json()))  # plain JSON values only
    assert RequestSpec.from_json(stored) == spec.normalised()


def test_stored_inputs_keep_their_form():
    stored = SPECS[1].to_json()
    assert stored["inputs"] == [
        {"bytes": "SUkqACB1cGxvYWQ=", "name": "part/2021-05-01.tif"},
    ]
    back = RequestSpec.from_json(stored).inputs[0]
    assert back.data == b"II*\x00 upload"
    assert back.shown == "upload '2021-05-01.tif'"
    assert SPECS[0].to_json()["dates"] == ["2020-01-01", "2020-02-01"]


def test_patch_keys_are_runtime_only(tmp_path):
    keyed = RequestSpec("a.tif", patch_keys=object())  # type: ignore[arg-type]
    assert "patch_keys" not in keyed.to_json()
    assert RequestSpec.from_json(keyed.to_json()).patch_keys is None


def test_unstorable_inputs_are_refused_naming_the_field():
    arr = RasterArray(np.zeros((1, 4, 4), np.float32))
    with pytest.raises(InputError, match=r"^inputs\[1\]: a RasterArray cannot be stored"):
        RequestSpec(["a.tif", arr]).to_json()
    with pytest.raises(InputError, match=r"^inputs\['s1'\]\[0\]: a Tensor cannot be stored"):
        RequestSpec({"s2": "a.tif", "s1": torch.zeros(1, 4, 4)}).to_json()  # type: ignore[dict-item]


@pytest.mark.parametrize(
    ("stored", "message"),
    [
        ({"inputs": ["a.tif"], "steps": 1}, "unknown field 'steps'"),
        ({"inputs": ["a.tif"], "temperature": -1}, "temperature: should be greater than"),
        ({"inputs": ["a.tif"], "top_k": "many"}, "top_k"),
        ({"inputs": ["a.tif"], "seed": "1"}, "'seed' must be an integer"),
        ({"inputs": ["a.tif"], "seed": -1}, "'seed' must be from 0"),
        ({"output_path": "x"}, "no 'inputs'"),
        ({"inputs": "a.tif"}, "inputs must be a list"),
        ({"inputs": [{"bytes": "not base64!"}]}, r"inputs\[0\]: 'bytes' must be base64 text"),
        ({"inputs": [{"file": "a.tif"}]}, r"inputs\[0\] is not a stored input"),
        ({"inputs": ["a.tif"], "priority": True}, "'priority' must be an integer"),
        ({"inputs": ["a.tif"], "out_format": "png"}, "'out_format' must be one of"),
        ({"inputs": ["a.tif"], "bands": [0, None]}, "'bands' must be a list"),
        ({"inputs": ["a.tif"], "dates": ["May"]}, "dates: 'May' is not a date"),
    ],
)
def test_stored_specs_are_checked_as_untrusted(stored, message):
    with pytest.raises(InputError, match=message):
        RequestSpec.from_json(stored)


@pytest.fixture(scope="module")
def coords():
    with Engine("test-coords") as eng:
        yield eng


def test_check_refuses_a_bad_out_format_as_admission_did(coords):
    bad = RequestSpec("a.tif", out_format="png")  # type: ignore[arg-type]
    want = "invalid out_format 'png'; choose one of path, tensor, b64, bytes, xarray"
    with pytest.raises(ConfigError) as err:
        bad.check(coords)
    assert str(err.value) == want
    with pytest.raises(ConfigError) as err:
        coords.prepare_request(bad)
    assert str(err.value) == want


def test_check_refuses_kinds_the_model_does_not_offer(coords):
    with pytest.raises(ConfigError, match="invalid output kind 'nope'; choose one of"):
        RequestSpec("a.tif", output_kind=["nope"]).check(coords)
    offered = ", ".join(coords.kinds_offered())
    with pytest.raises(ConfigError) as err:
        RequestSpec("a.tif", output_kind="polygons").check(coords)
    assert str(err.value) == (
        f"model 'test-coords' cannot produce 'polygons' output; it offers {offered}"
    )


def test_check_counts_dates_against_the_model_up_front(coords):
    three = ["a.tif", "b.tif", "c.tif"]
    assert RequestSpec(three).check(coords).inputs == three  # (the engine's own words later)
    with pytest.raises(InputError) as err:
        RequestSpec(three, data_format="path").check(coords, upfront=True)
    assert str(err.value) == "data: 3 dates given; model 'test-coords' takes 2 dates"
    with pytest.raises(InputError) as err:
        RequestSpec(three, data_format="bytes").check(coords, upfront=True)
    assert str(err.value) == "file: 3 parts given; model 'test-coords' takes 2 dates"
    with pytest.raises(InputError) as err:
        RequestSpec(three[:2], dates=["2020-01-01"]).check(coords)
    assert str(err.value) == "dates: 1 date(s) given for 2 input(s); give one per input"


def test_check_bounds_a_request_of_modalities_up_front(coords):
    many = RequestSpec({"s2": ["a.tif"] * 40, "s1": ["b.tif"] * 25})
    with pytest.raises(InputError) as err:
        many.check(coords, upfront=True)
    assert str(err.value) == "data: 65 inputs given; at most 64"
    with pytest.raises(InputError, match="dates: no modality 's3' in the request"):
        RequestSpec({"s2": "a.tif"}, dates={"s3": ["2020-01-01"]}).check(coords)


def test_fronts_take_specs_only(coords):
    with pytest.raises(TypeError, match="takes a RequestSpec"):
        coords.prepare_request("a.tif")  # type: ignore[arg-type]
    ae = AsyncEngine(Engine("identity"))
    try:
        with pytest.raises(TypeError, match="submit takes a RequestSpec, not str"):
            asyncio.run(ae.submit("a.tif"))  # type: ignore[arg-type]
    finally:
        ae.close()


def _read(path):
    with rasterio.open(path) as src:
        return src.read()


def test_generate_image_bands_and_kinds_equal_the_configured_engine(make_geotiff, tmp_path):
    scene = make_geotiff(bands=13, height=80, width=96)
    bands, kinds = [0, 1, 2, 3, 4, 5], ["classes", "confidence"]
    for name in ("want", "got"):
        (tmp_path / name).mkdir()
    with Engine("demo-water", bands=bands, output_kind=kinds) as configured:
        want = configured.generate_image(scene, output_path=tmp_path / "want" / "s")
        want_conf = configured.generate_image(scene, out_format="tensor", output_kind="confidence")
    with Engine("demo-water") as engine:
        got = engine.generate_image(
            scene, output_path=tmp_path / "got" / "s", bands=bands, output_kind=kinds
        )
        plain = engine.generate_image(scene, output_path=tmp_path / "plain.tif")
        own = engine.generate_image(scene, out_format="tensor", output_kind="confidence")
        spec = RequestSpec(scene, out_format="tensor", bands=bands, output_kind="confidence")
        rid = engine.add_request(spec)
        (queued,) = list(engine.run_until_done())
    assert list(got.outputs_by_kind) == kinds == list(want.outputs_by_kind)
    for kind in kinds:
        a, b = want.outputs_by_kind[kind].path, got.outputs_by_kind[kind].path
        assert Path(b).name == f"s_{kind}.tif"
        assert np.array_equal(_read(a), _read(b))
    assert list(plain.outputs_by_kind) == ["classes"]  # the engine's own kinds, unchanged
    assert queued.request_id == rid
    assert queued.outputs.tensor.equal(want_conf.outputs.tensor)
    assert not own.outputs.tensor.equal(want_conf.outputs.tensor)  # the bands took effect
