"""``s1s2-water``: the fusion rule through the engine, against the rule evaluated by hand."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rasterio
import torch
from rasterio.enums import Resampling
from rasterio.warp import calculate_default_transform, reproject

from geoserve import Engine
from geoserve.errors import ConfigError, InputError
from geoserve.models.fusion import S1S2Patcher, S1S2Water
from tests.conftest import FLOOD, FLOOD_LABEL, SHARED_DATA, needs_shared, processors_of
from tests.multimodal_scenes import write_s1, write_s2

SIZE = 256
FLOOD_S1 = SHARED_DATA / "Spain_7370579_S1Hand.tif"
NODATA = 255  # the class map's nodata
WEIGHTS = Path(__file__).resolve().parents[2] / "src" / "geoserve" / "models" / "weights"
#: Two S2 blocks masked as cloud (rows, cols): inside the S1 footprint (the upper-left 60%,
#: over the disc's edge, so both classes come from S1) and outside it.
UNDER_S1 = (slice(70, 140), slice(50, 130))
OUTSIDE_S1 = (slice(180, 240), slice(170, 250))


@pytest.fixture(scope="module")
def engine() -> Any:
    eng = Engine("s1s2-water")
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The synthetic S2 (256 px) and S1 scenes, an S2 with two blocks masked, S1 in linear."""
    d = tmp_path_factory.mktemp("s1s2")
    s2, s1 = write_s2(d / "s2.tif", SIZE), write_s1(d / "s1.tif", SIZE)
    with rasterio.open(s2) as src:
        data, profile, names = src.read(), src.profile, src.descriptions
    for rows, cols in (UNDER_S1, OUTSIDE_S1):
        data[:, rows, cols] = 0
    with rasterio.open(d / "s2_masked.tif", "w", **profile) as dst:
        dst.write(data)
        dst.descriptions = names
    return {
        "s2": s2,
        "s1": s1,
        "s2_masked": d / "s2_masked.tif",
        "s1_linear": rewrite_s1(s1, d / "s1_linear.tif", linear=True, units="linear"),
        "s1_linear_tagged_db": rewrite_s1(s1, d / "s1_lin_db.tif", linear=True, units="dB"),
    }


def rewrite_s1(s1: Path, dest: Path, *, linear: bool, units: str) -> Path:
    """``s1`` (dB) as linear power 10 ** (dB / 10) when ``linear``, tagged ``UNITS=units``."""
    with rasterio.open(s1) as src:
        data, profile, names = src.read(), src.profile, src.descriptions
    if linear:
        data = (10 ** (data.astype(np.float64) / 10)).astype(np.float32)
    with rasterio.open(dest, "w", **profile) as dst:
        dst.write(data)
        dst.descriptions = names
        dst.update_tags(UNITS=units)
    return dest


def run(engine: Any, request: dict[str, Path]) -> np.ndarray:
    """The class map of ``request`` (a dict of modality paths)."""
    req = {k: str(v) for k, v in request.items()}
    result = engine.generate_image(req, out_format="tensor").raise_for_error()
    return np.asarray(result.outputs.tensor[0].numpy())


def vv_on_s2_grid(s1: Path, s2: Path, linear: bool = False) -> np.ndarray:
    """VV in dB reprojected (bilinear) onto the S2 grid: NaN where S1 has nothing."""
    with rasterio.open(s2) as ref, rasterio.open(s1) as src:
        vv = np.full((ref.height, ref.width), np.nan, np.float32)
        reproject(
            src.read(1), vv, src_transform=src.transform, src_crs=src.crs, src_nodata=np.nan,
            dst_transform=ref.transform, dst_crs=ref.crs, dst_nodata=np.nan,
            resampling=Resampling.bilinear,
        )  # fmt: skip
    return 10 * np.log10(np.maximum(vv, 1e-30)) if linear else vv


