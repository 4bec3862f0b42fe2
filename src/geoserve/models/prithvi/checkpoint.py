"""Loading Prithvi checkpoints from local files (``.pt``, ``.pth``, ``.ckpt``, ``.safetensors``).

Key normalisation (anchor_prithvi.md A2), applied in this order:

1. unwrap ``state_dict`` (Lightning, mmcv) and keep tensors only (optimizer, loss and metric
   entries fall away);
2. drop ``_timm_module.`` (TerraTorch <= 0.99.7) and a leading ``model.`` (Lightning);
3. mmseg prefixes: ``backbone.`` -> ``encoder.``; ``auxiliary_head.`` / ``aux_heads.`` dropped
   (training only);
4. v1 bare keys (no ``encoder.``/``decoder.`` prefix): decoder-ish keys (containing
   ``decoder`` or ``_dec``, or ``mask_token``) -> ``decoder.``, the rest -> ``encoder.``;
5. every ``pos_embed`` is dropped: the model keeps the one it computes.

Then the model is built (from ``variant``, a config next to the checkpoint, or the shapes in the
checkpoint) and loaded strictly; missing and unexpected keys are reported by name.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from geoserve.errors import ConfigError, WeightsError
from geoserve.models.prithvi.config import load_config_file, read_config
from geoserve.models.prithvi.mae import PrithviMAE
from geoserve.models.prithvi.segmentation import PrithviSegmentation
from geoserve.models.prithvi.variants import FEATURE_INDICES, VARIANTS, encoder_kwargs
from geoserve.models.state_dict import load_strict, read_state_dict

__all__ = ["build_model", "infer_config", "load_checkpoint", "normalize_keys", "read_state_dict"]

_TRAINING_ONLY = (
    "auxiliary_head.",
    "aux_heads.",
    "criterion.",
    "loss",
    "train_metrics",
    "val_metrics",
    "test_metrics",
)


def normalize_keys(
    state: Mapping[str, torch.Tensor], *, keep_pos_embed: bool = False
) -> dict[str, torch.Tensor]:
    """Map any supported layout to geoserve's names (see the module docstring)."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        k = key.replace("_timm_module.", "")
        if k.startswith("model."):
            k = k[len("model.") :]
        if k.startswith("backbone."):
            k = "encoder." + k[len("backbone.") :]
        if k.startswith(_TRAINING_ONLY):
            continue
        out[k] = value
    prefixes = ("encoder.", "decoder.", "head.", "neck.", "decode_head.")
    if not any(k.startswith(prefixes) for k in out):  # v1 bare MAE keys
        out = {
            ("decoder." if ("decoder" in k or "_dec" in k or k == "mask_token") else "encoder.")
            + k: v
            for k, v in out.items()
        }
    if keep_pos_embed:
        return out
    return {k: v for k, v in out.items() if not k.endswith("pos_embed")}


