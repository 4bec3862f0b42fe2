"""Putting inputs on one grid while they stream: the alignment of a request's modalities.

A multimodal request gives each modality on its own grid: Sentinel-2 at 10 m in UTM, Sentinel-1
at 20 m in EPSG:4326 over part of the scene, a DEM at 30 m. One grid is the *reference* (a
modality's, or a fixed CRS and resolution: :class:`TargetGrid`); every other input is warped
onto it by GDAL's warper (a :class:`~rasterio.vrt.WarpedVRT`) as the engine reads it, one band
of rows at a time. The warper reads only the source windows those rows cover, so memory
follows the scene's width, not its area, and no input is ever loaded whole.

- :class:`WarpedSource`: one input seen on the reference grid, as float32 with NaN wherever
  there is nothing to read (outside the input's footprint, or its nodata).
- :class:`StackedSource`: several inputs already on one grid, read as one stack of their bands
  (the modalities of a request for a model that takes one stack, the band files of a STAC Item).
- :func:`align`: an input as it is when it is already on the grid (exact, nothing resampled),
  else warped.

Resampling is per input: bilinear for continuous values, nearest (or mode) for categories.
GDAL approximates the coordinate transform piecewise (within :data:`WARP_TOLERANCE` of a
pixel) over its own fixed blocks: a whole-scene :func:`rasterio.warp.reproject` cuts the scene
differently, so where the CRS changes, values can differ from it by what a shift of a tenth of a
pixel makes (exactly equal where only resolution and extent change).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np
import rasterio
from affine import Affine
from numpy.typing import NDArray
from rasterio.enums import Resampling
from rasterio.errors import RasterioError
from rasterio.io import MemoryFile
from rasterio.vrt import WarpedVRT
from rasterio.warp import calculate_default_transform
from rasterio.windows import Window

from geoserve.errors import ConfigError, InputError, RasterReadError, count
from geoserve.raster.source import ArraySource, DatasetSource, RasterInfo, RasterSource
from geoserve.raster.trust import input_env

#: The warper's error allowed in approximating the coordinate transform, in input pixels
#: (GDAL's default, ``gdalwarp -et 0.125``).
WARP_TOLERANCE = 0.125

ResamplingName = Literal["nearest", "bilinear", "cubic", "average", "mode"]
RESAMPLINGS: tuple[str, ...] = get_args(ResamplingName)


def resampling_of(name: str) -> Resampling:
    """The rasterio resampling method called ``name`` (one of :data:`RESAMPLINGS`).

    Raises:
        ConfigError: an unknown name.
    """
    if name not in RESAMPLINGS:
        raise ConfigError(f"invalid resampling {name!r}; choose one of {', '.join(RESAMPLINGS)}")
    return Resampling[name]


@dataclass(frozen=True)
class TargetGrid:
    """The pixel grid a request's inputs are put on: CRS, transform and size."""

    crs: Any
    transform: Affine
    width: int
    height: int

    @classmethod
    def of(cls, info: RasterInfo) -> TargetGrid:
        """The grid of an input."""
        return cls(info.crs, info.transform, info.width, info.height)

    @classmethod
    def covering(
        cls, info: RasterInfo, crs: Any = None, resolution: float | None = None
    ) -> TargetGrid:
        """A grid over ``info``'s extent in ``crs`` (default: its own) at ``resolution``.

        ``resolution`` is the pixel size in the CRS's units (default: about the input's).

        Raises:
            InputError: the input is not georeferenced; ConfigError: ``crs`` is unknown.
        """
        if not info.is_georeferenced:
            raise InputError(f"{info.name}: not georeferenced, so it cannot be put on a grid")
        dst_crs = info.crs
        if crs is not None:
            try:
                dst_crs = rasterio.crs.CRS.from_user_input(crs)
            except RasterioError as exc:
                raise ConfigError(f"invalid crs {crs!r} ({exc})") from None
        left, bottom, right, top = rasterio.transform.array_bounds(
            info.height, info.width, info.transform
        )
        transform, width, height = calculate_default_transform(
            info.crs, dst_crs, info.width, info.height, left, bottom, right, top,
            resolution=resolution,
        )  # fmt: skip
        return cls(dst_crs, transform, int(width), int(height))

    def matches(self, info: RasterInfo) -> bool:
        """Whether ``info`` is on this grid already (nothing to warp)."""
        return (
            (info.width, info.height) == (self.width, self.height)
            and info.crs == self.crs
            and info.transform.almost_equals(self.transform)
        )

    def profile(self, base: Mapping[str, Any]) -> dict[str, Any]:
        """``base`` (a rasterio profile) moved onto this grid."""
        return {
            **base,
            "crs": self.crs,
            "transform": self.transform,
            "width": self.width,
            "height": self.height,
        }


