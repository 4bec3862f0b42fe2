"""TerraTorch fine-tune configs of timm / SMP encoder-decoders, read into a typed description.

A TerraTorch fine-tune config (the ``config.yaml`` Lightning writes beside its checkpoints, or
the one given to ``terratorch fit``) names its network in ``model.init_args``:
``model_factory`` and ``model_args``. Two factories are understood, as TerraTorch 1.2.13 builds
them:

- ``SMPModelFactory``: ``getattr(smp, model)(encoder_name=backbone, in_channels=in_channels or
  len(bands), classes=num_classes, **smp_*)``, wrapped so that its keys start ``smp_model.``;
- ``EncoderDecoderFactory`` with a timm backbone (``timm_resnet50``, or ``resnet50``: TerraTorch's
  backbone registry finds it in timm): ``timm.create_model(name, features_only=True,
  **backbone_*)``, a decoder (``UNetDecoder``, ``UperNetDecoder``, or smp's ``FPN`` decoder) and
  TerraTorch's segmentation head; keys ``encoder.``, ``decoder.``, ``head.``.

What the processors need comes from the same file: bands, means, stds and scale from
``data.init_args`` (:mod:`geoserve.models.terratorch_data`), the tiling from
``model.init_args.tiled_inference_parameters``, class names from ``model.init_args.class_names``.

The file is untrusted: it is read as plain data (:mod:`geoserve.models.config_file`), every value
used is type- and range-checked, only the arguments listed here are passed on to timm or smp,
and anything else is a :class:`~geoserve.errors.WeightsError` naming the file, the key and what
is supported.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from geoserve.errors import WeightsError
from geoserve.models.config_file import read_mapping, section
from geoserve.models.config_values import Check, Values
from geoserve.models.terratorch_data import DataSpec, read_data

#: The model factories geoserve builds, by TerraTorch's name.
FACTORIES = ("SMPModelFactory", "EncoderDecoderFactory")
#: timm architectures, as TerraTorch's ``timm_`` backbones and SMP's ``tu-`` encoders (a
#: pretrained tag such as ``.a1_in1k`` may follow; it changes no layer).
TIMM_BACKBONES = (
    "resnet18",
    "resnet34",
    "resnet50",
    "resnet101",
    "efficientnet_b0",
    "efficientnet_b1",
    "efficientnet_b2",
    "efficientnet_b3",
    "efficientnet_b4",
    "convnext_tiny",
    "convnext_small",
    "convnext_base",
)
#: segmentation-models-pytorch's own encoders.
SMP_ENCODERS = (
    "resnet18",
    "resnet34",
    "resnet50",
    "resnet101",
    *(f"efficientnet-b{i}" for i in range(5)),
    *(f"timm-efficientnet-b{i}" for i in range(5)),
)
#: segmentation-models-pytorch architectures (``SMPModelFactory``'s ``model``).
SMP_MODELS = (
    "Unet",
    "UnetPlusPlus",
    "FPN",
    "UPerNet",
    "DeepLabV3",
    "DeepLabV3Plus",
    "Linknet",
    "PSPNet",
    "PAN",
    "MAnet",
)
#: ``EncoderDecoderFactory`` decoders; ``FPN`` is smp's, as TerraTorch's decoder registry
#: finds it (also written ``smp_FPN``).
DECODERS = ("UNetDecoder", "UperNetDecoder", "FPN")
#: How the ``EncoderDecoderFactory`` decoders normalise (smp's ``use_norm``).
_NORMS = (True, False, "batchnorm", "identity", "layernorm", "instancenorm", "inplace")
_INTERPOLATIONS = ("nearest", "bilinear", "bicubic", "area", "nearest-exact")
#: Model arguments that only matter for training: accepted and not used.
_TRAINING_ONLY = ("aux_decoders", "pretrained", "backbone_pretrained", "regression_relu")
_MAX_CHANNELS = 8192
_MAX_CLASSES = 1024


@dataclass(frozen=True)
class NetworkSpec:
    """The network a fine-tune config describes, checked.

    Attributes:
        factory: ``SMPModelFactory`` or ``EncoderDecoderFactory``.
        backbone: The backbone as the config names it.
        encoder: What builds it: the smp encoder name (``resnet50``, ``tu-convnext_tiny``), or
            the timm model name without TerraTorch's ``timm_`` prefix.
        decoder: The smp architecture (``Unet``), or the decoder (``UNetDecoder``,
            ``UperNetDecoder``, ``FPN``).
        in_channels: Input bands.
        num_classes: Output channels (one logit per class).
        backbone_kwargs: timm arguments (``EncoderDecoderFactory``).
        decoder_kwargs: Decoder arguments (``EncoderDecoderFactory``).
        head_kwargs: Segmentation head arguments (``EncoderDecoderFactory``).
        smp_kwargs: Arguments of the smp architecture (``SMPModelFactory``'s ``smp_`` keys).
        select_indices: Encoder features kept by a ``SelectIndices`` neck, if any.
        rescale: Resize logits to the input's size (bilinear) when they differ.
    """

    factory: str
    backbone: str
    encoder: str
    decoder: str
    in_channels: int
    num_classes: int
    backbone_kwargs: Mapping[str, Any] = field(default_factory=dict)
    decoder_kwargs: Mapping[str, Any] = field(default_factory=dict)
    head_kwargs: Mapping[str, Any] = field(default_factory=dict)
    smp_kwargs: Mapping[str, Any] = field(default_factory=dict)
    select_indices: tuple[int, ...] | None = None
    rescale: bool = True

    def describe(self) -> str:
        """One line: ``resnet50 + Unet (SMPModelFactory), 6 bands, 2 classes``."""
        return (
            f"{self.backbone} + {self.decoder} ({self.factory}), {self.in_channels} bands, "
            f"{self.num_classes} classes"
        )


@dataclass(frozen=True)
class FineTune:
    """A TerraTorch fine-tune config: its network and what its processors need."""

    path: Path
    network: NetworkSpec
    data: DataSpec


def read_fine_tune(path: str | Path) -> FineTune:
    """Read and check a TerraTorch fine-tune config of a timm / SMP encoder-decoder.

    Raises:
        WeightsError: the file cannot be read, or names a factory, backbone, decoder or
            argument geoserve does not build (the message lists what it does), or holds a
            value of the wrong type or out of range.
    """
    path = Path(path)
    raw = read_mapping(path)
    init = section(raw, ("model", "init_args"), path)
    v = Values(path, "model.init_args")
    task = section(raw, ("model",), path).get("class_path")
    if task is not None and not str(task).endswith("SemanticSegmentationTask"):
        raise WeightsError(
            f"{path}: model.class_path is {str(task)[:80]!r}; geoserve serves TerraTorch "
            "SemanticSegmentationTask fine-tunes"
        )
    factory = v.choice(init.get("model_factory"), "model_factory", FACTORIES)
    args = section(raw, ("model", "init_args", "model_args"), path)
    margs = Values(path, "model.init_args.model_args")
    build = _smp if factory == "SMPModelFactory" else _encoder_decoder
    network = build(args, margs)
    class_names = init.get("class_names")
    data = read_data(raw, path, network.in_channels, network.num_classes, class_names)
    return FineTune(path, network, data)


def is_encoder_decoder_config(path: str | Path) -> bool:
    """Whether a config file describes a network this module reads (not a Prithvi one).

    ``SMPModelFactory`` always; ``EncoderDecoderFactory`` unless its backbone is a Prithvi or
    TerraMind one.
    An unreadable file is not one (the caller's own reader reports it).
    """
    try:
        raw = read_mapping(Path(path))
        init = section(raw, ("model", "init_args"), Path(path))
        args = section(raw, ("model", "init_args", "model_args"), Path(path))
    except WeightsError:
        return False
    factory = init.get("model_factory")
    backbone = args.get("backbone")
    if factory == "SMPModelFactory":
        return True
    return (
        factory == "EncoderDecoderFactory"
        and isinstance(backbone, str)
        and not backbone.lower().startswith(("prithvi", "terramind"))
    )


def _smp(args: Mapping[str, Any], v: Values) -> NetworkSpec:
    """``SMPModelFactory.build_model``'s arguments (it passes only ``smp_*`` on)."""
    backbone = v.text(args.get("backbone"), "backbone")
    arch = backbone[3:].split(".")[0] if backbone.startswith("tu-") else None
    if arch not in TIMM_BACKBONES and backbone not in SMP_ENCODERS:
        raise v.error(
            "backbone",
            f"{backbone!r} is not supported; supported: {', '.join(SMP_ENCODERS)}, or tu- with "
            f"a timm model: {', '.join(TIMM_BACKBONES)}",
        )
    model = v.choice(args.get("model"), "model", SMP_MODELS)
    bands = args.get("bands")
    if not isinstance(bands, list) or not bands:
        raise v.error("bands", "must be a non-empty list (SMPModelFactory requires it)")
    in_channels = args.get("in_channels")
    if in_channels is None:
        in_channels = len(bands)
    smp_kwargs = {
        key[4:]: v.plain(value, key) for key, value in args.items() if key.startswith("smp_")
    }
    return NetworkSpec(
        factory="SMPModelFactory",
        backbone=backbone,
        encoder=backbone,
        decoder=model,
        in_channels=v.integer(in_channels, "in_channels", 1, _MAX_CHANNELS),
        num_classes=v.integer(args.get("num_classes", 1), "num_classes", 1, _MAX_CLASSES),
        smp_kwargs=smp_kwargs,
    )


def _encoder_decoder(args: Mapping[str, Any], v: Values) -> NetworkSpec:
    """``EncoderDecoderFactory.build_model``'s arguments for a timm backbone."""
    backbone = v.text(args.get("backbone"), "backbone")
    name = backbone[len("timm_") :] if backbone.startswith("timm_") else backbone
    if name.split(".")[0] not in TIMM_BACKBONES:
        raise v.error(
            "backbone",
            f"{backbone!r} is not supported with EncoderDecoderFactory; supported: timm "
            f"backbones {', '.join('timm_' + b for b in TIMM_BACKBONES)} (the prefix optional)",
        )
    decoder = v.text(args.get("decoder"), "decoder")
    decoder = "FPN" if decoder == "smp_FPN" else decoder
    if decoder not in DECODERS:
        raise v.error(
            "decoder",
            f"{decoder!r} is not supported with a timm backbone; supported: "
            f"{', '.join(DECODERS)} (or smp_FPN)",
        )
    parts = {prefix: _prefixed(args, prefix, v) for prefix in ("backbone_", "decoder_", "head_")}
    _refuse_unknown(args, v)
    checks = _checks(v)
    given = {k: x for k, x in parts["backbone_"].items() if x is not None}  # timm drops None
    backbone_kwargs = v.only(given, checks["backbone"], "backbone_", "timm backbones")
    backbone_kwargs.pop("pretrained", None)  # the checkpoint holds the weights
    decoder_kwargs = v.only(parts["decoder_"], checks[decoder], "decoder_", decoder)
    head_kwargs = v.only(parts["head_"], checks["head"], "head_", "the segmentation head")
    if decoder == "UNetDecoder" and "channels" not in decoder_kwargs:
        raise v.error("decoder_channels", "is required for UNetDecoder (one per encoder feature)")
    if args.get("num_classes") is None:
        raise v.error("num_classes", "is required for segmentation")
    return NetworkSpec(
        factory="EncoderDecoderFactory",
        backbone=backbone,
        encoder=name,
        decoder=decoder,
        in_channels=backbone_kwargs.get("in_chans", 3),
        num_classes=v.integer(args["num_classes"], "num_classes", 1, _MAX_CLASSES),
        backbone_kwargs=backbone_kwargs,
        decoder_kwargs=decoder_kwargs,
        head_kwargs=head_kwargs,
        select_indices=_necks(args.get("necks"), v),
        rescale=v.boolean(args.get("rescale", True), "rescale"),
    )


def _prefixed(args: Mapping[str, Any], prefix: str, v: Values) -> dict[str, Any]:
    """``<prefix>x`` keys, and the ``<prefix>kwargs`` mapping TerraTorch also takes."""
    out = {k[len(prefix) :]: val for k, val in args.items() if k.startswith(prefix)}
    given = out.pop("kwargs", None)
    if given:
        if not isinstance(given, Mapping):
            raise v.error(f"{prefix}kwargs", "must be a mapping")
        out.update({str(k): val for k, val in given.items()})
    return out


def _refuse_unknown(args: Mapping[str, Any], v: Values) -> None:
    known = {"backbone", "decoder", "num_classes", "necks", "rescale", *_TRAINING_ONLY}
    for key, value in args.items():
        if key.startswith(("backbone_", "decoder_", "head_")) or key in known:
            continue
        if key in ("image_size_out", "peft_config", "num_outputs") and value is None:
            continue
        raise v.error(
            str(key)[:60],
            "is not supported with a timm backbone (geoserve builds segmentation models from "
            "backbone_*, decoder_*, head_*, num_classes, necks: SelectIndices, rescale)",
        )


def _checks(v: Values) -> dict[str, dict[str, Check]]:
    """What each part takes from the config, and how each value is checked.

    Every size is bounded, so a config cannot make the model allocate or compute without
    limit (the pool scales and dropouts hold no weights the checkpoint would check).
    """
    channel = partial(v.integer, lo=1, hi=_MAX_CHANNELS)
    channels = partial(v.integers, lo=1, hi=_MAX_CHANNELS)
    fraction = partial(v.number, lo=0.0, hi=1.0)
    return {
        "backbone": {
            "in_chans": channel,
            "pretrained": v.plain,  # not used: the checkpoint holds the weights
            "out_indices": partial(v.integers, lo=0, hi=7),
            "output_stride": partial(v.choice, options=(8, 16, 32)),
            "drop_rate": fraction,  # no effect in eval mode; passed as given
            "drop_path_rate": fraction,
        },
        "UNetDecoder": {
            "channels": channels,
            "use_batchnorm": partial(v.choice, options=_NORMS),
            "attention_type": partial(v.choice, options=(None, "scse")),
        },
        "UperNetDecoder": {
            "channels": channel,
            "pool_scales": partial(v.integers, lo=1, hi=64),
            "align_corners": v.boolean,
        },
        "FPN": {
            "decoder_pyramid_channels": channel,
            "decoder_segmentation_channels": channel,
            "decoder_merge_policy": partial(v.choice, options=("add", "cat")),
            "decoder_dropout": fraction,
            "decoder_interpolation": partial(v.choice, options=_INTERPOLATIONS),
        },
        "head": {"channel_list": channels, "dropout": fraction},
    }


def _necks(necks: Any, v: Values) -> tuple[int, ...] | None:
    """Only ``SelectIndices`` (no weights) goes between a CNN backbone and its decoder."""
    if necks is None or necks == []:
        return None
    if (
        not isinstance(necks, Sequence)
        or len(necks) != 1
        or not isinstance(necks[0], Mapping)
        or necks[0].get("name") != "SelectIndices"
        or set(necks[0]) != {"name", "indices"}
    ):
        raise v.error("necks", "only one SelectIndices neck (name, indices) is supported")
    return tuple(v.integers(necks[0]["indices"], "necks[0].indices", -8, 7))
