"""Built-in output processors: class maps, class probabilities, confidence, and raw values.

Segmentation models return per-class logits. Overlaps are blended on the logits; the class map
is their argmax, the probabilities their softmax and the confidence the largest softmax value,
so the outputs always agree. Class maps are uint8 (uint16 past 254 classes) with a colour
table, and always declare the nodata value 255 (65535), which no class code reaches: pixels of
input nodata, and pixels where the model returned NaN or inf, carry it, whether or not the
input declares a nodata value (a map without such pixels simply has none). ``polygons`` takes
the class map's rows too; its sink turns the finished map into polygons
(:mod:`geoserve.raster.polygons`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from geoserve.errors import ConfigError
from geoserve.processors.base import OUTPUT_KINDS, OutputKind, OutputProcessor, RasterContext
from geoserve.raster.write import OutputRaster

logger = logging.getLogger(__name__)

#: Default class colours (RGB), cycled when a model declares more classes.
PALETTE: tuple[tuple[int, int, int], ...] = (
    (230, 230, 220),
    (31, 120, 220),
    (60, 170, 60),
    (230, 90, 40),
    (250, 200, 30),
    (150, 80, 190),
    (120, 120, 120),
    (20, 200, 200),
    (240, 120, 200),
    (140, 90, 40),
)


#: What a segmentation model's logits can become.
SEGMENTATION_KINDS: tuple[str, ...] = ("classes", "probabilities", "confidence", "raw", "polygons")
#: Kinds whose rows are the class map.
CLASS_MAP_KINDS = ("classes", "polygons")


def _check_kind(kind: str, allowed: Sequence[str], what: str) -> None:
    if kind not in OUTPUT_KINDS:
        raise ConfigError(f"invalid output kind {kind!r}; choose one of {', '.join(OUTPUT_KINDS)}")
    if kind not in allowed:
        raise ConfigError(f"{what} cannot produce {kind!r} output; it offers {', '.join(allowed)}")


@dataclass(frozen=True)
class SegmentationReassembler(OutputProcessor):
    """Output processor for semantic segmentation (the model returns one logit per class).

    Args:
        classes: Class names, in the order of the model's output channels.
        colors: One RGB colour per class for the class map's colour table.
        kind: ``classes`` (uint8 class map), ``probabilities`` (float32, one band per class),
            ``confidence`` (float32, the winning class's probability), ``raw`` (blended
            float32 logits) or ``polygons`` (the class map, for its polygon sink).
    """

    classes: tuple[str, ...] = ()
    colors: tuple[tuple[int, int, int], ...] | None = None
    kind: OutputKind = "classes"

    def __post_init__(self) -> None:
        object.__setattr__(self, "classes", tuple(self.classes))
        if len(self.classes) < 1:
            raise ConfigError("SegmentationReassembler needs at least one class name")
        if self.colors is not None:
            object.__setattr__(self, "colors", tuple(tuple(c) for c in self.colors))
            if len(self.colors) != len(self.classes):
                raise ConfigError(f"{len(self.colors)} colors for {len(self.classes)} classes")
        _check_kind(self.kind, SEGMENTATION_KINDS, "a segmentation model")

    @property
    def out_channels(self) -> int:
        """One logit per class."""
        return len(self.classes)

    @property
    def kinds(self) -> tuple[str, ...]:
        """Every kind a segmentation model's logits can become."""
        return SEGMENTATION_KINDS

    @property
    def class_colors(self) -> tuple[tuple[int, int, int], ...]:
        """Each class's RGB colour in its map's colour table (the palette's if none given)."""
        n = len(self.classes)
        return self.colors or tuple(PALETTE[i % len(PALETTE)] for i in range(n))

    def for_kind(self, kind: str) -> SegmentationReassembler:
        """Same classes, another output kind."""
        _check_kind(kind, SEGMENTATION_KINDS, "a segmentation model")
        return dataclasses.replace(self, kind=kind)  # type: ignore[arg-type]

    def reduce_rows(self, blended: torch.Tensor) -> torch.Tensor:
        """Class maps: the argmax on the device, one small integer per pixel to copy back.

        Ties go to the first class, as with numpy's argmax on the host.
        """
        if self.kind not in CLASS_MAP_KINDS:
            return blended
        small = len(self.classes) < 255
        index = blended.argmax(dim=0, keepdim=True).to(torch.uint8 if small else torch.int32)
        bad = ~torch.isfinite(blended).all(dim=0, keepdim=True)
        # a model that returned NaN or inf there: no class, nodata. Unconditionally (asking
        # whether any pixel is bad would wait for the device every band)
        return index.masked_fill_(bad, 255 if small else 65535)

    def finalize(
        self,
        blended: NDArray[np.float32],
        valid: NDArray[np.bool_] | None,
        ctx: RasterContext,
    ) -> OutputRaster:
        """Argmax, softmax, its maximum or the logits as they are; nodata where input is.

        ``blended`` is not changed (several kinds of one request finalize the same rows).
        """
        masked = ctx.has_nodata
        tags = {"CLASS_NAMES": ",".join(self.classes), "GEOSERVE_OUTPUT": self.kind}
        if self.kind in CLASS_MAP_KINDS:
            n = len(self.classes)
            dtype = np.uint8 if n < 255 else np.uint16
            nodata = int(np.iinfo(dtype).max)
            # class indices already taken on the device (see reduce_rows), or logits
            if blended.dtype.kind in "iu":
                out = blended[0].astype(dtype, copy=True)[np.newaxis]
            else:  # (a model that returned NaN or inf at a pixel: no class there, nodata)
                out = _class_index(blended, dtype, nodata)[np.newaxis]
            nonfinite = _count_nonfinite(out[0], nodata, valid)
            if valid is not None:
                out[0, ~valid] = nodata
            cmap = (
                {i: (*c, 255) for i, c in enumerate(self.class_colors)}
                if dtype == np.uint8
                else None
            )
            if cmap is not None:
                cmap[nodata] = (0, 0, 0, 0)
            # nodata declared always: a model's NaN writes it even where the input has none
            return OutputRaster(
                out,
                nodata,
                ("class",),
                colormap=cmap,
                tags=tags,
                categories=self.classes,
                nonfinite=nonfinite,
            )
        if self.kind == "confidence":
            return float_output(_confidence(blended), valid, masked, ("confidence",), tags)
        if self.kind == "probabilities":
            return float_output(_softmax(blended), valid, masked, self.classes, tags)
        names = tuple(f"logit_{c}" for c in self.classes)
        return float_output(blended.copy(), valid, masked, names, tags)


