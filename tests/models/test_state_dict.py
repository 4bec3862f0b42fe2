"""The one reader of weights files: every family and the engine refuse a bad file alike.

A file holding pickled objects is refused in one line that names the file and the pickled
class, whether the engine loads it into a plugin model, a family reads it for
``load_checkpoint`` or a model registered from a fine-tune config is built from it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from geoserve import Engine
from geoserve.errors import WeightsError
from geoserve.models import load_checkpoint
from geoserve.models.configured import register_configured, unregister_configured
from tests.stub_models import TinySeg

PICKLED = r"module\.ckpt: holds a pickled tests\.stub_models\.TinySeg, not only tensors"


def write_config(path: Path, factory: str, model_args: dict, data: dict | None = None) -> Path:
    config: dict = {
        "model": {
            "class_path": "terratorch.tasks.SemanticSegmentationTask",
            "init_args": {"model_factory": factory, "model_args": model_args, "loss": "ce"},
        }
    }
    if data is not None:
        config["data"] = {"init_args": data}
    path.write_text(yaml.safe_dump(config))
    return path


SMP_ARGS = {"backbone": "resnet18", "model": "Unet", "bands": [0, 1, 2], "num_classes": 2}
CONFIGS = {
    "Prithvi": None,
    "TerraMind": ("EncoderDecoderFactory", {"backbone": "terramind_v1_tiny"}),
    "encoder-decoder": ("SMPModelFactory", SMP_ARGS),
}


@pytest.fixture
def pickled(tmp_path: Path) -> Path:
    """A checkpoint holding a whole pickled module, not a state dict."""
    path = tmp_path / "module.ckpt"
    torch.save(TinySeg(), path)
    return path


@pytest.mark.parametrize("family", list(CONFIGS))
def test_a_pickled_checkpoint_is_refused_in_one_line_by_every_family(
    tmp_path: Path, pickled: Path, family: str
) -> None:
    described = CONFIGS[family]
    config = write_config(tmp_path / "cfg.yaml", *described) if described else None
    with pytest.raises(WeightsError, match=PICKLED) as info:
        load_checkpoint(pickled, config=config)
    message = str(info.value)
    assert "\n" not in message
    assert "weights_only=True" in message  # refused, not advice to load it unsafely
    assert "weights_only` set to `False`" not in message


def test_a_registered_fine_tune_refuses_a_pickled_checkpoint_like_a_plugin_model(
    tmp_path: Path, pickled: Path
) -> None:
    """``predict --config-file CFG --weights FILE``: the engine's message, not torch's page."""
    data = {"bands": ["B", "G", "R"], "means": [0.0] * 3, "stds": [1.0] * 3}
    cfg = write_config(tmp_path / "config.yaml", "SMPModelFactory", SMP_ARGS, data)
    register_configured("pickled-fine-tune", cfg)
    try:
        for name in ("pickled-fine-tune", "test-seg"):  # configured, and a plugin model
            with pytest.raises(WeightsError, match=PICKLED) as info:
                Engine(name, weights=pickled)
            assert "\n" not in str(info.value)
    finally:
        unregister_configured("pickled-fine-tune")