def by_hand(s2: Path | None, vv: np.ndarray | None) -> np.ndarray:
    """The rule: NDWI > 0 where S2 has data, else VV < -15 dB, else nodata."""
    green = nir = None
    if s2 is not None:
        with rasterio.open(s2) as src:
            green, nir = src.read(2).astype(np.int64), src.read(4).astype(np.int64)
    shape = green.shape if green is not None else vv.shape  # type: ignore[union-attr]
    out = np.full(shape, NODATA, np.uint8)
    if vv is not None:
        has = np.isfinite(vv)
        out[has] = vv[has] < -15
    if green is not None and nir is not None:
        has = (green != 0) & (nir != 0)
        out[has] = green[has] > nir[has]  # NDWI > 0
    return out


def rim(vv: np.ndarray) -> np.ndarray:
    """Pixels within one pixel of the S1 footprint's edge (3x3 neighbourhood mixes data and
    no data), where GDAL's warper and a whole-scene reproject may choose differently."""
    has = np.pad(np.isfinite(vv), 1, mode="edge")
    h, w = vv.shape
    near = [has[i : i + h, j : j + w] for i in range(3) for j in range(3)]
    return np.logical_or.reduce(near) & ~np.logical_and.reduce(near)


def assert_same_map(got: np.ndarray, want: np.ndarray, vv: np.ndarray | None) -> None:
    assert got.shape == want.shape
    differ = got != want
    if vv is not None:
        differ &= ~rim(vv)
    assert not differ.any(), f"{differ.sum()} pixels differ, first at {np.argwhere(differ)[0]}"


# -- the rule on the synthetic scenes ----------------------------------------------------------


def test_fused_map_is_ndwi_where_s2_has_data_else_vv(engine, scene):
    vv = vv_on_s2_grid(scene["s1"], scene["s2"])
    got = run(engine, {"s2": scene["s2_masked"], "s1": scene["s1"]})
    assert_same_map(got, by_hand(scene["s2_masked"], vv), vv)
    under, outside = got[UNDER_S1], got[OUTSIDE_S1]
    assert set(np.unique(under)) == {0, 1}  # the masked block under S1: water and land, from S1
    assert (outside == NODATA).all()  # masked where S1 has no data: nodata
    assert (got[UNDER_S1] == (vv[UNDER_S1] < -15)).all()


def test_unmasked_s2_alone_decides_where_s1_also_covers(engine, scene):
    got = run(engine, {"s2": scene["s2"], "s1": scene["s1"]})
    assert_same_map(got, by_hand(scene["s2"], None), None)
    assert (got != NODATA).all()


def test_s2_alone(engine, scene):
    got = run(engine, {"s2": scene["s2_masked"]})
    want = by_hand(scene["s2_masked"], None)
    assert_same_map(got, want, None)
    assert (got[UNDER_S1] == NODATA).all()
    assert (got[OUTSIDE_S1] == NODATA).all()
    assert got.sum(where=got != NODATA) > 0  # the disc


def test_s1_alone_is_on_its_own_grid(engine, scene):
    got = run(engine, {"s1": scene["s1"]})
    with rasterio.open(scene["s1"]) as src:
        vv = src.read(1)
    assert_same_map(got, by_hand(None, vv), None)
    assert set(np.unique(got)) == {0, 1}


def test_linear_s1_gives_the_rule_in_db(engine, scene):
    linear = {"s2": scene["s2_masked"], "s1": scene["s1_linear"]}
    vv = vv_on_s2_grid(scene["s1_linear"], scene["s2"], linear=True)
    got = run(engine, linear)
    assert_same_map(got, by_hand(scene["s2_masked"], vv), vv)
    # the same map as from dB, but where interpolating power rather than dB (bilinear, onto
    # the S2 grid) crosses -15 dB on the other side: a few pixels of the disc's edge
    db_vv = vv_on_s2_grid(scene["s1"], scene["s2"])
    in_db = run(engine, {"s2": scene["s2_masked"], "s1": scene["s1"]})
    interp = by_hand(scene["s2_masked"], vv) != by_hand(scene["s2_masked"], db_vv)
    assert not ((got != in_db) & ~interp & ~rim(vv)).any()
    assert (got != in_db).sum() < 100
    # on its own grid (nothing resampled) linear and dB give the same map
    assert np.array_equal(run(engine, {"s1": scene["s1_linear"]}), run(engine, {"s1": scene["s1"]}))


