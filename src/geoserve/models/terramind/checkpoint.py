"""Loading TerraMind checkpoints: the encoder alone, or a TerraTorch segmentation fine-tune.

Layouts:

- **encoder only, bare keys** (``encoder_embeddings.<key>.proj.weight``, ``encoder.0...``,
  ``encoder_norm``), e.g. the published pretrained files. Their pretraining-only parts
  (decoder, decoder embeddings, tokenizers) and embeddings of modalities not asked for are
  dropped; without a config every image modality present is kept.
- **Lightning fine-tune** (``state_dict`` with ``model.encoder.*``, ``model.neck.*``,
  ``model.decoder.*``, ``model.head.*``); ``aux_heads`` are dropped (training only). With only
  ``model.encoder.*`` keys it is the encoder alone.

A TiM fine-tune (``backbone: terramind_v1_<size>_tim``) has the same layout, its encoder
holding the generator too (``model.encoder.sampler.model.*``) and the TiM modalities' token
embeddings (``encoder_embeddings.tok_*``); it needs its config, which says what is generated
(:mod:`geoserve.models.terramind.tim`).

The architecture comes from the weights' shapes (width, depth, gated MLP, biases, modalities
and their channel counts, the position grid, decoder kind and channels, head, classes), then
from a TerraTorch config (beside the checkpoint as ``config.yaml``/``config.json``, or named),
which adds what shapes cannot tell: the variant's head count if the width is unusual, the
modality names and order, the merge method, the neck list. The model is loaded strictly;
missing, unexpected and mis-shaped keys are named.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from geoserve.errors import WeightsError
from geoserve.models.state_dict import check_matches, load_strict, read_state_dict
from geoserve.models.terramind.config import TerraMindSpec, read_spec
from geoserve.models.terramind.encoder import TerraMindEncoder
from geoserve.models.terramind.segmentation import TerraMindSegmentation
from geoserve.models.terramind.tim_config import TIM_KEYS
from geoserve.models.terramind.variants import (
    FEATURE_INDICES,
    PATCH_SIZE,
    VARIANTS,
    modality_key,
    modality_of_key,
)

_PRETRAINING_ONLY = (
    "decoder_embeddings.",
    "decoder.",
    "decoder_norm.",
    "tokenizer.",
    "decoder_proj_context.",
    "mask_token",
    "to_logits",
)
_HEADS = {v["dim"]: v["num_heads"] for v in VARIANTS.values()}
_EMBED = re.compile(r"^encoder\.encoder_embeddings\.([^.]+)\.")


def is_terramind_state(keys: Any) -> bool:
    """Whether checkpoint keys look like TerraMind's (a per-modality ``encoder_embeddings``)."""
    return any("encoder_embeddings." in k for k in keys)


