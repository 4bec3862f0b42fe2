"""The bundled demo model: shipped weights, and a model card that cannot drift from them."""

from __future__ import annotations

import pytest
import rasterio

from geoserve import Engine
from geoserve.models.demo import model_card, weights_path
from tests.conftest import FLOOD, FLOOD_LABEL, needs_shared


def test_weights_are_small_safetensors():
    path = weights_path()
    assert path.suffix == ".safetensors"
    assert path.stat().st_size <= 5 * 1024 * 1024


@needs_shared(FLOOD)
def test_model_card_figures_recomputed_from_the_shipped_weights():
    card = model_card()
    pred = Engine("demo-water").generate_image(FLOOD, out_format="tensor").outputs.tensor[0]
    with rasterio.open(FLOOD_LABEL) as lab:
        truth = lab.read(1)
    valid = truth >= 0
    water, real = (pred.numpy() == 1) & valid, (truth == 1) & valid
    iou = (water & real).sum() / (water | real).sum()
    acc = (pred.numpy()[valid] == truth[valid]).mean()
    assert iou == pytest.approx(card["model_water_iou"], abs=2e-3)
    assert acc == pytest.approx(card["model_pixel_accuracy"], abs=2e-3)
    # validated with int8 (ModelSpec.validated): its figures, within 0.01 IoU of float32
    q = Engine("demo-water", quantize="int8").generate_image(FLOOD, out_format="tensor")
    q_pred = q.outputs.tensor[0].numpy()
    q_water = (q_pred == 1) & valid
    q_iou = (q_water & real).sum() / (q_water | real).sum()
    assert q_iou == pytest.approx(card["int8_water_iou"], abs=2e-3)
    assert abs(q_iou - iou) <= 0.01
    assert (q_pred[valid] == truth[valid]).mean() == pytest.approx(
        card["int8_pixel_accuracy"], abs=2e-3
    )
    assert (q_pred == pred.numpy()).mean() == pytest.approx(card["int8_class_agreement"], abs=1e-3)
    text = (weights_path().parent / "demo_water.md").read_text()
    assert f"{card['model_water_iou']:.3f}" in text
    assert f"{card['ndwi_water_iou']:.3f}" in text


@needs_shared(FLOOD)
def test_demo_model_is_not_worse_than_the_index_it_learned_from():
    card = model_card()
    assert card["model_water_iou"] >= card["ndwi_water_iou"] - 0.02
    assert card["model_pixel_accuracy"] > 0.85