def infer_config(state: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """Architecture arguments read off the tensor shapes."""
    try:
        proj = state["encoder.patch_embed.proj.weight"]  # (D, C, t, p, p)
    except KeyError:
        raise WeightsError(
            "not a Prithvi checkpoint: no encoder patch embedding "
            "(encoder.patch_embed.proj.weight or a known prefix of it)"
        ) from None
    embed_dim, in_chans, _, p, _ = proj.shape
    depth = 1 + max(
        int(m.group(1)) for k in state if (m := re.match(r"encoder\.blocks\.(\d+)\.", k))
    )
    variant = next(
        (
            v
            for v, a in VARIANTS.items()
            if a["embed_dim"] == embed_dim and a["depth"] == depth and a["patch_size"] == p
        ),
        None,
    )
    heads = VARIANTS[variant]["num_heads"] if variant else max(1, embed_dim // 64)
    cfg: dict[str, Any] = dict(
        embed_dim=int(embed_dim),
        depth=depth,
        num_heads=heads,
        patch_size=int(p),
        in_chans=int(in_chans),
    )
    coords = tuple(
        name
        for name, key in (
            ("time", "encoder.temporal_embed_enc.scale"),
            ("location", "encoder.location_embed_enc.scale"),
        )
        if key in state
    )
    if coords:
        cfg["coords_encoding"] = coords
        cfg["coords_scale_learn"] = True
    pos = state.get("encoder.pos_embed")
    if pos is not None:  # its token count gives the configured grid: T x (img/p)^2
        tokens = int(pos.shape[1]) - 1
        per_frame = (224 // int(p)) ** 2
        if tokens % per_frame == 0:
            cfg["img_size"], cfg["num_frames"] = 224, tokens // per_frame
        else:
            cfg["img_size"], cfg["num_frames"] = int(round(tokens**0.5)) * int(p), 1
    if "decoder.decoder_pred.weight" in state:
        cfg["kind"] = "mae"
        cfg["decoder_embed_dim"] = int(state["decoder.decoder_embed.weight"].shape[0])
        cfg["decoder_depth"] = 1 + max(
            int(m.group(1))
            for k in state
            if (m := re.match(r"decoder\.decoder_blocks\.(\d+)\.", k))
        )
    elif "decode_head.conv_seg.weight" in state:
        cfg["kind"] = "v1fcn"
        cfg["num_classes"] = int(state["decode_head.conv_seg.weight"].shape[0])
        cfg["head_channels"] = int(state["decode_head.conv_seg.weight"].shape[1])
        neck = state["neck.fpn1.0.weight"]  # (D*T, out, 2, 2)
        cfg["neck_dim"] = int(neck.shape[1])
        if "encoder.pos_embed" not in state:
            cfg["num_frames"] = max(1, int(neck.shape[0]) // int(embed_dim))
    elif "decoder.decoder.blocks.0.conv1.0.weight" in state:
        cfg["kind"] = "unet"
        cfg["num_classes"] = int(state["head.head.2.weight"].shape[0])
        n = 1 + max(
            int(m.group(1))
            for k in state
            if (m := re.match(r"decoder\.decoder\.blocks\.(\d+)\.", k))
        )
        cfg["decoder_channels"] = [
            int(state[f"decoder.decoder.blocks.{i}.conv1.0.weight"].shape[0]) for i in range(n)
        ]
        fpn = state.get("neck.2.fpn2.0.weight")
        if fpn is not None and "encoder.pos_embed" not in state:
            cfg["num_frames"] = max(1, int(fpn.shape[0]) // int(embed_dim))
    elif "head.head.2.weight" in state:
        cfg["kind"] = "upernet"
        cfg["num_classes"] = int(state["head.head.2.weight"].shape[0])
        cfg["decoder_channels"] = int(state["head.head.2.weight"].shape[1])
        lateral = state.get("decoder.lateral_convs.2.conv.weight")
        if lateral is not None and "encoder.pos_embed" not in state:
            cfg["num_frames"] = max(1, int(lateral.shape[1]) // int(embed_dim))
    else:
        cfg["kind"] = "encoder"
    return cfg


def build_model(cfg: Mapping[str, Any]) -> nn.Module:
    """A Prithvi model of kind ``mae``, ``upernet``, ``unet``, ``v1fcn`` or ``encoder``."""
    cfg = dict(cfg)
    kind = cfg.pop("kind", "encoder")
    for key in ("mean", "std", "bands"):
        cfg.pop(key, None)
    if kind == "mae":
        return PrithviMAE(**cfg)
    if kind == "v1fcn":
        from geoserve.models.prithvi.v1 import PrithviV1Segmentation

        return PrithviV1Segmentation(**cfg)
    if kind in ("upernet", "unet"):
        indices = cfg.pop("feature_indices", None) or FEATURE_INDICES.get(cfg["depth"])
        if indices is None:
            raise WeightsError(f"no feature indices known for depth {cfg['depth']}")
        return PrithviSegmentation(feature_indices=indices, decoder=kind, **cfg)
    from geoserve.models.prithvi.encoder import PrithviViT

    class _Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = PrithviViT(**cfg)

        def forward(self, x: torch.Tensor, **kw: Any) -> Any:
            return self.encoder.forward_features(x, **kw)

    return _Encoder()


def load_checkpoint(
    path: str | Path,
    *,
    variant: str | None = None,
    config: Mapping[str, Any] | str | os.PathLike[str] | None = None,
) -> nn.Module:
    """Build the model a checkpoint holds and load it strictly.

    Architecture comes from, in increasing precedence: the checkpoint's shapes, a config file
    beside it, ``variant``, and ``config``: a mapping of architecture arguments (e.g.
    command-line options), or the path of a config file (``.json``, ``.yaml``, ``.yml``; see
    :mod:`geoserve.models.prithvi.config`), which is then read instead of one beside the
    checkpoint.

    Raises:
        ConfigError: ``config`` is neither a mapping nor a path.
        WeightsError: unreadable checkpoint or config file, unknown layout, or keys/shapes
            that do not match, with the offending keys named.
    """
    if config is not None and not isinstance(config, Mapping | str | os.PathLike):
        raise ConfigError(
            "config must be a mapping of architecture arguments or the path of a config file "
            f"(.json, .yaml, .yml), got {type(config).__name__}"
        )
    path = Path(path)
    cfg_file = None
    if config is None or isinstance(config, Mapping):
        beside, overrides = read_config(path), dict(config or {})
    else:
        cfg_file = Path(config)
        beside, overrides = {}, load_config_file(cfg_file)
    state = normalize_keys(read_state_dict(path), keep_pos_embed=True)
    cfg = infer_config(state)
    state = {k: v for k, v in state.items() if not k.endswith("pos_embed")}
    cfg.update(beside)
    if variant is not None:
        cfg.update(encoder_kwargs(variant))
    cfg.update(overrides)
    try:
        model = build_model(cfg)
    except (TypeError, ValueError) as exc:
        source = f"config {cfg_file}" if cfg_file else "config"
        raise WeightsError(f"{path}: {source} does not fit the model ({exc})") from exc
    for key, value in model.state_dict().items():  # the model's own computed embeddings
        if key.endswith("pos_embed"):
            state[key] = value
    load_strict(model, state, path)
    return model.eval()
