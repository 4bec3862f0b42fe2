"""What the engine returns: request outputs, their payloads and stage timings.

Named after vLLM's IO-processor types (``ImageRequestOutput``) so that code written against
vLLM's Prithvi plugin reads naturally here. These are plain dataclasses; the HTTP layer converts
them to JSON itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, get_args

from geoserve.errors import GeoServeError

if TYPE_CHECKING:
    import torch
    import xarray

#: ``xarray``: an ``xarray.DataArray`` per kind, together an ``xarray.Dataset`` (the ``xarray``
#: extra; docs/xarray.md).
OutFormat = Literal["path", "tensor", "b64", "bytes", "xarray"]
#: What a request's output is: class ids, class probabilities, raw values, the winning class's
#: probability, the class regions as polygons (a vector file), the encoder's patch tokens on
#: the token grid, or one pooled embedding per patch (a vector file).
OutputKind = Literal[
    "classes",
    "probabilities",
    "raw",
    "confidence",
    "polygons",
    "embeddings",
    "patch-embeddings",
    # generated modalities (TerraMind): one product each, in physical units
    "s2l2a",
    "s1grd",
    "s1rtc",
    "dem",
    "ndvi",
    "lulc",
]
OUTPUT_KINDS: tuple[str, ...] = get_args(OutputKind)
#: Kinds that are a generated modality (a generative model's products).
GENERATED_KINDS: tuple[str, ...] = ("s2l2a", "s1grd", "s1rtc", "dem", "ndvi", "lulc")
#: Kinds written as a vector file rather than a raster.
VECTOR_KINDS: tuple[str, ...] = ("polygons", "patch-embeddings")
#: Kinds made of the encoder's tokens (from the same forward pass), not of the model's output.
TOKEN_KINDS: tuple[str, ...] = ("embeddings", "patch-embeddings")
OUT_FORMATS: tuple[str, ...] = get_args(OutFormat)


@dataclass
class StageTimings:
    """Seconds spent on one request, by stage and by thread.

    On the engine's main thread: ``read`` (waiting for the request's rows from the reader
    threads), ``model`` (its share of each forward call; on a GPU that is the asynchronous
    launch), ``device_wait`` (its share of the time the main thread blocked on the device:
    copying results back), ``stitch`` (placing output patches in its canvas). Elsewhere:
    ``read_busy`` (reader threads fetching, decoding and cutting its rows, summed over the
    threads), ``device`` (its share of the forwards' time on a CUDA device, from CUDA events;
    0 on a CPU), ``finalize`` (the writer turning finished rows into output values: argmax,
    softmax ...) and ``write`` (writing and committing its outputs).
    """

    read: float = 0.0
    model: float = 0.0
    stitch: float = 0.0
    write: float = 0.0
    read_busy: float = 0.0
    device: float = 0.0
    device_wait: float = 0.0
    finalize: float = 0.0

    #: Every field, in the order above (the server's metrics label stages by these names).
    STAGES = ("read", "model", "stitch", "write", "read_busy", "device", "device_wait", "finalize")

    @property
    def total(self) -> float:
        """The request's time on the main and writer threads (not the overlapping reads)."""
        return self.read + self.model + self.device_wait + self.stitch + self.finalize + self.write


@dataclass
class ImageOutput:
    """One output of an image request (one kind of product), in the requested form.

    Exactly one of ``path``, ``tensor``, ``b64``, ``data`` or ``xarray`` is set, per
    ``out_format``. ``tensor`` is the output raster as (bands, H, W) in its output dtype;
    ``xarray`` the same values as an ``xarray.DataArray`` (band, y, x) with its coords and
    CRS. For a raster, ``count`` is its band count and ``dtype`` its data type; for a vector
    output (``polygons``), ``count`` is its number of features and ``dtype`` its file format
    (``"parquet"``, ``"geojson"``, ``"gpkg"``); ``width`` and ``height`` are the input grid's.
    """

    out_format: OutFormat
    width: int
    height: int
    count: int
    dtype: str
    kind: str | None = None
    """The output kind this is (``classes``, ``confidence``, ...)."""
    path: Path | None = None
    tensor: torch.Tensor | None = None
    b64: str | None = None
    data: bytes | None = None
    xarray: xarray.DataArray | None = None


@dataclass
class ImageRequestOutput:
    """One request's outcome: its output, or the error that failed it alone.

    ``outputs`` is the first (or only) output kind's; ``outputs_by_kind`` holds every kind the
    request asked for, in the order asked, by kind name (``result.outputs_by_kind["confidence"]``).
    ``nonfinite_pixels``: pixels of its class maps the model returned NaN or inf for (written as
    nodata), each pixel once however many kinds it asked for.
    """

    request_id: str
    finished: bool = False
    outputs: ImageOutput | None = None
    error: GeoServeError | None = None
    num_patches: int = 0
    timings: StageTimings = field(default_factory=StageTimings)
    outputs_by_kind: dict[str, ImageOutput] = field(default_factory=dict)
    nonfinite_pixels: int = 0

    @property
    def ok(self) -> bool:
        """Finished without error."""
        return self.finished and self.error is None

    @property
    def dataset(self) -> xarray.Dataset:
        """An ``out_format="xarray"`` request's products as one ``xarray.Dataset``.

        One variable per output kind (see :func:`geoserve.raster.xarray_sink.to_dataset`).

        Raises:
            GeoServeError: the request failed (its error), or was not an xarray one.
        """
        from geoserve.raster.xarray_sink import to_dataset  # (xarray only when asked)

        return to_dataset(self.raise_for_error().outputs_by_kind)

    def raise_for_error(self) -> ImageRequestOutput:
        """Raise the request's error, if any; return self otherwise."""
        if self.error is not None:
            raise self.error
        return self


@dataclass
class TensorRequestOutput:
    """Result of :meth:`geoserve.Engine.transform`: the blended raw model output."""

    request_id: str
    finished: bool = False
    tensors: torch.Tensor | None = None
    error: GeoServeError | None = None
    num_patches: int = 0
    timings: StageTimings = field(default_factory=StageTimings)

    @property
    def ok(self) -> bool:
        """Finished without error."""
        return self.finished and self.error is None