def normalize_keys(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Any layout -> the fine-tune's names (``encoder.``, ``neck.``, ``decoder.``, ``head.``)."""
    keys = [k[len("model.") :] if k.startswith("model.") else k for k in state]
    bare = any(k.startswith("encoder_embeddings.") for k in keys)
    out: dict[str, torch.Tensor] = {}
    for k, v in zip(keys, state.values(), strict=True):
        if k.startswith(("aux_heads.", "criterion.", "train_metrics", "val_metrics", "loss")):
            continue
        if bare:
            if k.startswith(_PRETRAINING_ONLY):
                continue
            k = "encoder." + k
        if k.startswith("encoder.tokenizer."):
            continue
        out[k] = v
    return out


def infer_spec(state: Mapping[str, torch.Tensor], path: Path) -> dict[str, Any]:
    """Architecture arguments read off the weights' names and shapes."""
    embeds = list(dict.fromkeys(m.group(1) for k in state if (m := _EMBED.match(k))))
    if not embeds:
        raise WeightsError(f"{path}: no TerraMind patch embeddings (encoder_embeddings.*)")
    proj = state.get(f"encoder.encoder_embeddings.{embeds[0]}.proj.weight")
    if proj is None:
        raise WeightsError(f"{path}: {embeds[0]} is not an image embedding (no proj.weight)")
    dim = int(proj.shape[0])
    blocks = {int(m.group(1)) for k in state if (m := re.match(r"^encoder\.encoder\.(\d+)\.", k))}
    if not blocks:
        raise WeightsError(f"{path}: no transformer blocks (encoder.encoder.N.*)")
    channels = {}
    for key in embeds:
        w = state.get(f"encoder.encoder_embeddings.{key}.proj.weight")
        if w is None:  # a tokenized modality (LULC, NDVI): the tokenizer is not run here
            continue
        channels[key] = int(w.shape[1]) // (PATCH_SIZE * PATCH_SIZE)
    pos = state.get(f"encoder.encoder_embeddings.{embeds[0]}.pos_emb")
    grid = round(pos.shape[1] ** 0.5) if pos is not None else 14
    spec: dict[str, Any] = dict(
        channels=channels,
        dim=dim,
        depth=max(blocks) + 1,
        num_heads=_HEADS.get(dim),
        gated_mlp="encoder.encoder.0.mlp.fc3.weight" in state,
        bias="encoder.encoder.0.attn.qkv.bias" in state,
        merge="concat" if "encoder.missing_mod_token" in state else "mean",
        img_size=grid * PATCH_SIZE,
        num_register_tokens=int(state["encoder.register_tokens"].shape[1])
        if "encoder.register_tokens" in state
        else 0,
    )
    if "head.head.2.weight" in state:
        spec.update(_infer_head(state))
    return spec


def _infer_head(state: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    out: dict[str, Any] = {"num_classes": int(state["head.head.2.weight"].shape[0])}
    pyramid = sorted(
        int(m.group(1)) for k in state if (m := re.match(r"^neck\.(\d+)\.fpn1\.0\.weight$", k))
    )
    necks: list[dict[str, Any]] = [{"name": "SelectIndices"}, {"name": "ReshapeTokensToImage"}]
    if pyramid:
        necks += [{"name": "LearnedInterpolateToPyramidal"}]
    out["necks"] = necks
    if "decoder.fpn_bottleneck.conv.weight" in state:
        out["decoder"] = "UperNetDecoder"
        out["decoder_args"] = {
            "channels": int(state["decoder.fpn_bottleneck.conv.weight"].shape[0])
        }
    else:
        widths: list[int] = []
        while f"decoder.decoder.blocks.{len(widths)}.conv1.0.weight" in state:
            widths.append(
                int(state[f"decoder.decoder.blocks.{len(widths)}.conv1.0.weight"].shape[0])
            )
        out["decoder"] = "UNetDecoder"
        out["decoder_args"] = {"channels": widths}
    channel_list: list[int] = []
    while f"head.head.0.{len(channel_list)}.0.weight" in state:
        channel_list.append(int(state[f"head.head.0.{len(channel_list)}.0.weight"].shape[0]))
    out["head_args"] = {"channel_list": channel_list} if channel_list else {}
    return out


def find_config(path: Path) -> Path | None:
    """A TerraTorch config beside the checkpoint naming a TerraMind backbone, if any."""
    from geoserve.models.config_file import read_mapping
    from geoserve.models.terramind.config import is_terramind_config

    for name in ("config.yaml", "config.json"):
        cfg = path.parent / name
        if cfg.is_file() and is_terramind_config(read_mapping(cfg)):
            return cfg
    return None


def load_terramind(path: str | Path, config: str | os.PathLike[str] | None = None) -> nn.Module:
    """Build the TerraMind model a checkpoint holds and load it strictly.

    Returns a :class:`TerraMindSegmentation` for a fine-tune, a :class:`TerraMindEncoder`
    for an encoder alone.

    Raises:
        WeightsError: unreadable checkpoint or config, or weights that do not fit.
    """
    path = Path(path)
    cfg_path = Path(config) if config is not None else find_config(path)
    spec = read_spec(cfg_path) if cfg_path is not None else TerraMindSpec()
    state = normalize_keys(read_state_dict(path))
    if spec.tim is None and any(k.startswith("encoder.sampler.model.") for k in state):
        given = f"config {cfg_path} names no TiM backbone" if cfg_path else "no config with it"
        raise WeightsError(
            f"{path}: a TerraMind TiM fine-tune (it holds encoder.sampler.model.*), but {given}; "
            "its config names backbone terramind_v1_<size>_tim and backbone_tim_modalities"
        )
    names = _modality_names(state, spec, path)
    keep = {modality_key(n) for n in names}
    keep |= {TIM_KEYS[m] for m in spec.tim.modalities} if spec.tim is not None else set()
    present = {m.group(1) for k in state if (m := _EMBED.match(k))}
    absent = [n for n in names if modality_key(n) not in present]
    if absent:
        have = sorted(present)
        raise WeightsError(f"{path}: no patch embedding for modalities {absent} (it has {have})")
    state = {k: v for k, v in state.items() if not (m := _EMBED.match(k)) or m.group(1) in keep}
    arch = infer_spec(state, path)
    if spec.variant is not None:
        arch.update({k: v for k, v in VARIANTS[spec.variant].items()})
    if arch["num_heads"] is None:
        raise WeightsError(
            f"{path}: width {arch['dim']} is no TerraMind v1 variant; name the backbone in a config"
        )
    channels = arch.pop("channels")
    encoder = dict(
        modalities={n: channels.get(modality_key(n), 0) for n in names},
        merge=spec.merge or arch.pop("merge"),
        img_size=spec.img_size or arch.pop("img_size"),
        **{k: arch.pop(k) for k in ("dim", "depth", "num_heads", "gated_mlp", "bias")},
        num_register_tokens=arch.pop("num_register_tokens"),
    )
    tokenized = [n for n, c in encoder["modalities"].items() if not c]
    if tokenized:
        raise WeightsError(f"{path}: modalities {tokenized} need TerraMind's tokenizer")
    source = f"{path} (config {cfg_path})" if cfg_path else str(path)
    try:  # first on the meta device: a config's sizes cost no memory until the weights fit
        with torch.device("meta"):
            probe = _build(encoder, arch, spec)
    except (TypeError, ValueError, KeyError, IndexError) as exc:
        raise WeightsError(f"{source}: the architecture does not fit ({exc})") from exc
    if isinstance(probe, TerraMindEncoder):
        state = {k[len("encoder.") :]: v for k, v in state.items() if k.startswith("encoder.")}
    tables = {k: v for k, v in probe.state_dict().items() if k.endswith("pos_emb")}
    check_matches(probe.state_dict(), {**tables, **state}, source)
    model = _build(encoder, arch, spec)
    for key, value in model.state_dict().items():  # fixed sin-cos tables: the model's own
        if key.endswith("pos_emb") and key not in state:
            state[key] = value
    load_strict(model, state, source)
    return model.eval()


def _modality_names(
    state: Mapping[str, torch.Tensor], spec: TerraMindSpec, path: Path
) -> list[str]:
    if spec.modalities is not None:
        return list(spec.modalities)
    keys = list(dict.fromkeys(m.group(1) for k in state if (m := _EMBED.match(k))))
    names = []
    for key in keys:
        try:
            mod = modality_of_key(key)
        except KeyError:
            raise WeightsError(f"{path}: unknown TerraMind embedding {key!r}") from None
        if not mod.tokenized:
            names.append(mod.name)
    return names


def _build(encoder: dict[str, Any], arch: dict[str, Any], spec: TerraMindSpec) -> nn.Module:
    classes = spec.num_classes or arch.get("num_classes")
    backbone: dict[str, Any] | TerraMindEncoder = encoder
    if spec.tim is not None:
        backbone = _tim_encoder(encoder, spec)
    if classes is None and spec.decoder is None:
        return backbone if isinstance(backbone, TerraMindEncoder) else TerraMindEncoder(**encoder)
    if classes is None:
        raise ValueError("a fine-tune needs num_classes (config) or a head (weights)")
    necks = spec.necks if spec.necks is not None else arch["necks"]
    necks = [dict(n) for n in necks]
    for n in necks:
        if n["name"] == "SelectIndices" and "indices" not in n:
            n["indices"] = list(FEATURE_INDICES[encoder["depth"]])
    return TerraMindSegmentation(
        backbone,
        necks=necks,
        decoder=spec.decoder or arch["decoder"],
        num_classes=classes,
        decoder_args={**arch.get("decoder_args", {}), **spec.decoder_args},
        head_args={**arch.get("head_args", {}), **spec.head_args},
    )


def _tim_encoder(encoder: dict[str, Any], spec: TerraMindSpec) -> TerraMindEncoder:
    """The TiM backbone of a ``terramind_v1_<size>_tim`` config (inputs: all their bands)."""
    from geoserve.models.terramind.generation import DECODER_DEPTH
    from geoserve.models.terramind.tim import TerraMindTiMEncoder

    assert spec.tim is not None
    assert spec.variant is not None
    if encoder["num_register_tokens"]:
        raise ValueError("a TiM backbone has no register tokens")
    return TerraMindTiMEncoder(
        list(encoder["modalities"]),
        spec.tim,
        decoder_depth=DECODER_DEPTH[spec.variant],
        **{k: encoder[k] for k in ("dim", "depth", "num_heads", "gated_mlp", "bias", "merge")},
        img_size=encoder["img_size"],
    )
