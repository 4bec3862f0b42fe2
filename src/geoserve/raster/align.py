"""Putting inputs on one grid while they stream: the alignment of a request's modalities.

A multimodal request gives each modality on its own grid: Sentinel-2 at 10 m in UTM, Sentinel-1
at 20 m in EPSG:4326 over part of the scene, a DEM at 30 m. One grid is the *reference* (a
modality's, or a fixed CRS and resolution: :class:`TargetGrid`); every other input is warped
onto it by GDAL's warper as the engine reads it, one band of rows at a time
(:class:`~geoserve.raster.warp.WarpedSource`), so memory follows the scene's width, not its
area, and no input is ever loaded whole.

- :class:`StackedSource`: several inputs already on one grid, read as one stack of their bands
  (the modalities of a request for a model that takes one stack, the band files of a STAC Item).
- :func:`align`: an input as it is when it is already on the grid (exact, nothing resampled),
  else warped.
- :func:`stack_modalities`: a dict request as one stack per date, for a model that takes one.

Resampling is per input: bilinear for continuous values, nearest (or mode) for categories.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from geoserve.errors import GeoServeError, InputError, count, prefixed
from geoserve.raster.source import RasterSource
from geoserve.raster.warp import (
    RESAMPLINGS,
    WARP_TOLERANCE,
    ResamplingName,
    TargetGrid,
    WarpedSource,
    resampling_of,
    source_nodata,
)

__all__ = [
    "RESAMPLINGS",
    "WARP_TOLERANCE",
    "ResamplingName",
    "StackedSource",
    "TargetGrid",
    "WarpedSource",
    "align",
    "aligned_modality",
    "resampling_of",
    "source_nodata",
    "stack_modalities",
]


class StackedSource(RasterSource):
    """Inputs on one grid read as one stack of their bands, in order.

    Bands keep their descriptions. When the inputs share a data type and nodata value the
    stack keeps them; otherwise it is float32 with each input's nodata turned into NaN, so
    every band keeps its own missing values.

    Args:
        parts: The inputs, all on the first one's grid.
        name: How messages name the stack.
        bands: Per input, the 0-based bands of it to stack (``None``: all of them).
        resampling: Per input, how it is resampled when the stack is put on another grid
            (:meth:`onto`); default bilinear. A :class:`WarpedSource` input keeps its own.
    """

    def __init__(
        self,
        parts: Sequence[RasterSource],
        name: str,
        bands: Sequence[Sequence[int] | None] | None = None,
        resampling: Sequence[str] | None = None,
    ) -> None:
        if not parts:
            raise InputError(f"{name}: nothing to stack")
        first = parts[0].info
        for part in parts[1:]:
            if not TargetGrid.of(first).matches(part.info):
                raise InputError(
                    f"{part.info.name}: not on the grid of {first.name}; align it first"
                )
        infos = [p.info for p in parts]
        chosen = list(bands) if bands is not None else [None] * len(parts)
        if len(chosen) != len(parts):
            raise ValueError("one band selection per part")
        self.bands: list[tuple[int, ...]] = []
        for info, sel in zip(infos, chosen, strict=True):
            picked = tuple(range(info.count)) if sel is None else tuple(sel)
            bad = [b for b in picked if not 0 <= b < info.count]
            if bad:
                raise InputError(
                    f"{info.name}: band {bad[0] + 1} requested; it has {count(info.count, 'band')}"
                )
            self.bands.append(picked)
        self.resampling = tuple(resampling or ["bilinear"] * len(parts))
        keys = {(i.dtype, None if i.nodata is None else float(i.nodata)) for i in infos}
        self._convert = len(keys) > 1
        dtype = "float32" if self._convert else first.dtype
        nodata = None if self._convert else first.nodata
        self.parts = list(parts)
        self._owner = [(i, b) for i, picked in enumerate(self.bands) for b in picked]
        descriptions = tuple(infos[i].descriptions[b] for i, b in self._owner)
        total = len(descriptions)
        self.info = dataclasses.replace(
            first,
            name=name,
            count=total,
            dtype=dtype,
            nodata=nodata,
            descriptions=descriptions,
            profile={**first.profile, "count": total, "dtype": dtype, "nodata": nodata},
            block_bytes=sum(i.block_bytes for i in infos),
            held_bytes=sum(i.held_bytes for i in infos),
        )

    def read_rows(self, row_start: int, row_stop: int, bands: Sequence[int]) -> NDArray[Any]:
        """See :meth:`RasterSource.read_rows`; each input reads its own bands once."""
        out = np.empty(
            (len(bands), row_stop - row_start, self.info.width), dtype=np.dtype(self.info.dtype)
        )
        wanted: dict[int, list[tuple[int, int]]] = {}  # part -> (output position, its band)
        for pos, band in enumerate(bands):
            if not 0 <= band < len(self._owner):
                raise InputError(
                    f"{self.info.name}: band {band + 1} requested; it has "
                    f"{count(len(self._owner), 'band')}"
                )
            part, local = self._owner[band]
            wanted.setdefault(part, []).append((pos, local))
        for part, pairs in wanted.items():
            src = self.parts[part]
            data = src.read_rows(row_start, row_stop, [local for _, local in pairs])
            if self._convert:
                data = data.astype(np.float32)
                nodata = src.info.nodata
                if nodata is not None and not np.isnan(nodata):
                    data[data == np.float32(nodata)] = np.nan
            out[[pos for pos, _ in pairs]] = data
        return out

    @property
    def block_rows(self) -> int:
        """The largest block height of the inputs."""
        return max(part.block_rows for part in self.parts)

    def _by_part(self, bands: Sequence[int]) -> dict[int, list[int]]:
        grouped: dict[int, list[int]] = {}
        for band in bands:
            if 0 <= band < len(self._owner):
                part, local = self._owner[band]
                grouped.setdefault(part, []).append(local)
        return grouped

    def read_cost(self, bands: Sequence[int]) -> int:
        """What each input costs to read its share of ``bands``."""
        return sum(self.parts[p].read_cost(b) for p, b in self._by_part(bands).items())

    def warp_bytes(self, bands: Sequence[int]) -> int:
        """The warpers' worst-case buffers for ``bands`` (see :class:`WarpedSource`)."""
        return sum(self.parts[p].warp_bytes(b) for p, b in self._by_part(bands).items())

    def onto(self, grid: TargetGrid, threads: int = 1) -> StackedSource:
        """The stack on ``grid``: each input warped there from its own pixels (never twice).

        The new stack keeps this one's name, band descriptions, tags and date; it owns the
        inputs from now on (close it, not this one).
        """
        moved: list[RasterSource] = []
        for part, how in zip(self.parts, self.resampling, strict=True):
            if isinstance(part, WarpedSource):
                how = part.resampling
                moved.append(align(part.release(), grid, how, threads))
            else:
                moved.append(align(part, grid, how, threads))
        new = StackedSource(moved, self.info.name, self.bands, self.resampling)
        new.info = dataclasses.replace(
            new.info, descriptions=self.info.descriptions, tags=self.info.tags, date=self.info.date
        )
        return new

    def close(self) -> None:
        """Close every input."""
        for part in self.parts:
            part.close()


