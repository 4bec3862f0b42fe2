"""Parity of the timm / SMP encoder-decoders with TerraTorch 1.2.13's factories.

Each case builds the reference with TerraTorch's own factory code (``terratorch_reference``)
and random weights, saves it as a Lightning checkpoint (``{"state_dict": {"model." + k: v}}``)
beside a fine-tune config, loads both through ``geoserve.models.load_checkpoint`` and compares
logits in fp32, eval mode. Inputs are 64x64 (the smallest a 32-stride encoder keeps 2x2 at its
deepest level), batch 1, with 4 or 13 bands; decoders are narrow to keep the suite quick.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from geoserve.errors import WeightsError
from geoserve.models import load_checkpoint
from geoserve.models.encoder_decoder import EncoderDecoderSegmentation, SMPSegmentation
from tests.models.terratorch_reference import load

TOL = 1e-4
UNET = {"decoder": "UNetDecoder"}
UPERNET = {"decoder": "UperNetDecoder", "decoder_channels": 32}
FPN = {"decoder": "FPN", "decoder_decoder_pyramid_channels": 32}
#: UNet channels per encoder feature: timm's ResNets and EfficientNets give 5, ConvNeXt 4.
CHANNELS5 = [64, 32, 32, 16, 16]
CHANNELS4 = [64, 32, 16, 16]

ENCODER_DECODER = [
    ("timm_resnet18", {**UNET, "decoder_channels": CHANNELS5}, 4),
    ("timm_resnet18", UPERNET, 13),
    ("resnet18", FPN, 4),  # unprefixed: TerraTorch's registry finds it in timm
    ("timm_resnet50", {**UNET, "decoder_channels": CHANNELS5}, 13),
    ("timm_resnet50", {**UPERNET, "head_channel_list": [16], "head_dropout": 0.1}, 4),
    ("timm_resnet50", {**FPN, "decoder": "smp_FPN"}, 13),
    ("timm_efficientnet_b0", {**UNET, "decoder_channels": CHANNELS5}, 4),
    ("timm_efficientnet_b0", UPERNET, 13),
    ("timm_efficientnet_b0", FPN, 4),
    ("timm_convnext_tiny", {**UNET, "decoder_channels": CHANNELS4}, 13),
    ("timm_convnext_tiny", UPERNET, 4),
    ("timm_convnext_tiny", FPN, 13),
]
SMP = [
    ("resnet18", "Unet", 4),
    ("resnet50", "FPN", 13),
    ("efficientnet-b0", "UPerNet", 4),
    ("tu-resnet18.a1_in1k", "Unet", 13),
    ("timm-efficientnet-b0", "DeepLabV3Plus", 4),
]


@pytest.fixture(scope="module")
def ref():
    return load()


def randomize(module: torch.nn.Module) -> None:
    """Batch-norm statistics and affine terms away from their defaults, so they count."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, b in module.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(0.1 * torch.randn(b.shape, generator=g))
            elif name.endswith("running_var"):
                b.copy_(1 + 0.2 * torch.rand(b.shape, generator=g))
        for p in module.parameters():
            if p.ndim == 1:
                p.add_(0.05 * torch.randn(p.shape, generator=g))


def save_fine_tune(
    tmp_path: Path, reference: torch.nn.Module, factory: str, model_args: dict[str, Any]
) -> tuple[Path, Path]:
    """A Lightning checkpoint of ``reference`` and the config that built it."""
    ckpt = tmp_path / "best.ckpt"
    state = {"model." + k: v for k, v in reference.state_dict().items()}
    torch.save({"state_dict": state, "epoch": 3}, ckpt)
    cfg = tmp_path / "config.yaml"
    config = {
        "model": {
            "class_path": "terratorch.tasks.SemanticSegmentationTask",
            "init_args": {"model_factory": factory, "model_args": model_args, "loss": "ce"},
        }
    }
    cfg.write_text(yaml.safe_dump(config))
    return ckpt, cfg


def compare(reference: torch.nn.Module, ours: torch.nn.Module, x: torch.Tensor) -> float:
    with torch.inference_mode():
        expected = reference(x).output
        got = ours(x)
    assert got.shape == expected.shape
    return float((got - expected).abs().max())


