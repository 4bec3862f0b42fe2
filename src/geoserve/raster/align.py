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
    read (which rows, in what bands). A float input (NaN as its missing values) goes through
    GDAL's fast kernels first, with the exact warp filling in what they leave (see
    :meth:`read_rows`): the same values, in about a third of the time. An array input is put
    in an in-memory GeoTIFF first.
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
        self._memfile: MemoryFile | None = None
        dataset = source.dataset if isinstance(source, DatasetSource) else self._in_memory(source)
        nodata = source_nodata(src)
        self._fast: WarpedVRT | None = None
        options = {
            "crs": grid.crs,
            "transform": grid.transform,
            "width": grid.width,
            "height": grid.height,
            "resampling": resampling_of(resampling),
            "src_nodata": nodata,
            "dtype": "float32",
            "tolerance": tolerance,
            "warp_extras": {"NUM_THREADS": threads},
        }
        try:
            with input_env():
                self._vrt = WarpedVRT(dataset, nodata=np.nan, **options)
                if nodata is not None and np.isnan(nodata):  # a float input: see read_rows
                    self._fast = WarpedVRT(dataset, nodata=None, **options)
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
        """See :meth:`RasterSource.read_rows`: float32, NaN where the input has nothing.

        A float input is warped without a destination nodata value first: GDAL then takes its
        fast kernels (a destination nodata value makes it track which output pixels are
        valid, and that general kernel costs about three times as much). That warp leaves 0
        where it writes nothing; every pixel it leaves at 0 or at a non-finite value (a NaN
        drawn from the input) is read again from the exact warp, in whole columns of the
        warper's blocks, so the result is the exact warp's, bit for bit.
        """
        indexes = [b + 1 for b in bands]
        window = Window(0, row_start, self.grid.width, row_stop - row_start)
        try:
            if self._fast is None:
                out: NDArray[Any] = self._vrt.read(indexes, window=window)
            else:
                out = self._fast.read(indexes, window=window)
                self._patch_from_exact(out, indexes, row_start, row_stop)
        except RasterioError as exc:
            raise RasterReadError(
                f"{self.source.info.name}: cannot read it onto the reference grid, rows "
                f"{row_start}-{row_stop} ({exc}); the file may be truncated or corrupt"
            ) from exc
        return out

    def _patch_from_exact(
        self, out: NDArray[Any], indexes: list[int], row_start: int, row_stop: int
    ) -> None:
        """Replace the pixels of ``out`` the fast warp may have left (0, NaN, inf) by the exact's.

        The exact warp is read in runs of whole columns of its blocks: a window cut elsewhere
        would be warped in other pieces, and could differ at the input's edges.
        """
        redo = ~np.isfinite(out)
        redo |= out == 0
        if not redo.any():
            return
        block = max(1, int(self._vrt.block_shapes[0][1]))
        width = self.grid.width
        wanted = np.logical_or.reduceat(redo.any(axis=(0, 1)), np.arange(0, width, block))
        first = None
        for i, need in enumerate([*wanted.tolist(), False]):
            if need and first is None:
                first = i
            elif not need and first is not None:
                c0, c1 = first * block, min(width, i * block)
                window = Window(c0, row_start, c1 - c0, row_stop - row_start)
                exact = self._vrt.read(indexes, window=window)
                part, mask = out[..., c0:c1], redo[..., c0:c1]
                part[mask] = exact[mask]
                first = None

    def close(self) -> None:
        """Close the warpers and the input."""
        for name in ("_fast", "_vrt"):
            vrt = getattr(self, name, None)
            if vrt is not None:
                vrt.close()
        if self._memfile is not None:
            self._memfile.close()
        self.source.close()


class StackedSource(RasterSource):
    """Inputs on one grid read as one stack of their bands, in order.

    Bands keep their descriptions. When the inputs share a data type and nodata value the
    stack keeps them; otherwise it is float32 with each input's nodata turned into NaN, so
    every band keeps its own missing values.

    Args:
        parts: The inputs, all on the first one's grid.
        name: How messages name the stack.
    """

    def __init__(self, parts: Sequence[RasterSource], name: str) -> None:
        if not parts:
            raise InputError(f"{name}: nothing to stack")
        first = parts[0].info
        for part in parts[1:]:
            if not TargetGrid.of(first).matches(part.info):
                raise InputError(
                    f"{part.info.name}: not on the grid of {first.name}; align it first"
                )
        infos = [p.info for p in parts]
        keys = {(i.dtype, None if i.nodata is None else float(i.nodata)) for i in infos}
        self._convert = len(keys) > 1
        dtype = "float32" if self._convert else first.dtype
        nodata = None if self._convert else first.nodata
        self.parts = list(parts)
        self._owner = [(i, b) for i, info in enumerate(infos) for b in range(info.count)]
        descriptions = tuple(d for info in infos for d in info.descriptions)
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

    def close(self) -> None:
        """Close every input."""
        for part in self.parts:
            part.close()


def align(
    source: RasterSource, grid: TargetGrid, resampling: str = "bilinear", threads: int = 1
) -> RasterSource:
    """``source`` on ``grid``: itself when it is on it already, else a :class:`WarpedSource`."""
    if grid.matches(source.info):
        return source
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