def test_the_processor_option_overrides_the_tag(engine, scene, register_model, tmp_path):
    in_proc, out_proc = processors_of("s1s2-water")
    assert isinstance(in_proc, S1S2Patcher)
    assert in_proc.s1_units == "auto"

    class LinearWater(S1S2Water):
        pass

    class DbWater(S1S2Water):
        pass

    lin = register_model(
        "s1s2-water-linear", LinearWater, in_proc.replace(s1_units="linear"), out_proc
    )
    db = register_model("s1s2-water-db", DbWater, in_proc.replace(s1_units="db"), out_proc)
    want = run(engine, {"s1": scene["s1"]})
    # linear values tagged dB: the option says linear
    with Engine(lin) as linear:
        assert np.array_equal(run(linear, {"s1": scene["s1_linear_tagged_db"]}), want)
    # and the auto default believes the (wrong) tag: everything above -15 "dB" is land
    wrong = run(engine, {"s1": scene["s1_linear_tagged_db"]})
    assert (wrong == 0).all()
    # dB values tagged linear: the option says dB
    with rasterio.open(scene["s1"]) as src:
        profile, data = src.profile, src.read()
    tagged = tmp_path / "s1_db_tagged_linear.tif"
    with rasterio.open(tagged, "w", **profile) as dst:
        dst.write(data)
        dst.descriptions = ("VV", "VH")
        dst.update_tags(UNITS="LINEAR")
    with Engine(db) as in_db:
        assert np.array_equal(run(in_db, {"s1": tagged}), want)


def test_units_from_the_band_unit_and_unknown_units_refused(engine, scene, tmp_path):
    with rasterio.open(scene["s1_linear"]) as src:
        profile, data = src.profile, src.read()
    band_unit = tmp_path / "band_unit.tif"
    with rasterio.open(band_unit, "w", **profile) as dst:
        dst.write(data)
        dst.descriptions = ("VV", "VH")
        dst.units = ("linear", "linear")
    assert np.array_equal(run(engine, {"s1": band_unit}), run(engine, {"s1": scene["s1"]}))
    amplitude = rewrite_s1(scene["s1"], tmp_path / "amplitude.tif", linear=False, units="amplitude")
    with pytest.raises(InputError, match="'amplitude', neither dB nor linear"):
        engine.generate_image({"s1": str(amplitude)}, out_format="tensor").raise_for_error()


def test_invalid_units_option():
    in_proc, _ = processors_of("s1s2-water")
    with pytest.raises(ConfigError, match="s1_units"):
        in_proc.replace(s1_units="decibel")


def test_bands_option_replaces_the_s2_bands(engine, scene):
    in_proc, _ = processors_of("s1s2-water")
    assert in_proc.replace(bands=(1, 3)).band_selectors("s2") == (1, 3)
    assert in_proc.replace(bands=(1, 3)).band_selectors("s1") == ("VV",)
    request = {"s2": scene["s2_masked"], "s1": scene["s1"]}
    with Engine("s1s2-water", bands=[1, 3]) as by_index:  # B3, B8 of B2 B3 B4 B8
        assert np.array_equal(run(by_index, request), run(engine, request))


def test_logits_are_the_rule():
    s2 = torch.tensor([[0.3, 0.1], [0.1, 0.3], [float("nan")] * 2, [float("nan")] * 2])
    vv = torch.tensor([-30.0, -30.0, -20.0, -10.0])
    x = {"s2": s2[:, :, None, None], "s1": vv[:, None, None, None]}
    logits = S1S2Water()(x, s1_linear=torch.zeros(4, 1))
    assert logits.argmax(1).flatten().tolist() == [1, 0, 1, 0]
    lin = {"s2": x["s2"], "s1": 10 ** (x["s1"] / 10)}
    torch.testing.assert_close(S1S2Water()(lin, s1_linear=torch.ones(4, 1)), logits)
    probs = logits.softmax(1)[:, 1].flatten()
    # logits +-k x score (k = 10): NDWI 0.5 -> sigmoid(10); VV -20 dB -> score 1/6
    assert probs[0] == pytest.approx(torch.sigmoid(torch.tensor(10.0)).item(), abs=1e-6)
    assert probs[2] == pytest.approx(torch.sigmoid(torch.tensor(10 / 3)).item(), abs=1e-6)


