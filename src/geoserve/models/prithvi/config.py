"""Prithvi architecture arguments from config files.

Three published layouts are understood: an HF ``config.json`` (``pretrained_cfg``), a v1
``config.yaml`` (``model_args``) and a TerraTorch fine-tune ``config.yaml``
(``model.init_args.model_args``). A file passed explicitly (``load_checkpoint(config=FILE)``)
may also be a flat mapping of architecture arguments, the same keys ``config`` takes as a dict.

Config files are untrusted input: YAML is read with ``yaml.safe_load`` (plain data, never Python
objects), files over :data:`MAX_CONFIG_BYTES` are refused unread, and unreadable or malformed
content is a :class:`~geoserve.errors.WeightsError` naming the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from geoserve.errors import WeightsError
from geoserve.models.config_file import MAX_CONFIG_BYTES, read_mapping, section
from geoserve.models.prithvi.variants import VARIANTS

__all__ = ["MAX_CONFIG_BYTES", "load_config_file", "parse_config", "read_config"]
CONFIG_SUFFIXES = (".json", ".yaml", ".yml")
_ARCH_KEYS = (
    "img_size",
    "num_frames",
    "in_chans",
    "embed_dim",
    "depth",
    "num_heads",
    "decoder_embed_dim",
    "decoder_depth",
    "decoder_num_heads",
    "coords_encoding",
    "coords_scale_learn",
    "mean",
    "std",
    "bands",
)
#: Bounds of the integer architecture arguments: a config file is untrusted, and an absurd size
#: would allocate gigabytes before any shape check (the largest published Prithvi: 1280 x 32).
_INT_BOUNDS = {
    "img_size": 4096,
    "num_frames": 64,
    "in_chans": 256,
    "embed_dim": 8192,
    "depth": 128,
    "num_heads": 128,
    "decoder_embed_dim": 8192,
    "decoder_depth": 128,
    "decoder_num_heads": 128,
    "patch_size": 256,
}
_LAYOUTS = (
    "an HF config.json (pretrained_cfg), a v1 config.yaml (model_args), "
    "a TerraTorch config.yaml (model.init_args.model_args)"
)


def read_config(path: Path) -> dict[str, Any]:
    """Architecture arguments from a config next to the checkpoint, if one is there."""
    for name in ("config.json", "config.yaml"):
        cfg_path = path.parent / name
        if cfg_path.is_file():
            return parse_config(cfg_path)
    return {}


def load_config_file(cfg_path: Path) -> dict[str, Any]:
    """Architecture arguments from a config file named by the caller.

    One of the published layouts, or a flat mapping of architecture arguments.

    Raises:
        WeightsError: the file is missing, unreadable, malformed or holds no arguments.
    """
    if cfg_path.suffix.lower() not in CONFIG_SUFFIXES:
        raise WeightsError(
            f"{cfg_path}: not a config file; expected {', '.join(CONFIG_SUFFIXES)} ({_LAYOUTS}, "
            "or a flat mapping of architecture arguments)"
        )
    cfg = parse_config(cfg_path, flat=True)
    if not cfg:
        raise WeightsError(f"{cfg_path}: no architecture arguments found (expected {_LAYOUTS})")
    return cfg


def parse_config(cfg_path: Path, *, flat: bool = False) -> dict[str, Any]:
    """Architecture arguments from a config file.

    Reads an HF ``config.json`` (``pretrained_cfg``), a v1 ``config.yaml`` (``model_args``) or
    a TerraTorch fine-tune ``config.yaml`` (``model.init_args.model_args``); with ``flat``, a
    mapping in none of these layouts is taken as architecture arguments as it is.

    Raises:
        WeightsError: the file cannot be read or parsed, or its content is not a mapping.
    """
    return _checked(_parse(cfg_path, flat), cfg_path)


def _checked(cfg: dict[str, Any], cfg_path: Path) -> dict[str, Any]:
    """Refuse integer arguments that are not integers in their bounds, naming the file."""
    for key, most in _INT_BOUNDS.items():
        value = cfg.get(key)
        if value is None or key == "patch_size" and isinstance(value, list | tuple):
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= most:
            raise WeightsError(
                f"{cfg_path}: {key} must be an integer from 1 to {most}, not {value!r:.40}"
            )
    return cfg


def _parse(cfg_path: Path, flat: bool) -> dict[str, Any]:
    raw = read_mapping(cfg_path)
    layout = next((k for k in ("pretrained_cfg", "model_args") if k in raw), None)
    if layout is None and flat and "model" not in raw:
        return {str(k): v for k, v in raw.items()}
    if layout is None:
        return _terratorch(section(raw, ("model", "init_args", "model_args"), cfg_path))
    src = section(raw, (layout,), cfg_path)
    cfg = {key: src[key] for key in _ARCH_KEYS if key in src}
    if "patch_size" in src:
        ps = src["patch_size"]
        if isinstance(ps, list | tuple) and ps:
            ps = ps[-1]
        if not isinstance(ps, int) or isinstance(ps, bool):
            raise WeightsError(f"{cfg_path}: patch_size must be an integer or a list of them")
        cfg["patch_size"] = ps
    return cfg


def _terratorch(src: Mapping[str, Any]) -> dict[str, Any]:
    cfg: dict[str, Any] = {}
    backbone = src.get("backbone")
    if isinstance(backbone, str) and backbone in VARIANTS:
        cfg.update(VARIANTS[backbone])
    for key in ("num_frames", "img_size", "in_chans"):
        if f"backbone_{key}" in src:
            cfg[key] = src[f"backbone_{key}"]
    if "num_classes" in src:
        cfg["num_classes"] = src["num_classes"]
    return cfg
