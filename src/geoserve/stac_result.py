"""A STAC Item for a finished request: what it made, where, and how (:func:`result_item`).

The Item describes one request's outputs, one asset per output kind, with what a catalogue or
a GIS needs to use them without opening them, and where they came from:

- ``geometry`` and ``bbox``: the output grid's footprint in longitude and latitude (WGS84),
  edges densified (:mod:`geoserve.stac_products`). An output without a CRS has a ``null``
  geometry and no bbox, as STAC allows for data that is not georeferenced;
- per asset: its media type (a Cloud-Optimized GeoTIFF says so), its roles (``data`` and what
  it is: ``classification``, ``confidence``, ...), ``proj:code`` (or ``proj:wkt2`` for a CRS
  without an EPSG code; ``null`` without a CRS), ``proj:shape`` and ``proj:transform``,
  ``raster:bands`` (data type, nodata, resolution), ``classification:classes`` for class maps
  and polygons (value, a machine-readable name, the class name as its title, the colour table's
  colour), ``file:size`` and ``file:checksum`` (sha2-256 multihash);
- provenance: the Processing extension's ``processing:software`` (geoserve's version),
  ``processing:datetime`` and ``processing:lineage``, and under ``geoserve:`` the model (name,
  architecture, tasks, framework: named as the Machine Learning Model extension names them),
  its weights (file name and sha256; a Hub reference as given), the inputs as the caller gave
  them, the request's options, its processing time and patch count.

The model is described under ``geoserve:`` rather than with the MLM extension because that
extension describes a *model*: its schema requires an asset with the ``mlm:model`` role (the
weights file itself, with a link a client could follow) and ``mlm:input`` / ``mlm:output``
structures, which an Item of a model's *results* cannot truthfully fill. Its own advice for
inference outputs is the Processing extension, which is used here.

Inputs are strings the caller chose to show (a path the client gave, a URL, an upload's name);
nothing here looks at them, so a server passes what its client sent, never its own paths.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pystac
from pystac.extensions.classification import Classification, ClassificationExtension
from pystac.extensions.file import FileExtension
from pystac.extensions.projection import ProjectionExtension
from pystac.extensions.raster import DataType, NoDataStrings, RasterBand, RasterExtension
from pystac.utils import datetime_to_str

from geoserve.errors import ConfigError, OutputWriteError
from geoserve.raster import tempfiles
from geoserve.schemas import TOKEN_KINDS, VECTOR_KINDS, ImageOutput, ImageRequestOutput
from geoserve.stac_model import ClassInfo, ModelInfo, WeightsInfo, model_info, weights_info
from geoserve.stac_products import (
    Product,
    footprint,
    multihash,
    read_product,
    rectangle,
)

__all__ = [
    "ClassInfo",
    "ModelInfo",
    "WeightsInfo",
    "model_info",
    "request_options",
    "result_item",
    "weights_info",
    "write_item",
]

PROCESSING_SCHEMA = "https://stac-extensions.github.io/processing/v1.2.0/schema.json"
#: Each output kind's asset roles.
ROLES: dict[str, tuple[str, ...]] = {
    "classes": ("data", "classification"),
    "polygons": ("data", "classification"),
    "probabilities": ("data", "probabilities"),
    "confidence": ("data", "confidence"),
    "raw": ("data",),
    "embeddings": ("data", "embeddings"),
    "patch-embeddings": ("data", "embeddings"),
}
#: The kinds whose values are class ids (``classification:classes``).
CLASS_KINDS = ("classes", "polygons")

#: Each asset's href: a mapping of output kind to href, or a function of the kind and output.
Hrefs = Mapping[str, str] | Callable[[str, ImageOutput], str]


def request_options(spec: Any) -> dict[str, Any]:
    """A :class:`~geoserve.RequestSpec`'s options as plain JSON, for :func:`result_item`.

    Its ``to_json()`` less its inputs, output path and id: what names files or the
    server's own ids.
    """
    from geoserve.engine.request_spec import RequestSpec

    given: RequestSpec = spec.normalised()
    inputs: Any = given.inputs  # (a list, or a dict of lists)
    shape: Any  # (placeholders of the inputs' shape: the dates are matched against them)
    if isinstance(inputs, Mapping):
        shape = {k: [""] * len(v) for k, v in inputs.items()}
    else:
        shape = [""] * len(inputs)
    data = dataclasses.replace(given, inputs=shape).to_json()
    for key in ("inputs", "output_path", "request_id"):
        data.pop(key, None)
    return data


def result_item(
    result: ImageRequestOutput,
    *,
    model: ModelInfo,
    inputs: str | Sequence[str] | Mapping[str, str | Sequence[str]],
    options: Mapping[str, Any],
    item_id: str,
    hrefs: Hrefs,
    seconds: float | None = None,
    acquired: dt.date | None = None,
    checksums: bool = True,
    now: dt.datetime | None = None,
) -> pystac.Item:
    """The STAC Item of a finished request (see the module docstring).

    Args:
        result: The request's outcome; its outputs must be files, bytes or base64.
        model: What ran (:func:`model_info`).
        inputs: The inputs as the caller gave them, strings only (a list: dates; a dict:
            modalities), shown as they are: never pass a path the client could not see.
        options: The request's options (:func:`request_options`), plain JSON values.
        item_id: The Item's id.
        hrefs: Each asset's href (a kind -> href mapping, or a function of the kind and the
            output): download URLs on a server, file names relative to the Item on the CLI.
        seconds: Processing time; None: the request's time on the engine's threads.
        acquired: The inputs' acquisition date, the Item's ``datetime``; None: the time it was
            processed (a STAC Item needs one).
        checksums: Read every output once for its ``file:checksum``.
        now: The processing time (default: now, UTC).

    Raises:
        ConfigError: a failed result, a missing href, inputs that are not strings, options
            that are not JSON; OutputWriteError: an output that cannot be read back.
    """
    if not result.ok:
        raise ConfigError(f"request {result.request_id}: no STAC Item for a failed request")
    if not item_id or not isinstance(item_id, str):
        raise ConfigError("item_id: a non-empty string is needed")
    outputs = dict(result.outputs_by_kind)
    if not outputs and result.outputs is not None:
        outputs = {result.outputs.kind or "classes": result.outputs}
    if not outputs:
        raise ConfigError(f"request {result.request_id}: no outputs to describe")
    shown, opts = _inputs(inputs), _options(options)
    rasters = any(k not in VECTOR_KINDS for k in outputs)
    products = [
        read_product(k, o, checksum=checksums, extent=not rasters) for k, o in outputs.items()
    ]
    processed = (now or dt.datetime.now(dt.timezone.utc)).astimezone(dt.timezone.utc)
    geometry, bbox = _footprint(products)
    when = processed if acquired is None else _as_datetime(acquired)
    item = pystac.Item(item_id, geometry, bbox, when, properties={})
    item.common_metadata.created = processed
    for product in products:
        asset = pystac.Asset(
            _href(hrefs, product),
            title=f"{product.kind} of {model.name}",
            media_type=product.media_type,
            roles=list(ROLES.get(product.kind, ("data",))),
        )
        item.add_asset(product.kind, asset)
        _describe(asset, product, model)
    _provenance(item, model, shown, opts, result, seconds, processed)
    for href in dict.fromkeys(h for p in products for h in p.sources):
        item.add_link(pystac.Link("derived_from", href, media_type="application/geo+json"))
    return item


def write_item(item: pystac.Item, path: str | os.PathLike[str]) -> Path:
    """Write ``item`` as JSON to ``path`` (its hrefs as they are), replacing it in one step.

    Raises:
        OutputWriteError: it cannot be written (naming the file).
    """
    target = Path(path)
    data = item.to_dict(include_self_link=False, transform_hrefs=False)
    try:
        text = json.dumps(data, indent=2, allow_nan=False)
    except ValueError as exc:  # (a NaN or infinity: not JSON)
        raise OutputWriteError(f"{target}: the STAC Item is not valid JSON ({exc})") from None
    tmp = tempfiles.new_temporary(target)
    try:
        tmp.write_text(text + "\n", encoding="utf-8")
        os.replace(tmp, target)
    except OSError as exc:
        tempfiles.release(tmp, remove=True)
        raise OutputWriteError(
            f"{target}: cannot write the STAC Item ({exc.strerror or exc})"
        ) from None
    tempfiles.release(tmp, remove=False)
    return target


# -- the parts -----------------------------------------------------------------------------------


def _footprint(products: list[Product]) -> tuple[dict[str, Any] | None, list[float] | None]:
    """The request's grid's footprint: of a pixel kind's raster (not a token grid) if any."""
    rasters = [p for p in products if p.grid is not None]
    pixel = [p for p in rasters if p.kind not in TOKEN_KINDS] or rasters
    if pixel:
        grid = pixel[0].grid
        assert grid is not None
        return footprint(grid.crs, grid.ring(), grid.bounds)
    for p in products:  # vector outputs only: their features' extent
        if p.extent is not None:
            return footprint(p.crs, rectangle(p.extent), p.extent)
    return None, None