@dataclass(frozen=True)
class RawReassembler(OutputProcessor):
    """Output processor for regression, reconstruction and other float outputs.

    Args:
        band_names: Output band descriptions; ``None`` reuses the input band names when the
            counts match (identity, reconstruction), else ``band_1 ...``.
        channels: Number of output channels the model must return, if fixed.
        multiply, add: Per-band affine map applied to the output, cycled over the bands
            (e.g. a reconstruction's std and mean, to return it in input units; with T dates
            of C bands the C values repeat for each date).
    """

    band_names: tuple[str, ...] | None = None
    channels: int | None = None
    kind: OutputKind = "raw"
    multiply: tuple[float, ...] | None = None
    add: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.band_names is not None:
            object.__setattr__(self, "band_names", tuple(self.band_names))
            if self.channels is not None and len(self.band_names) != self.channels:
                raise ConfigError(f"{len(self.band_names)} band names for {self.channels} channels")
        _check_kind(self.kind, ("raw",), "a raw-output model")

    @property
    def out_channels(self) -> int | None:
        """The configured channel count, if any."""
        if self.channels is not None:
            return self.channels
        return len(self.band_names) if self.band_names is not None else None

    @property
    def kinds(self) -> tuple[str, ...]:
        """Only ``raw``."""
        return ("raw",)

    def for_kind(self, kind: str) -> RawReassembler:
        """Only ``raw`` is possible."""
        _check_kind(kind, ("raw",), "a raw-output model")
        return self

    def finalize(
        self,
        blended: NDArray[np.float32],
        valid: NDArray[np.bool_] | None,
        ctx: RasterContext,
    ) -> OutputRaster:
        """Blended values as float32 bands; NaN where the input is nodata."""
        n = blended.shape[0]
        if self.band_names is not None:
            names: tuple[str, ...] = self.band_names
        elif len(ctx.band_names) == n:
            names = ctx.band_names
        else:
            names = tuple(f"band_{i + 1}" for i in range(n))
        masked = ctx.has_nodata
        values = blended.copy()  # (never the rows themselves: other kinds may read them)
        for factors, op in ((self.multiply, np.multiply), (self.add, np.add)):
            if factors:
                per_band = np.resize(np.asarray(factors, dtype=np.float32), n)
                values = op(values, per_band[:, None, None])
        return float_output(values, valid, masked, names, {"GEOSERVE_OUTPUT": "raw"})