# -- the real chip -----------------------------------------------------------------------------


def load_eval_script() -> Any:
    path = Path(__file__).resolve().parents[2] / "scripts" / "eval_s1s2_water.py"
    spec = importlib.util.spec_from_file_location("eval_s1s2_water", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def water_iou(pred: np.ndarray, truth: np.ndarray, where: Any = ...) -> float:
    valid = truth >= 0
    water, real = ((pred == 1) & valid)[where], ((truth == 1) & valid)[where]
    return float((water & real).sum() / (water | real).sum())


@needs_shared(FLOOD_LABEL)
@needs_shared(FLOOD_S1)
@needs_shared(FLOOD)
def test_model_card_figures_recomputed():
    script = load_eval_script()
    card = json.loads((WEIGHTS / "s1s2_water.json").read_text())
    figures = script.evaluate(SHARED_DATA)
    for key, value in figures.items():
        assert value == pytest.approx(card[key], abs=1e-4), key
    text = (WEIGHTS / "s1s2_water.md").read_text()
    for key in figures:
        assert f"| {card[key]:.3f} |" in text
    assert card["machine"] in text
    assert card["date"] in text
    # what fusion is for: S1 recovers most of what the masked third of S2 loses
    assert figures["fused_masked_water_iou"] > figures["s2_only_masked_water_iou"] + 0.05


@needs_shared(FLOOD_LABEL)
@needs_shared(FLOOD_S1)
@needs_shared(FLOOD)
def test_s1_on_another_grid_is_aligned(engine, tmp_path):
    """S1 reprojected first to UTM 30N at 20 m: the fused map scores as on the shared grid."""
    script = load_eval_script()
    masked = script.mask_left_third(FLOOD, tmp_path / "s2_masked.tif")
    with rasterio.open(FLOOD_S1) as src:
        transform, width, height = calculate_default_transform(
            src.crs, "EPSG:32630", src.width, src.height, *src.bounds, resolution=20
        )
        data = np.full((src.count, height, width), np.nan, np.float32)
        reproject(
            src.read(), data, src_transform=src.transform, src_crs=src.crs, src_nodata=np.nan,
            dst_transform=transform, dst_crs="EPSG:32630", dst_nodata=np.nan,
            resampling=Resampling.bilinear,
        )  # fmt: skip
        profile = {**src.profile, "crs": "EPSG:32630", "transform": transform}
        profile.update(width=width, height=height, nodata=np.nan)
        names = src.descriptions
    utm = tmp_path / "s1_utm20.tif"
    with rasterio.open(utm, "w", **profile) as dst:
        dst.write(data)
        dst.descriptions = names
    with rasterio.open(FLOOD_LABEL) as lab:
        truth = lab.read(1)
    same = run(engine, {"s2": masked, "s1": FLOOD_S1})
    moved = run(engine, {"s2": masked, "s1": utm})
    assert moved.shape == truth.shape
    left = (slice(None), slice(0, truth.shape[1] // 3))  # where S1 decides
    assert water_iou(moved, truth) == pytest.approx(water_iou(same, truth), abs=0.03)
    assert water_iou(moved, truth, left) == pytest.approx(water_iou(same, truth, left), abs=0.03)
    # nodata only where neither has data: the masked third's rim of the chip, where the
    # twice-warped S1 footprint falls short of the chip's edges
    rows, cols = np.nonzero(moved == NODATA)
    assert (cols < truth.shape[1] // 3).all()
    edge = np.minimum.reduce([rows, cols, truth.shape[0] - 1 - rows])
    assert edge.max() <= 1