def _describe(asset: pystac.Asset, product: Product, model: ModelInfo) -> None:
    """The asset's projection, raster bands, classes and file fields."""
    proj = ProjectionExtension.ext(asset, add_if_missing=True)
    crs = product.crs
    epsg = crs.to_epsg() if crs is not None else None
    proj.code = f"EPSG:{epsg}" if epsg is not None else None
    if crs is not None and epsg is None:
        proj.wkt2 = crs.to_wkt(version="WKT2_2019")
    grid = product.grid
    if grid is not None:
        proj.shape = [grid.height, grid.width]
        if crs is not None:
            proj.transform = [float(v) for v in tuple(grid.transform)[:6]]
        t = grid.transform
        square = t.b == 0 and t.d == 0 and abs(t.a) == abs(t.e) and crs is not None
        RasterExtension.ext(asset, add_if_missing=True).bands = [
            RasterBand.create(
                data_type=_data_type(b.data_type),
                nodata=_nodata(b.nodata),
                spatial_resolution=abs(t.a) if square else None,
            )
            for b in product.bands
        ]
    else:
        asset.extra_fields["geoserve:features"] = product.output.count
    if product.kind in CLASS_KINDS and model.classes:
        ClassificationExtension.ext(asset, add_if_missing=True).classes = _classes(model.classes)
    file = FileExtension.ext(asset, add_if_missing=True)
    file.size = product.size
    if product.sha256 is not None:
        file.checksum = multihash(product.sha256)