def _count_nonfinite(
    out: NDArray[np.integer[Any]], nodata: int, valid: NDArray[np.bool_] | None
) -> int:
    """The nodata pixels the input did not ask for (the model's NaN/inf), with a warning.

    Returned in the class map's :attr:`~geoserve.raster.write.OutputRaster.nonfinite`, for
    the request's outcome (the server's metrics count them from there).
    """
    marked = out == nodata
    if valid is not None:
        marked &= valid
    n = int(marked.sum())
    if n:
        logger.warning("the model returned NaN or inf for %d pixel(s); written as nodata", n)
    return n


def _class_index(x: NDArray[np.float32], dtype: Any, nodata: int) -> NDArray[Any]:
    """``x.argmax(axis=0)`` as ``dtype`` (ties: the first class); ``nodata`` at NaN or inf.

    One pass per class over its contiguous rows, where numpy's argmax over the first axis
    walks across the classes pixel by pixel (4x slower for two classes); the same classes.
    """
    best = x[0].copy()
    index = np.zeros(x.shape[1:], dtype=dtype)
    finite = np.isfinite(best)
    above = np.empty(x.shape[1:], dtype=bool)
    for c in range(1, x.shape[0]):
        np.greater(x[c], best, out=above)  # strictly: a tie keeps the earlier class
        np.copyto(index, c, where=above)
        np.maximum(best, x[c], out=best)
        finite &= np.isfinite(x[c])
    np.copyto(index, nodata, where=~finite)
    return index


def _confidence(x: NDArray[np.float32]) -> NDArray[np.float32]:
    """The largest softmax value per pixel, (1, H, W): 1 / sum(exp(x - max)).

    The same value as ``_softmax(x).max(axis=0)`` up to rounding; NaN where a logit is.
    """
    m = x.max(axis=0, keepdims=True)
    out: NDArray[np.float32] = (1.0 / np.exp(x - m).sum(axis=0, keepdims=True)).astype(np.float32)
    return out


def _softmax(x: NDArray[np.float32]) -> NDArray[np.float32]:
    e = np.exp(x - x.max(axis=0, keepdims=True))
    out: NDArray[np.float32] = (e / e.sum(axis=0, keepdims=True)).astype(np.float32)
    return out


def float_output(
    values: NDArray[np.float32],
    valid: NDArray[np.bool_] | None,
    masked: bool,
    names: Sequence[str],
    tags: dict[str, str],
    nbits: int | None = None,
) -> OutputRaster:
    """Float32 output bands, NaN where the input is invalid.

    ``values`` is written into: pass rows no other output kind reads.
    """
    out = values.astype(np.float32, copy=False)
    if valid is not None:
        out[:, ~valid] = np.nan
    nodata = float("nan") if masked else None
    return OutputRaster(out, nodata, tuple(names), tags=tags, nbits=nbits)
