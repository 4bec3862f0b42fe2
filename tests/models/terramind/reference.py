"""TerraMind's reference: TerraTorch 1.2.13's own files, imported from its wheel (never vendored).

Extends :mod:`tests.models.prithvi.reference` (same wheel, same stand-in registries). The
encoder comes from TerraTorch's variant builders (``terramind_v1_tiny`` ...). The fine-tune is
composed as ``EncoderDecoderFactory.build_model`` composes it — ``build_neck_list`` with
TerraTorch's neck classes, its ``UperNetDecoder``/``UNetDecoder`` on the necks' channel list,
``PixelWiseModel`` with ``patch_size`` read off the backbone and reflect padding — because the
factory's registry lookups need the whole installed package.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

from torch import nn

from tests.models.prithvi import reference as prithvi_reference

_PACKAGES = (
    "models/backbones/terramind",
    "models/backbones/terramind/model",
    "models/backbones/terramind/tokenizer",
)


def load() -> types.SimpleNamespace:
    """The TerraMind register module and the fine-tune parts, as attributes."""
    base = prithvi_reference.load()
    src = prithvi_reference._fetch()
    for sub in _PACKAGES:
        name = "terratorch." + sub.replace("/", ".")
        if name not in sys.modules:
            mod = types.ModuleType(name)
            mod.__path__ = [str(src / "terratorch" / sub)]
            sys.modules[name] = mod
    register = importlib.import_module(
        "terratorch.models.backbones.terramind.model.terramind_register"
    )
    heads = sys.modules["terratorch.models.heads"]
    for attr, module in (
        ("RegressionHead", "regression_head"),
        ("SegmentationHead", "segmentation_head"),
    ):  # what the package's __init__ would import
        if not hasattr(heads, attr):
            sub = importlib.import_module(f"terratorch.models.heads.{module}")
            setattr(heads, attr, getattr(sub, attr))
    pixel_wise = importlib.import_module("terratorch.models.pixel_wise_model")
    return types.SimpleNamespace(register=register, pixel_wise=pixel_wise, **vars(base))


def encoder(variant: str, **kwargs: Any) -> nn.Module:
    """TerraTorch's ``terramind_v1_<variant>`` backbone (random weights)."""
    return getattr(load().register, f"terramind_v1_{variant}")(**kwargs)


def finetune(
    variant: str,
    modalities: list[str],
    *,
    necks: list[dict[str, Any]],
    decoder: str,
    decoder_kwargs: dict[str, Any],
    num_classes: int,
    head_kwargs: dict[str, Any] | None = None,
) -> nn.Module:
    """A segmentation fine-tune composed as TerraTorch's EncoderDecoderFactory does."""
    ref = load()
    backbone = encoder(variant, modalities=modalities)
    neck_list = []
    channels = list(backbone.out_channels)
    for spec in necks:
        cls = getattr(ref.necks, spec["name"])
        op = cls(channels, **{k: v for k, v in spec.items() if k != "name"})
        channels = op.process_channel_list(channels)
        neck_list.append(op)
    if decoder == "UperNetDecoder":
        dec = ref.upernet.UperNetDecoder(channels, **decoder_kwargs)
    else:
        dec = ref.unet.UNetDecoder(channels, **decoder_kwargs)
    patch_size = next(m.patch_size for m in backbone.modules() if hasattr(m, "patch_size"))
    return ref.pixel_wise.PixelWiseModel(
        "segmentation",
        backbone,
        dec,
        {"num_classes": num_classes, **(head_kwargs or {})},
        patch_size=patch_size,
        padding="reflect",
        neck=ref.necks.NeckSequential(*neck_list),
    )
