"""A TerraMind fine-tune served from its TerraTorch config: the processors its data section says.

TerraTorch's multimodal data module (``GenericMultiModalDataModule``) keeps per-modality
values: ``means`` and ``stds`` map each modality to one value per band, ``dataset_bands`` /
``output_bands`` (or ``predict_*``) map a modality to the bands its file holds / the model
takes, ``constant_scale`` is one number or one per modality. A modality the data section says
nothing about is read whole (the model's channel count of its file's bands, in order) and
normalised with TerraMind's published pretraining statistics of the bands it takes
(``backbone_bands`` names them, else all of the modality's bands). Tiling comes from
``model.init_args.tiled_inference_parameters`` (TerraTorch's defaults: 224-px crops, stride
192) and the classes from ``class_names``.

One modality: a :class:`~geoserve.processors.GeoTiffPatcher` (a file in, as a single-input
model). Several: a :class:`~geoserve.processors.MultimodalPatcher` keyed by the config's
modality names, each optional (TerraMind merges whichever modalities are given).

A TiM fine-tune (``terramind_v1_<size>_tim``) reads the same way: its inputs are
``backbone_modalities`` (each with all of its pretrained bands, in their order), and what it
generates from them (``backbone_tim_modalities``) is no input.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from geoserve.errors import WeightsError
from geoserve.models.config_file import read_mapping, section
from geoserve.models.config_values import Values
from geoserve.models.terramind.config import TerraMindSpec, parse_spec
from geoserve.models.terramind.variants import modality_key, modality_of_key
from geoserve.models.terratorch_data import read_class_names, tiling

if TYPE_CHECKING:
    from geoserve.processors import InputProcessor, SegmentationReassembler


def terramind_processors(path: Path) -> tuple[InputProcessor, SegmentationReassembler, str]:
    """The input and output processors of a TerraMind fine-tune config, and a description.

    Raises:
        WeightsError: the config lacks what serving needs (modalities, classes) or holds a
            value of the wrong type or size, named with its key.
    """
    from geoserve.processors import (
        GeoTiffPatcher,
        Modality,
        MultimodalPatcher,
        SegmentationReassembler,
    )

    raw = read_mapping(path)
    spec = parse_spec(section(raw, ("model", "init_args", "model_args"), path), path)
    if not spec.modalities:
        raise WeightsError(f"{path}: model_args.backbone_modalities must name the modalities")
    if spec.num_classes is None or spec.decoder is None:
        raise WeightsError(f"{path}: a served fine-tune needs model_args.decoder and num_classes")
    data = section(raw, ("data", "init_args"), path)
    init = section(raw, ("model", "init_args"), path)
    patch, stride, blend = tiling(init.get("tiled_inference_parameters"), path, default=(224, 192))
    parts = [_modality(name, spec, data, path) for name in spec.modalities]
    out = SegmentationReassembler(
        classes=read_class_names(init.get("class_names"), spec.num_classes, path)
    )
    describe = f"TerraMind {spec.variant} ({', '.join(spec.modalities)}) + {spec.decoder}"
    if spec.tim is not None:
        describe += f", thinking in {', '.join(spec.tim.modalities)} (TiM)"
    if len(parts) == 1:
        m = parts[0]
        single = GeoTiffPatcher(
            bands=m["bands"],
            mean=m["mean"],
            std=m["std"],
            scale_factor=m["scale"],
            patch_size=patch,
            stride=stride,
            blend=blend,
        )
        return single, out, describe
    modalities = tuple(
        Modality(
            m["name"],
            bands=m["bands"],
            mean=m["mean"],
            std=m["std"],
            scale_factor=m["scale"],
            required=False,
        )  # fmt: skip
        for m in parts
    )
    multi = MultimodalPatcher(modalities=modalities, patch_size=patch, stride=stride, blend=blend)
    return multi, out, describe


def _per_modality(data: Mapping[str, Any], key: str, name: str, v: Values) -> Any:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise v.error(key, "must map each modality to its values (a multimodal data module)")
    return value.get(name)


def _names(value: Any, key: str, v: Values) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(b, str) for b in value):
        raise v.error(key, "must be a list of band names")
    return [v.text(b, key) for b in value]


def _modality(
    name: str, spec: TerraMindSpec, data: Mapping[str, Any], path: Path
) -> dict[str, Any]:
    v = Values(path, "data.init_args")
    info = modality_of_key(modality_key(name))
    taken = list(spec.bands.get(name) or info.bands)
    dataset = next(
        (b for k in ("predict_dataset_bands", "dataset_bands")
         if (b := _per_modality(data, k, name, v)) is not None),
        None,
    )  # fmt: skip
    output = next(
        (b for k in ("predict_output_bands", "output_bands")
         if (b := _per_modality(data, k, name, v)) is not None),
        None,
    )  # fmt: skip
    if output is not None:
        taken = _names(output, f"output_bands.{name}", v)
    bands: tuple[int, ...] | None = None
    if dataset is not None:
        held = _names(dataset, f"dataset_bands.{name}", v)
        missing = [b for b in taken if b not in held]
        if missing:
            raise v.error(f"dataset_bands.{name}", f"lacks bands the model takes: {missing[:8]}")
        bands = tuple(held.index(b) for b in taken)
    elif taken != list(info.bands):  # a subset or another order of the modality's bands
        bands = tuple(info.bands.index(b) for b in taken if b in info.bands)
        if len(bands) != len(taken):
            raise v.error(
                f"output_bands.{name}",
                f"names bands {name} does not have; its bands: {', '.join(info.bands)}",
            )
    if spec.tim is not None and taken != list(info.bands):
        raise v.error(
            f"output_bands.{name}",
            f"a TiM model takes all of {name}'s bands in their order: {', '.join(info.bands)}",
        )
    stats = {}
    for key, published in (("means", info.mean), ("stds", info.std)):
        given = _per_modality(data, key, name, v)
        if given is None:
            neutral = 0.0 if key == "means" else 1.0
            stats[key] = tuple(
                published[info.bands.index(b)] if b in info.bands else neutral for b in taken
            )
            continue
        numbers = v.numbers(given, f"{key}.{name}")
        if len(numbers) != len(taken):
            raise v.error(f"{key}.{name}", f"has {len(numbers)} values for {len(taken)} bands")
        stats[key] = tuple(numbers)
    if any(s <= 0 for s in stats["stds"]):
        raise v.error(f"stds.{name}", "must all be positive")
    scale_value = data.get("constant_scale", 1.0)
    if isinstance(scale_value, Mapping):
        scale_value = scale_value.get(name, 1.0)
    scale = v.number(scale_value, f"constant_scale.{name}", 1e-12, 1e12)
    return {
        "name": name,
        "bands": bands if bands is not None else tuple(range(len(taken))),
        "mean": stats["means"],
        "std": stats["stds"],
        "scale": scale,
    }