def align(
    source: RasterSource, grid: TargetGrid, resampling: str = "bilinear", threads: int = 1
) -> RasterSource:
    """``source`` on ``grid``: itself when it is on it already, else a :class:`WarpedSource`.

    A :class:`StackedSource` is moved input by input (:meth:`StackedSource.onto`), each with
    its own resampling; ``resampling`` is then not used.
    """
    if grid.matches(source.info):
        return source
    if isinstance(source, StackedSource):
        return source.onto(grid, threads)
    return WarpedSource(source, grid, resampling, threads)


def stack_modalities(
    modalities: Mapping[str, Sequence[RasterSource]], threads: int = 1
) -> list[RasterSource]:
    """The modalities of one request as one band stack per date, on the first one's grid.

    Bands come in the mapping's order; every other modality is resampled bilinearly. Each
    modality must give the same number of dates.

    Raises:
        InputError: naming the modality whose dates do not match, or that cannot be aligned.
    """
    names = list(modalities)
    if not names:
        raise InputError("no modalities given")
    dates = {name: len(srcs) for name, srcs in modalities.items()}
    first = names[0]
    for name in names[1:]:
        if dates[name] != dates[first]:
            raise InputError(
                f"modality {name!r} gives {count(dates[name], 'date')} but {first!r} gives "
                f"{dates[first]}; give each modality the same dates"
            )
    grid = TargetGrid.of(modalities[first][0].info)
    stacks: list[RasterSource] = []
    for t in range(dates[first]):
        parts = [_aligned(name, modalities[name][t], grid, "bilinear", threads) for name in names]
        label = ", ".join(
            f"{name}={part.info.name}" for name, part in zip(names, parts, strict=True)
        )
        stacks.append(parts[0] if len(parts) == 1 else StackedSource(parts, label))
    return stacks


def _aligned(
    modality: str, source: RasterSource, grid: TargetGrid, resampling: str, threads: int
) -> RasterSource:
    """:func:`align`, its errors naming the modality."""
    try:
        return align(source, grid, resampling, threads)
    except GeoServeError as exc:
        raise prefixed(exc, f"modality {modality!r}") from None


def aligned_modality(
    modality: str,
    sources: Sequence[RasterSource],
    grid: TargetGrid,
    resampling: str,
    threads: int = 1,
) -> list[RasterSource]:
    """The dates of one modality on ``grid``; its errors name the modality."""
    return [_aligned(modality, src, grid, resampling, threads) for src in sources]
