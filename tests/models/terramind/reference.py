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

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

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


def load_tokenizers() -> types.SimpleNamespace:
    """TerraTorch's tokenizer files (they import diffusers, a dev dependency), as attributes.

    ``register`` (the ``terramind_v1_tokenizer_*`` builders), ``vqvae`` (``DiVAE``, ``VQVAE``),
    ``unet``, ``vit`` (the tokenizers' ViT), ``fsq`` and ``ddim`` (TerraTorch's own scheduler).
    """
    load()
    base = "terratorch.models.backbones.terramind.tokenizer"
    return types.SimpleNamespace(
        register=importlib.import_module(f"{base}.tokenizer_register"),
        vqvae=importlib.import_module(f"{base}.vqvae"),
        unet=importlib.import_module(f"{base}.models.unet.unet"),
        vit=importlib.import_module(f"{base}.models.vit_models"),
        fsq=importlib.import_module(f"{base}.quantizers.quantize_finite_scalar"),
        ddim=importlib.import_module(f"{base}.scheduling.scheduling_ddim"),
    )


class _EmptyOnMeta(TorchFunctionMode):
    """``torch.empty`` without a device makes meta tensors: module weights cost no memory.

    TerraTorch's tokenizer builders cannot run inside ``torch.device("meta")`` (they call
    ``.item()`` on tensors they make), so only the weights' allocation is redirected; small
    tables (position embeddings, FSQ buffers, the scheduler's) stay real, on the CPU.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.empty and kwargs.get("device") is None:
            kwargs["device"] = "meta"
        return func(*args, **kwargs)


def tokenizer(modality: str, **kwargs: Any) -> nn.Module:
    """TerraTorch's ``terramind_v1_tokenizer_<modality>``, its weights on the meta device.

    Never downloaded; to run parts of it, replace them with real (smaller) modules.
    """
    build = getattr(load_tokenizers().register, f"terramind_v1_tokenizer_{modality}")
    with _EmptyOnMeta():
        return build(**kwargs)


class _TokensOut(nn.Module):
    """A stand-in tokenizer: its decode hands back the generated tokens, (B, nh, nw)."""

    patch_size = 16

    def __init__(self, **_kwargs: Any) -> None:
        super().__init__()

    def decode_tokens(self, tokens: Any, **_kwargs: Any) -> Any:
        return tokens


def generation(variant: str, **kwargs: Any) -> nn.Module:
    """TerraTorch's ``terramind_v1_<variant>_generate`` (random weights), tokenizers stubbed.

    The builder fixes its tokenizer table, so its entries are swapped for :class:`_TokensOut`
    while it builds: ``forward`` then returns the tokens it generated, not pixels, and the
    state dict is the generator's alone (``sampler.model.*``).
    """
    register = load().register
    table = register.tokenizer_dict["v1"]
    saved = dict(table)
    table.update({key: _TokensOut for key in table})
    try:
        return getattr(register, f"terramind_v1_{variant}_generate")(**kwargs)
    finally:
        table.clear()
        table.update(saved)


def generate_module() -> types.ModuleType:
    """TerraTorch's ``model/generate.py`` (``GenerationSampler``, the ``init_*`` helpers)."""
    load()
    return importlib.import_module("terratorch.models.backbones.terramind.model.generate")