def source_nodata(info: RasterInfo) -> float | None:
    """What the warper takes as an input's missing values: its nodata, or NaN for floats."""
    if info.nodata is not None:
        return info.nodata
    return float("nan") if np.dtype(info.dtype).kind == "f" else None


class WarpedSource(RasterSource):
    """An input seen on another grid through GDAL's warper (a :class:`WarpedVRT`).

    Reads return float32 with NaN where the input has nothing: outside its footprint, and
    where the values it draws on are its nodata. GDAL warps the grid in fixed blocks, reading
    only the source window each block needs, so the values do not depend on how the grid is
    read (which rows, in what bands). An array input is put in an in-memory GeoTIFF first.
    The input itself is closed with it.

    Args:
        source: A file, bytes or array input (:func:`~geoserve.raster.source.open_raster`).
        grid: The grid to see it on.
        resampling: One of :data:`RESAMPLINGS`.
        threads: GDAL's warping threads.
        tolerance: Error allowed in the warper's approximation of the coordinate transform,
            in input pixels (GDAL's default, as ``gdalwarp -et``).
    """

    def __init__(
        self,
        source: RasterSource,
        grid: TargetGrid,
        resampling: str = "bilinear",
        threads: int = 1,
        tolerance: float = WARP_TOLERANCE,
    ) -> None:
        src = source.info
        if not isinstance(source, DatasetSource | ArraySource):
            raise TypeError(f"cannot warp a {type(source).__name__}")
        if not src.is_georeferenced or grid.crs is None:
            raise InputError(
                f"{src.name}: not on the reference grid and not georeferenced, so it cannot "
                "be aligned with the other inputs"
            )
        self.source = source
        self.grid = grid
        self.resampling = resampling
        self.tolerance = tolerance
        self._memfile: MemoryFile | None = None
        dataset = source.dataset if isinstance(source, DatasetSource) else self._in_memory(source)
        nodata = source_nodata(src)
        try:
            with input_env():
                self._vrt = WarpedVRT(
                    dataset,
                    crs=grid.crs,
                    transform=grid.transform,
                    width=grid.width,
                    height=grid.height,
                    resampling=resampling_of(resampling),
                    src_nodata=nodata,
                    nodata=np.nan,
                    dtype="float32",
                    tolerance=tolerance,
                    warp_extras={"NUM_THREADS": threads},
                )
        except RasterioError as exc:
            self.close()
            raise InputError(
                f"{src.name}: cannot be warped onto the reference grid ({exc})"
            ) from exc
        self.info = dataclasses.replace(
            src,
            width=grid.width,
            height=grid.height,
            dtype="float32",
            crs=grid.crs,
            transform=grid.transform,
            nodata=None,
            profile=grid.profile({**src.profile, "dtype": "float32", "nodata": None}),
        )

    def _in_memory(self, source: ArraySource) -> Any:
        """An array input as an in-memory GeoTIFF dataset, for the warper."""
        data, info = source.array, source.info
        self._memfile = MemoryFile()
        with self._memfile.open(
            driver="GTiff",
            width=info.width,
            height=info.height,
            count=info.count,
            dtype=data.dtype,
            crs=info.crs,
            transform=info.transform,
            nodata=info.nodata,
        ) as ds:
            ds.write(data)
        return self._memfile.open()

    def read_rows(self, row_start: int, row_stop: int, bands: Sequence[int]) -> NDArray[Any]:
        """See :meth:`RasterSource.read_rows`: float32, NaN where the input has nothing."""
        window = Window(0, row_start, self.grid.width, row_stop - row_start)
        try:
            out: NDArray[Any] = self._vrt.read([b + 1 for b in bands], window=window)
        except RasterioError as exc:
            raise RasterReadError(
                f"{self.source.info.name}: cannot read it onto the reference grid, rows "
                f"{row_start}-{row_stop} ({exc}); the file may be truncated or corrupt"
            ) from exc
        return out

    def release(self) -> RasterSource:
        """Close the warper but not the input, and hand the input back (to warp it anew)."""
        vrt = getattr(self, "_vrt", None)
        if vrt is not None:
            vrt.close()
            self._vrt = None
        if self._memfile is not None:
            self._memfile.close()
            self._memfile = None
        return self.source

    def close(self) -> None:
        """Close the warper and the input."""
        self.release()
        self.source.close()


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
        parts = [align(modalities[name][t], grid, "bilinear", threads) for name in names]
        label = ", ".join(
            f"{name}={part.info.name}" for name, part in zip(names, parts, strict=True)
        )
        stacks.append(parts[0] if len(parts) == 1 else StackedSource(parts, label))
    return stacks
