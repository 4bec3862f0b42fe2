"""TerraMind architecture from a TerraTorch fine-tune config (``model.init_args.model_args``).

Read: ``backbone`` (``terramind_v1_tiny|small|base|large``, or one of them with ``_tim``: a
"Thinking in Modalities" backbone, whose ``backbone_tim_*`` arguments
:mod:`~geoserve.models.terramind.tim_config` reads), ``backbone_modalities``,
``backbone_merge_method``, ``backbone_bands`` (a band subset per modality: fewer input
channels), ``backbone_img_size``, ``necks``, ``decoder`` (``UperNetDecoder``/``UNetDecoder``)
with ``decoder_channels``/``decoder_pool_scales``/``decoder_align_corners``, ``head_dropout``,
``head_channel_list`` and ``num_classes``. With no decoder the config describes the encoder
alone. Other ``backbone_*``/``decoder_*``/``head_*`` keys are refused by name, except the
training-only ones (``backbone_pretrained``, ``backbone_ckpt_path``, ``freeze_*``...).

The file is untrusted: read as plain data (see :mod:`geoserve.models.config_file`), every
value type-checked and bounded, errors are :class:`~geoserve.errors.WeightsError` naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from geoserve.errors import WeightsError
from geoserve.models.config_file import read_mapping, section
from geoserve.models.terramind.tim_config import TIM_ARGS, TiMOptions, read_tim_options
from geoserve.models.terramind.variants import MODALITIES, VARIANTS, modality_key

_TRAINING_ONLY: tuple[str, ...] = ("backbone_pretrained", "backbone_ckpt_path", "rescale")
_TRAINING_ONLY += ("backbone_drop_path", "backbone_modality_drop_rate")
_DECODER_ARGS = {"decoder_channels": "channels", "decoder_pool_scales": "pool_scales"}
_DECODER_ARGS["decoder_align_corners"] = "align_corners"
_MAX_CLASSES = 4096


@dataclass
class TerraMindSpec:
    """What a config says about a TerraMind model (``None``: not said, read the weights)."""

    variant: str | None = None
    modalities: list[str] | None = None
    bands: dict[str, list[str]] = field(default_factory=dict)
    merge: str | None = None
    img_size: int | None = None
    necks: list[dict[str, Any]] | None = None
    decoder: str | None = None
    decoder_args: dict[str, Any] = field(default_factory=dict)
    head_args: dict[str, Any] = field(default_factory=dict)
    num_classes: int | None = None
    tim: TiMOptions | None = None  # a TiM backbone (``terramind_v1_<size>_tim``)


def is_terramind_config(raw: Mapping[str, Any]) -> bool:
    """Whether a parsed config names a TerraMind backbone."""
    args = _model_args(raw)
    backbone = args.get("backbone") if isinstance(args, Mapping) else None
    return isinstance(backbone, str) and backbone.startswith("terramind")


def _model_args(raw: Mapping[str, Any]) -> Any:
    model = raw.get("model")
    init = model.get("init_args") if isinstance(model, Mapping) else None
    return init.get("model_args") if isinstance(init, Mapping) else None


def read_spec(path: Path) -> TerraMindSpec:
    """Parse a TerraTorch fine-tune config file naming a TerraMind backbone.

    Raises:
        WeightsError: unreadable file, another backbone, or a value TerraMind cannot take.
    """
    raw = read_mapping(path)
    return parse_spec(section(raw, ("model", "init_args", "model_args"), path), path)


def parse_spec(args: Mapping[str, Any], path: Path | str) -> TerraMindSpec:
    """The :class:`TerraMindSpec` of ``model_args`` (see the module docstring)."""

    def bad(key: str, want: str) -> WeightsError:
        return WeightsError(f"{path}: {key} must be {want}, not {args.get(key)!r:.60}")

    spec = TerraMindSpec()
    backbone = args.get("backbone")
    variant = backbone.removesuffix("_tim") if isinstance(backbone, str) else backbone
    if variant not in VARIANTS:
        raise bad("backbone", f"one of {', '.join(VARIANTS)} (a TiM backbone: with _tim)")
    spec.variant = str(variant)
    spec.modalities = _read_modalities(args, bad, path)
    bands = args.get("backbone_bands")
    if bands is not None:
        if not isinstance(bands, Mapping) or not all(
            isinstance(v, list) and v and all(isinstance(b, str) for b in v) for v in bands.values()
        ):
            raise bad("backbone_bands", "a mapping of modality to a list of band names")
        spec.bands = {str(k): list(v) for k, v in bands.items()}
        _check_band_keys(spec, path)
    merge = args.get("backbone_merge_method")
    if merge is not None and merge not in ("mean", "max", "concat"):
        raise bad("backbone_merge_method", "mean, max or concat")
    spec.merge = merge
    img = args.get("backbone_img_size")
    if img is not None and (not _int(img) or img % 16 or not 16 <= img <= 4096):
        raise bad("backbone_img_size", "a multiple of 16 from 16 to 4096")
    spec.img_size = img
    if backbone != variant:
        spec.tim = read_tim_options(args, spec.modalities, path, bad)
    _read_head(args, spec, bad, path)
    return spec


def _read_modalities(args: Mapping[str, Any], bad: Any, path: Path | str) -> list[str] | None:
    mods = args.get("backbone_modalities")
    if mods is None:
        return None
    if not isinstance(mods, list) or not mods or not all(isinstance(m, str) for m in mods):
        raise bad("backbone_modalities", "a list of modality names")
    for m in mods:
        try:
            key = modality_key(m)
        except ValueError as exc:
            raise WeightsError(f"{path}: backbone_modalities: {exc}") from None
        if key.startswith("tok_"):
            image = ", ".join(n for n, i in MODALITIES.items() if not i.tokenized)
            raise WeightsError(
                f"{path}: modality {m} needs TerraMind's tokenizer, which geoserve does not "
                f"run; image modalities: {image}"
            )
    return list(mods)


def _check_band_keys(spec: TerraMindSpec, path: Path | str) -> None:
    """``backbone_bands`` keys are modality names as ``backbone_modalities`` spells them.

    (TerraTorch looks each key up by that spelling, and fails on any other.)
    """
    stray = [k for k in spec.bands if spec.modalities is not None and k not in spec.modalities]
    if stray:
        raise WeightsError(
            f"{path}: backbone_bands names {stray[0]!r}, which is not one of "
            f"backbone_modalities ({', '.join(spec.modalities or ())}; spelt the same)"
        )


def _read_head(args: Mapping[str, Any], spec: TerraMindSpec, bad: Any, path: Path | str) -> None:
    necks = args.get("necks")
    if necks is not None:
        if not isinstance(necks, list) or not all(
            isinstance(n, Mapping) and isinstance(n.get("name"), str) for n in necks
        ):
            raise bad("necks", "a list of mappings with a name")
        spec.necks = [dict(n) for n in necks]
    decoder = args.get("decoder")
    if decoder is not None and decoder not in ("UperNetDecoder", "UNetDecoder"):
        raise bad("decoder", "UperNetDecoder or UNetDecoder")
    spec.decoder = decoder
    for key, name in _DECODER_ARGS.items():
        if key in args:
            spec.decoder_args[name] = _checked_decoder_arg(key, args[key], bad)
    if "head_dropout" in args:
        value = args["head_dropout"]
        if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value < 1:
            raise bad("head_dropout", "a number from 0 to 1")
        spec.head_args["dropout"] = float(value)
    if "head_channel_list" in args:
        value = args["head_channel_list"]
        if not isinstance(value, list) or not all(_int(v) and 1 <= v <= 8192 for v in value):
            raise bad("head_channel_list", "a list of channel counts")
        spec.head_args["channel_list"] = list(value)
    classes = args.get("num_classes")
    if classes is not None and (not _int(classes) or not 1 <= classes <= _MAX_CLASSES):
        raise bad("num_classes", f"an integer from 1 to {_MAX_CLASSES}")
    spec.num_classes = classes
    unknown = sorted(
        k
        for k in args
        if k.startswith(("backbone_", "decoder_", "head_"))
        and k not in _DECODER_ARGS
        and k not in _TRAINING_ONLY
        and (spec.tim is None or k not in TIM_ARGS)
        and k
        not in (
            "backbone_modalities",
            "backbone_bands",
            "backbone_merge_method",
            "backbone_img_size",
            "head_dropout",
            "head_channel_list",
        )
    )
    if unknown:
        raise WeightsError(f"{path}: TerraMind does not take {', '.join(unknown)}")


def _checked_decoder_arg(key: str, value: Any, bad: Any) -> Any:
    if key == "decoder_align_corners":
        if not isinstance(value, bool):
            raise bad(key, "true or false")
        return value
    if _int(value) and 1 <= value <= 8192:
        return value
    if isinstance(value, list) and value and all(_int(v) and 1 <= v <= 8192 for v in value):
        return list(value)
    raise bad(key, "a channel count or a list of them")


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
