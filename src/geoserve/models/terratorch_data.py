"""What a TerraTorch fine-tune config says about its inputs and tiling: a :class:`DataSpec`.

TerraTorch's generic pixel-wise data modules read an image holding ``dataset_bands``, keep the
``output_bands`` (by name), multiply by ``constant_scale`` and normalise with ``means`` and
``stds`` (one per kept band); ``predict_dataset_bands`` / ``predict_output_bands`` replace the
first two for prediction. geoserve's patcher does the same with 0-based band indices: each
output band's position in the dataset bands. A band list without ``dataset_bands`` (``bands``
of the dataset-specific modules, say) means the file holds exactly those bands, in that order.
A band is a name (``BLUE``), an index, or an inclusive ``[first, last]`` range of indices.

Tiling comes from ``model.init_args.tiled_inference_parameters`` (TerraTorch's
``tiled_inference``: ``crop``/``stride``, or ``h_crop``/``w_crop``/``h_stride``/``w_stride``,
which must be square here; ``average_patches`` and ``blend_overlaps`` choose the blend:
cosine-tapered overlaps, a plain mean, or centre cores). Without it TerraTorch runs each image
whole; geoserve then uses 512-pixel patches with a 448 stride and centre cores.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from geoserve.models.config_file import section
from geoserve.models.config_values import Values
from geoserve.raster.grid import BlendMode

#: Tiling when the config gives none (TerraTorch would run the whole image).
DEFAULT_PATCH_SIZE = 512
DEFAULT_STRIDE = 448
#: TerraTorch's ``tiled_inference`` defaults.
TILED_CROP = 224
TILED_STRIDE = 192
MAX_PATCH_SIZE = 4096


@dataclass(frozen=True)
class DataSpec:
    """Inputs and tiling of a fine-tune, as geoserve's processors take them.

    Attributes:
        bands: 0-based indices of the model's bands in the input file; None: every band, in
            order.
        band_names: What each model band is (``BLUE``, ...), when the config names them.
        means: Per-band mean, after scaling; None: 0.
        stds: Per-band standard deviation; None: 1.
        scale: ``constant_scale``: raw values are multiplied by it first.
        patch_size: Patch size in pixels.
        stride: Step between patches.
        blend: How overlapping outputs combine (``cosine``, ``mean`` or ``center``).
        class_names: One name per output class.
    """

    bands: tuple[int, ...] | None
    band_names: tuple[str, ...] | None
    means: tuple[float, ...] | None
    stds: tuple[float, ...] | None
    scale: float
    patch_size: int
    stride: int
    blend: BlendMode
    class_names: tuple[str, ...]


def read_data(
    raw: Mapping[str, Any], path: Path, in_channels: int, num_classes: int, class_names: Any
) -> DataSpec:
    """The :class:`DataSpec` of a config whose model takes ``in_channels`` bands.

    Raises:
        WeightsError: a value of the wrong type or range, a band list, means or stds that do
            not give ``in_channels`` bands, or class names that are not ``num_classes``.
    """
    data = section(raw, ("data", "init_args"), path)
    v = Values(path, "data.init_args")
    bands, names = _bands(data, v)
    selected = len(bands) if bands is not None else len(names) if names is not None else None
    if selected is not None and selected != in_channels:
        raise v.error(
            "output_bands",
            f"selects {selected} bands, but the model takes {in_channels} (its in_channels)",
        )
    stats = {}
    for key in ("means", "stds"):
        value = data.get(key)
        if value is None:
            continue
        if isinstance(value, str):
            raise v.error(key, "names a file; geoserve takes the values only (a list)")
        numbers = v.numbers(value, key)
        if len(numbers) != in_channels:
            raise v.error(
                key, f"has {len(numbers)} values, but the model takes {in_channels} bands"
            )
        stats[key] = tuple(numbers)
    if any(s <= 0 for s in stats.get("stds", ())):
        raise v.error("stds", "must all be positive")
    scale = v.number(data.get("constant_scale", 1.0), "constant_scale", 1e-12, 1e12)
    init = section(raw, ("model", "init_args"), path)
    patch, stride, blend = tiling(init.get("tiled_inference_parameters"), path)
    return DataSpec(
        bands=bands,
        band_names=names,
        means=stats.get("means"),
        stds=stats.get("stds"),
        scale=scale,
        patch_size=patch,
        stride=stride,
        blend=blend,
        class_names=read_class_names(class_names, num_classes, path),
    )


def _expand(value: Any, key: str, v: Values) -> list[int | str]:
    """A band list with ``[first, last]`` ranges expanded."""
    out: list[int | str] = []
    for i, item in enumerate(v.plain(value, key) if isinstance(value, list) else [value]):
        if isinstance(item, list):
            first, last = (v.integers(item, f"{key}[{i}]", 0, 4095) + [-1])[:2]
            if len(item) != 2 or last < first:
                raise v.error(f"{key}[{i}]", "a range must be [first, last], first <= last")
            out.extend(range(first, last + 1))
        elif isinstance(item, str) or isinstance(item, int) and not isinstance(item, bool):
            out.append(item)
        else:
            raise v.error(f"{key}[{i}]", "must be a band name, an index or a [first, last] range")
    if not out or len(out) > 4096:
        raise v.error(key, "must list 1 to 4096 bands")
    return out


def _bands(data: Mapping[str, Any], v: Values) -> tuple[tuple[int, ...] | None, Any]:
    """(indices in the file or None, band names or None)."""
    dkey = next((k for k in ("predict_dataset_bands", "dataset_bands") if data.get(k)), None)
    okey = next((k for k in ("predict_output_bands", "output_bands", "bands") if data.get(k)), None)
    dataset = _expand(data[dkey], dkey, v) if dkey else None
    output = _expand(data[okey], okey, v) if okey else None
    if dataset is not None and output is not None:
        missing = [b for b in output if b not in dataset]
        if missing:
            raise v.error(okey or "output_bands", f"names bands not in {dkey}: {missing[:8]}")
        return tuple(dataset.index(b) for b in output), _names(output)
    listed = output if output is not None else dataset
    if listed is None:
        return None, None
    names = _names(listed)
    return None, names if names is not None else tuple(str(b) for b in listed)


def _names(bands: list[int | str]) -> tuple[str, ...] | None:
    return tuple(str(b) for b in bands) if all(isinstance(b, str) for b in bands) else None


def tiling(
    params: Any, path: Path, default: tuple[int, int] = (DEFAULT_PATCH_SIZE, DEFAULT_STRIDE)
) -> tuple[int, int, BlendMode]:
    """(patch size, stride, blend) from ``tiled_inference_parameters``; ``default`` without.

    Raises:
        WeightsError: a value of the wrong type or range, or non-square crops.
    """
    if params is None:
        return default[0], default[1], "center"
    v = Values(path, "model.init_args.tiled_inference_parameters")
    if not isinstance(params, Mapping):
        raise v.error("", "must be a mapping")
    sizes = {}
    for axis in ("h", "w"):
        for what, fallback in (("crop", TILED_CROP), ("stride", TILED_STRIDE)):
            key = f"{axis}_{what}" if params.get(f"{axis}_{what}") is not None else what
            sizes[axis, what] = v.integer(params.get(key, fallback), key, 1, MAX_PATCH_SIZE)
    patch, stride = sizes["h", "crop"], sizes["h", "stride"]
    if (patch, stride) != (sizes["w", "crop"], sizes["w", "stride"]):
        raise v.error(
            "w_crop",
            f"geoserve tiles square patches: h_crop/h_stride ({patch}/{stride}) and "
            f"w_crop/w_stride ({sizes['w', 'crop']}/{sizes['w', 'stride']}) must agree",
        )
    if stride > patch:
        raise v.error("stride", f"{stride} is larger than the crop ({patch})")
    average = v.boolean(params.get("average_patches", True), "average_patches")
    blend_overlaps = v.boolean(params.get("blend_overlaps", True), "blend_overlaps")
    blend: BlendMode = ("cosine" if blend_overlaps else "mean") if average else "center"
    return patch, stride, blend


def read_class_names(names: Any, num_classes: int, path: Path) -> tuple[str, ...]:
    """``class_names`` checked against ``num_classes``; ``class N`` without them."""
    if names is None:
        return tuple(f"class {i}" for i in range(num_classes))
    v = Values(path, "model.init_args")
    if not isinstance(names, list) or len(names) != num_classes:
        raise v.error("class_names", f"must list {num_classes} names (num_classes)")
    return tuple(v.text(str(n) if isinstance(n, int) else n, f"class_names[{i}]")
                 for i, n in enumerate(names))  # fmt: skip
