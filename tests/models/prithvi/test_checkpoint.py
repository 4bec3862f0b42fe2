"""Checkpoint loading: layouts, configs next to the file, and bad checkpoints."""

from __future__ import annotations

import json

import pytest
import torch

from geoserve.errors import WeightsError
from geoserve.models import load_checkpoint
from geoserve.models.prithvi import PrithviSegmentation, normalize_keys

SMALL = dict(
    embed_dim=64,
    depth=4,
    num_heads=4,
    in_chans=6,
    img_size=224,
    patch_size=16,
    num_frames=1,
    coords_encoding=("location",),
    coords_scale_learn=True,
)


def small_segmentation(classes: int = 2) -> PrithviSegmentation:
    torch.manual_seed(0)
    return PrithviSegmentation(
        num_classes=classes, feature_indices=(0, 1, 2, 3), decoder_channels=32, **SMALL
    ).eval()


def save_lightning(model: torch.nn.Module, path) -> None:
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    state["model.aux_heads.extra.weight"] = torch.zeros(3)  # training-only: ignored
    torch.save({"state_dict": state, "optimizer_states": [{}], "epoch": 7}, path)


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        pytest.param(
            ["blocks.0.norm1.weight", "decoder_pred.bias", "mask_token", "pos_embed"],
            {"encoder.blocks.0.norm1.weight", "decoder.decoder_pred.bias", "decoder.mask_token"},
            id="mae-bare",
        ),
        pytest.param(
            [
                "model.encoder._timm_module.norm.weight",
                "model.head.head.2.bias",
                "model.aux_heads.x.weight",
            ],
            {"encoder.norm.weight", "head.head.2.bias"},
            id="lightning-timm-wrapped",
        ),
        pytest.param(
            ["backbone.cls_token", "auxiliary_head.conv.weight", "decode_head.conv_seg.weight"],
            {"encoder.cls_token", "decode_head.conv_seg.weight"},
            id="mmseg",
        ),
    ],
)
def test_normalize_keys_layouts(keys, expected):
    t = torch.zeros(1)
    assert set(normalize_keys(dict.fromkeys(keys, t))) == expected


def test_lightning_checkpoint_round_trip(tmp_path):
    model = small_segmentation()
    path = tmp_path / "finetune.ckpt"
    save_lightning(model, path)
    loaded = load_checkpoint(path, config={"num_heads": 4, "feature_indices": (0, 1, 2, 3)})
    x = torch.randn(1, 6, 64, 64)
    with torch.inference_mode():
        assert torch.equal(loaded(x), model(x))


def test_legacy_non_zip_checkpoint_loads(tmp_path):
    """torch's pre-1.6 format cannot be memory-mapped; finding its family still reads it."""
    model = small_segmentation()
    path = tmp_path / "legacy.pt"
    torch.save(model.state_dict(), path, _use_new_zipfile_serialization=False)
    loaded = load_checkpoint(path, config={"num_heads": 4, "feature_indices": (0, 1, 2, 3)})
    x = torch.randn(1, 6, 64, 64)
    with torch.inference_mode():
        assert torch.equal(loaded(x), model(x))


def test_config_json_beside_the_checkpoint_is_used(tmp_path):
    model = small_segmentation()
    save_lightning(model, tmp_path / "w.ckpt")
    (tmp_path / "config.json").write_text(json.dumps({"pretrained_cfg": {"num_heads": 4}}))
    loaded = load_checkpoint(tmp_path / "w.ckpt", config={"feature_indices": (0, 1, 2, 3)})
    assert loaded.encoder.blocks[0].attn.num_heads == 4


def test_another_architecture_is_refused(tmp_path):
    path = tmp_path / "resnet.pt"
    torch.save({"conv1.weight": torch.zeros(64, 3, 7, 7), "fc.bias": torch.zeros(10)}, path)
    with pytest.raises(WeightsError, match="not a Prithvi checkpoint"):
        load_checkpoint(path)


def test_truncated_file_is_refused(tmp_path):
    model = small_segmentation()
    full = tmp_path / "full.ckpt"
    save_lightning(model, full)
    cut = tmp_path / "cut.ckpt"
    cut.write_bytes(full.read_bytes()[: full.stat().st_size // 2])
    with pytest.raises(WeightsError, match=r"cut\.ckpt: cannot read weights"):
        load_checkpoint(cut)


def test_config_disagreeing_with_weights_names_the_key(tmp_path):
    path = tmp_path / "w.ckpt"
    save_lightning(small_segmentation(classes=2), path)
    with pytest.raises(WeightsError, match=r"shape mismatch at head\.head\.2\.(weight|bias)"):
        load_checkpoint(
            path, config={"num_heads": 4, "feature_indices": (0, 1, 2, 3), "num_classes": 5}
        )
    with pytest.raises(WeightsError, match="shape mismatch at encoder"):
        load_checkpoint(
            path, config={"num_heads": 4, "feature_indices": (0, 1, 2, 3), "embed_dim": 128}
        )


def test_missing_keys_are_named(tmp_path):
    model = small_segmentation()
    state = {
        f"model.{k}": v
        for k, v in model.state_dict().items()
        if not k.startswith("encoder.blocks.3.")
    }
    path = tmp_path / "partial.pt"
    torch.save(state, path)
    with pytest.raises(WeightsError, match=r"missing \['encoder\.blocks\.3\."):
        load_checkpoint(path, config={"num_heads": 4, "depth": 4, "feature_indices": (0, 1, 2, 3)})
