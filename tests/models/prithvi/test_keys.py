"""Full-size models on the meta device: key names and shapes equal the reference's exactly."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from geoserve.models.prithvi.checkpoint import build_model
from geoserve.models.prithvi.variants import encoder_kwargs

SHAPES = (
    Path(__file__).resolve().parents[4]
    / "shared"
    / "reference"
    / ("anchor_prithvi_state_dict_shapes.json")
)
MAE = {
    "v1_100": ("prithvi_eo_v1_100", {}),
    "v2_300": ("prithvi_eo_v2_300", {}),
    "v2_300_tl": ("prithvi_eo_v2_300_tl", {}),
    "v2_600": ("prithvi_eo_v2_600", {}),
    "v2_tiny_tl": ("prithvi_eo_v2_tiny_tl", {}),
}


def collapsed(model: torch.nn.Module) -> dict[str, list[int]]:
    out = {}
    for key, value in model.state_dict().items():
        out[re.sub(r"blocks\.\d+\.", "blocks.{i}.", key)] = list(value.shape)
    return out


@pytest.fixture(scope="module")
def reference() -> dict:
    return json.loads(SHAPES.read_text())


@pytest.mark.parametrize("name", sorted(MAE))
def test_pretrained_mae_keys_and_shapes(reference, name):
    variant, extra = MAE[name]
    with torch.device("meta"):
        model = build_model({"kind": "mae", **encoder_kwargs(variant), **extra})
    assert collapsed(model) == reference["pretrained_mae"][name]


def test_sen1floods11_upernet_keys_and_shapes(reference):
    expected = {
        k.removeprefix("model."): v
        for k, v in reference["sen1floods11_300m_tl_upernet_lightning"].items()
    }
    cfg = {
        "kind": "upernet",
        **encoder_kwargs("prithvi_eo_v2_300_tl", num_frames=1),
        "num_classes": 2,
    }
    with torch.device("meta"):
        model = build_model(cfg)
    assert collapsed(model) == expected