def _classes(classes: Sequence[ClassInfo]) -> list[Classification]:
    """The classes as the Classification extension has them.

    ``name`` is machine-readable (letters, digits, ``-``, ``_``); ``title`` the class's name.
    """
    out, taken = [], set()
    for c in classes:
        name = re.sub(r"[^0-9A-Za-z_-]+", "_", c.name).strip("_") or f"class_{c.value}"
        if name in taken:
            name = f"{name}_{c.value}"
        taken.add(name)
        hint = None if c.color is None else "".join(f"{v:02X}" for v in c.color)
        out.append(Classification.create(c.value, name=name, title=c.name, color_hint=hint))
    return out


def _data_type(name: str) -> DataType:
    """The Raster extension's name of a numpy data type (``other`` for one it lacks)."""
    known = {t.value for t in DataType}
    return DataType(name) if name in known else DataType.OTHER


def _nodata(value: float | None) -> float | NoDataStrings | None:
    if value is None:
        return None
    if value != value:
        return NoDataStrings.NAN
    if value in (float("inf"), float("-inf")):
        return NoDataStrings.INF if value > 0 else NoDataStrings.NINF
    return int(value) if float(value).is_integer() else float(value)


def _provenance(
    item: pystac.Item,
    model: ModelInfo,
    inputs: Any,
    options: dict[str, Any],
    result: ImageRequestOutput,
    seconds: float | None,
    processed: dt.datetime,
) -> None:
    props = item.properties
    from geoserve import __version__

    item.stac_extensions.append(PROCESSING_SCHEMA)
    props["processing:software"] = {"geoserve": __version__}
    props["processing:datetime"] = datetime_to_str(processed)
    weights = model.weights
    using = f" with weights {weights.file} (sha256 {weights.sha256})" if weights else ""
    kinds = ", ".join(item.assets)
    props["processing:lineage"] = (
        f"{kinds} predicted by model {model.name}{using}, run by geoserve {__version__}"
    )
    props["geoserve:model"] = model.to_json()
    props["geoserve:weights"] = None if weights is None else weights.to_json()
    props["geoserve:inputs"] = inputs
    props["geoserve:options"] = options
    took = result.timings.total if seconds is None else seconds
    props["geoserve:seconds"] = round(float(took), 3)
    props["geoserve:patches"] = result.num_patches


def _href(hrefs: Hrefs, product: Product) -> str:
    if isinstance(hrefs, Mapping):
        href = hrefs.get(product.kind)
    else:
        href = hrefs(product.kind, product.output)
    if not isinstance(href, str) or not href:
        raise ConfigError(f"hrefs: no href for the {product.kind!r} asset")
    return href


def _inputs(inputs: Any) -> list[str] | dict[str, list[str]]:
    """The inputs as strings (a list, or a dict of modality to its list)."""
    if isinstance(inputs, Mapping):
        return {str(k): _strings(v, f"inputs[{k!r}]") for k, v in inputs.items()}
    return _strings(inputs, "inputs")


def _strings(value: Any, where: str) -> list[str]:
    items = [value] if isinstance(value, str) else list(value)
    for i, x in enumerate(items):
        if not isinstance(x, str):
            raise ConfigError(
                f"{where}[{i}]: a string is needed (the input as the client gave it), "
                f"got {type(x).__name__}"
            )
    return items


def _options(options: Mapping[str, Any]) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(json.dumps(dict(options), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"options: plain JSON values are needed ({exc})") from None
    return data


def _as_datetime(day: dt.date) -> dt.datetime:
    if isinstance(day, dt.datetime):
        return day if day.tzinfo is not None else day.replace(tzinfo=dt.timezone.utc)
    return dt.datetime(day.year, day.month, day.day, tzinfo=dt.timezone.utc)
