"""The raw pixels under one grid row: fetched from the sources, reflected past the image edges.

What :class:`~geoserve.processors.patcher.GeoTiffPatcher` (and each modality of a multimodal
processor) reads for a grid row before normalising it: :func:`fetch_raw` copies the rows out of
each source's row buffer, reflected edges included, by a few slice assignments (the one step
that touches the sources, run in row order); :func:`band_of` finds what must be filled (nodata,
NaN, ±inf), which patches have nothing valid to predict, and the row's valid pixels.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from geoserve.processors.base import RasterContext
from geoserve.raster.grid import reflect_indices
from geoserve.raster.source import RasterSource


@dataclass(frozen=True)
class RawBand:
    """The raw input under one grid row, before normalisation.

    Attributes:
        raw: (C, P, Wp), or (C, T, P, Wp) for T dates, in the file's dtype: the rows under the
            grid row and the columns under all its patches, ``Wp = (cols - 1) * S + P`` wide,
            reflected past the image edges. Patch ``c`` is columns ``[c*S, c*S + P)``.
        invalid: What to fill: (P, Wp) nodata/NaN pixels, or with ``per_band_nodata`` the
            values themselves, shaped like ``raw``; ``None`` when there are none.
        cols: Grid columns of the patches to cut (all-nodata ones are left out).
        core_valid: As :attr:`PatchRow.core_valid`.
    """

    raw: NDArray[Any]
    invalid: NDArray[np.bool_] | None
    cols: tuple[int, ...]
    core_valid: NDArray[np.bool_] | None


def fetch_raw(
    sources: Sequence[RasterSource],
    ctx: RasterContext,
    row: int,
    num_frames: int,
    alloc: Callable[[tuple[int, ...], np.dtype[Any]], NDArray[Any]] = np.empty,
) -> NDArray[Any]:
    """The raw rows under grid row ``row``, every date, reflected past the image edges.

    (C, P, Wp), or (C, T, P, Wp) for T dates (see :attr:`RawBand.raw`), in the inputs'
    dtype, in an array from ``alloc(shape, dtype)`` (e.g. pinned memory to upload from):
    the one part of reading a row that touches the sources. The rows come from each
    source's row buffer and the reflected edges are put in place by slice assignment (no
    index arrays, no concatenation), so the result is the request's own copy, whatever
    the sources do next.
    """
    grid = ctx.grid
    r0, c0 = grid.origin(row, 0)
    rows = reflect_indices(r0, grid.patch_size, grid.height)  # image row of each patch row
    span = (grid.cols - 1) * grid.stride + grid.patch_size
    col_runs = _runs(np.arange(span), reflect_indices(c0, span, grid.width))
    lo, hi = int(rows.min()), int(rows.max()) + 1
    # each date's rows, as views of its source's decoded chunks (own buffers each)
    dates = [src.read_pieces(lo, hi, ctx.bands) for src in sources]
    first = dates[0][0][1]
    shape: tuple[int, ...] = (first.shape[0], grid.patch_size, span)
    if num_frames > 1:
        shape = (shape[0], len(dates), *shape[1:])
    out = alloc(shape, np.result_type(*(piece for pieces in dates for _, piece in pieces)))
    for t, pieces in enumerate(dates):
        dst = out[:, t] if num_frames > 1 else out
        for start, piece in pieces:
            here = np.flatnonzero((rows >= start) & (rows < start + piece.shape[1]))
            for rd, rs in _runs(here, rows[here] - start):
                for cd, cs in col_runs:
                    dst[:, rd, cd] = piece[:, rs, cs]
    return out


def band_of(
    raw: NDArray[Any], ctx: RasterContext, row: int, per_band_nodata: bool = False
) -> RawBand:
    """The :class:`RawBand` of raw rows from :func:`fetch_raw`: what to fill, which patches.

    An invalid pixel is nodata (or NaN, ±inf) in any band and date, or with
    ``per_band_nodata`` in all of them.
    """
    grid = ctx.grid
    cols = tuple(range(grid.cols))
    nodata = ctx.profile.get("nodata")
    if ctx.dtypes and raw.ndim == 4:  # dates of different types: each matched in its own
        masks = [_invalid(raw[:, t], _as(nodata, dtype)) for t, dtype in enumerate(ctx.dtypes)]
        bad = None
        if any(mask is not None for mask in masks):
            bad = np.zeros(raw.shape, dtype=bool)
            for t, mask in enumerate(masks):
                if mask is not None:
                    bad[:, t] = mask
    else:
        bad = _invalid(raw, nodata)  # like raw, or None
    if bad is None:
        return RawBand(raw=raw, invalid=None, cols=cols, core_valid=None)
    # an invalid pixel: nodata in any band (and date), or with per_band_nodata in all
    lead = tuple(range(bad.ndim - 2))
    invalid = np.asarray(bad.all(lead) if per_band_nodata else bad.any(lead))
    to_fill = bad if per_band_nodata else invalid
    core_valid = None
    if invalid.any():
        # nothing valid to predict: skip the model for that patch
        s, p = grid.stride, grid.patch_size
        cols = tuple(c for c in cols if not invalid[:, c * s : c * s + p].all())
        # the image's own columns start where the first patch's margin ends
        m = -grid.origin(row, 0)[1]
        core_h = grid.core_window(row, 0).height
        core_valid = ~invalid[grid.margin : grid.margin + core_h, m : m + grid.width]
    return RawBand(raw=raw, invalid=to_fill, cols=cols, core_valid=core_valid)


def pinned(shape: tuple[int, ...], dtype: np.dtype[Any]) -> NDArray[Any]:
    """An empty array in pinned (page-locked) host memory, from torch's caching allocator.

    Falls back to pageable memory for a dtype torch cannot hold.
    """
    try:
        like = torch.from_numpy(np.empty(0, dtype=dtype))
    except TypeError:
        return np.empty(shape, dtype=dtype)
    pinned: NDArray[Any] = torch.empty(shape, dtype=like.dtype, pin_memory=True).numpy()
    return pinned


def _runs(dst: NDArray[np.intp], src: NDArray[np.intp]) -> list[tuple[slice, slice]]:
    """``out[dst] = a[src]`` as (destination, source) slice pairs, for a few slice copies.

    A run is consecutive destinations whose sources go up or down by one (a reflected edge
    goes down), so a row's reflection takes a few slice assignments, not a gather.
    """
    runs: list[tuple[slice, slice]] = []
    start, n = 0, len(dst)
    while start < n:
        step = int(src[start + 1] - src[start]) if start + 1 < n else 1
        if step not in (1, -1):
            step = 1
        stop = start + 1
        while stop < n and dst[stop] - dst[stop - 1] == 1 and src[stop] - src[stop - 1] == step:
            stop += 1
        a, b = int(src[start]), int(src[stop - 1])
        source = slice(a, b + 1) if step == 1 else slice(a, b - 1 if b else None, -1)
        runs.append((slice(int(dst[start]), int(dst[stop - 1]) + 1), source))
        start = stop
    return runs


def _as(nodata: float | None, dtype: str) -> float | None:
    """``nodata`` as a value of ``dtype`` holds it (what a comparison in that type matches)."""
    if nodata is None or np.isnan(nodata):
        return nodata
    with np.errstate(all="ignore"):
        return float(np.asarray(nodata).astype(dtype))


def _invalid(raw: NDArray[Any], nodata: float | None) -> NDArray[np.bool_] | None:
    """Mask, like ``raw``, of values that are nodata, NaN or ±inf; None if none are."""
    bad = None
    if raw.dtype.kind == "f":
        bad = ~np.isfinite(raw)
        if raw.dtype.itemsize > 4:  # finite float64 beyond float32's range would become inf
            bad |= np.abs(raw) > np.finfo(np.float32).max
    if nodata is not None and not np.isnan(nodata):
        eq = raw == nodata
        bad = eq if bad is None else bad | eq
    return bad if bad is not None and bad.any() else None