@pytest.mark.parametrize(
    ("backbone", "decoder_args", "bands"),
    ENCODER_DECODER,
    ids=[f"{b}-{d['decoder']}-{n}" for b, d, n in ENCODER_DECODER],
)
def test_encoder_decoder_factory_parity(ref, tmp_path, backbone, decoder_args, bands):
    args = {
        "backbone": backbone,
        "backbone_in_chans": bands,
        "backbone_pretrained": False,
        "num_classes": 3,
        **decoder_args,
    }
    torch.manual_seed(0)
    reference = ref.build("EncoderDecoderFactory", **args)
    randomize(reference)
    ckpt, cfg = save_fine_tune(tmp_path, reference, "EncoderDecoderFactory", args)
    ours = load_checkpoint(ckpt, config=cfg)
    assert isinstance(ours, EncoderDecoderSegmentation)
    assert not ours.training
    assert compare(reference, ours, torch.randn(1, bands, 64, 64)) <= TOL


@pytest.mark.parametrize(
    ("backbone", "model", "bands"), SMP, ids=[f"{b}-{m}-{n}" for b, m, n in SMP]
)
def test_smp_model_factory_parity(ref, tmp_path, backbone, model, bands):
    args = {
        "backbone": backbone,
        "model": model,
        "bands": list(range(bands)),
        "pretrained": False,
        "num_classes": 2,
    }
    torch.manual_seed(0)
    reference = ref.build("SMPModelFactory", **args)
    randomize(reference)
    ckpt, cfg = save_fine_tune(tmp_path, reference, "SMPModelFactory", args)
    ours = load_checkpoint(ckpt, config=cfg)
    assert isinstance(ours, SMPSegmentation)
    assert compare(reference, ours, torch.randn(1, bands, 64, 64)) <= TOL


def test_sizes_that_are_no_multiple_of_the_stride_are_resized_back(ref, tmp_path):
    """UperNet resizes inside; the logits are resized bilinearly to the input (``rescale``)."""
    args = {"backbone": "timm_resnet18", "backbone_in_chans": 4, "num_classes": 2, **UPERNET}
    reference = ref.build("EncoderDecoderFactory", **args)
    randomize(reference)
    ckpt, cfg = save_fine_tune(tmp_path, reference, "EncoderDecoderFactory", args)
    ours = load_checkpoint(ckpt, config=cfg)
    assert compare(reference, ours, torch.randn(2, 4, 70, 90)) <= TOL


def test_a_config_beside_the_checkpoint_is_found(ref, tmp_path):
    args = {"backbone": "resnet18", "model": "Unet", "bands": [0, 1, 2], "num_classes": 2}
    reference = ref.build("SMPModelFactory", pretrained=False, **args)
    ckpt, _ = save_fine_tune(tmp_path, reference, "SMPModelFactory", args)
    assert isinstance(load_checkpoint(ckpt), SMPSegmentation)  # config.yaml beside it


def test_strict_loading_names_missing_and_unexpected_keys(ref, tmp_path):
    args = {"backbone": "resnet18", "model": "Unet", "bands": [0, 1, 2, 3], "num_classes": 2}
    reference = ref.build("SMPModelFactory", pretrained=False, **args)
    ckpt, cfg = save_fine_tune(tmp_path, reference, "SMPModelFactory", args)
    state = torch.load(ckpt, weights_only=True)["state_dict"]
    state.pop("model.smp_model.segmentation_head.0.bias")
    state["model.smp_model.extra.weight"] = torch.zeros(1)
    state["model.aux_heads.aux.0.weight"] = torch.zeros(1)  # training only: dropped
    torch.save({"state_dict": state}, ckpt)
    with pytest.raises(WeightsError) as info:
        load_checkpoint(ckpt, config=cfg)
    message = str(info.value)
    assert str(ckpt) in message
    assert "missing ['smp_model.segmentation_head.0.bias']" in message
    assert "unexpected ['smp_model.extra.weight']" in message


def test_a_checkpoint_of_another_band_count_names_the_shape(ref, tmp_path):
    args = {"backbone": "timm_resnet18", "backbone_in_chans": 4, "num_classes": 2, **UPERNET}
    reference = ref.build("EncoderDecoderFactory", **args)
    ckpt, cfg = save_fine_tune(tmp_path, reference, "EncoderDecoderFactory", args)
    cfg.write_text(cfg.read_text().replace("backbone_in_chans: 4", "backbone_in_chans: 6"))
    with pytest.raises(WeightsError, match=r"shape mismatch at encoder.conv1.weight"):
        load_checkpoint(ckpt, config=cfg)
