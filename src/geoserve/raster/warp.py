"""GDAL's warper: one input seen on another grid, read a band of rows at a time.

:class:`WarpedSource` shows an opened input on a :class:`TargetGrid` (the reference grid of a
request: :mod:`geoserve.raster.align`) through a :class:`~rasterio.vrt.WarpedVRT` on its
dataset. GDAL reads only the source windows the requested rows cover, so memory follows the
grid's width, and warps in fixed blocks of its own, so a value does not depend on which rows
are asked for. Values are float32, NaN wherever the input has nothing (outside its footprint,
or its nodata).

GDAL approximates the coordinate transform piecewise (within :data:`WARP_TOLERANCE` of a
pixel) over its blocks: a whole-scene :func:`rasterio.warp.reproject` cuts the scene
differently, so where the CRS changes, values can differ from it by what a shift of a tenth of a
pixel makes (equal, to float32 rounding, where only resolution and extent change).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np
import rasterio
from affine import Affine
from numpy.typing import NDArray
from rasterio._err import CPLE_BaseError
from rasterio.enums import Resampling
from rasterio.errors import RasterioError
from rasterio.vrt import WarpedVRT
from rasterio.warp import calculate_default_transform
from rasterio.warp import transform as warp
from rasterio.windows import Window

from geoserve.errors import ConfigError, InputError, RasterReadError
from geoserve.raster.source import RasterInfo, RasterSource
from geoserve.raster.trust import input_env

#: What GDAL raises for a transform it cannot make (no path between two CRSs, a degenerate
#: geotransform) besides rasterio's own errors.
GDAL_ERRORS = (RasterioError, CPLE_BaseError)
#: Destination pixels GDAL warps at once (a WarpedVRT block: 512 x 128).
WARP_BLOCK_PIXELS = 512 * 128

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
            except GDAL_ERRORS as exc:
                raise ConfigError(f"invalid crs {crs!r} ({exc})") from None
        left, bottom, right, top = rasterio.transform.array_bounds(
            info.height, info.width, info.transform
        )
        try:
            transform, width, height = calculate_default_transform(
                info.crs, dst_crs, info.width, info.height, left, bottom, right, top,
                resolution=resolution,
            )  # fmt: skip
        except GDAL_ERRORS as exc:
            raise InputError(f"{info.name}: cannot be put on a {dst_crs} grid ({exc})") from None
        return cls(dst_crs, transform, int(width), int(height))

    def matches(self, info: RasterInfo) -> bool:
        """Whether ``info`` is on this grid already (nothing to warp).

        The geotransforms must agree to a thousandth of a pixel, in every coefficient.
        """
        if (info.width, info.height) != (self.width, self.height) or info.crs != self.crs:
            return False
        pixel = min(abs(self.transform.a), abs(self.transform.e)) or 1.0
        tol = 1e-3 * pixel
        return all(abs(x - y) <= tol for x, y in zip(info.transform, self.transform, strict=True))

    def coverage(self, info: RasterInfo) -> float | None:
        """The share of this grid ``info``'s footprint covers (None: it cannot tell)."""
        return coverage(info, self)

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
    :meth:`read_rows`): the same values, in about a third of the time. The warper reads the
    input's GDAL dataset (:meth:`~geoserve.raster.source.RasterSource.gdal_dataset`: a file's
    own, an array's in-memory GeoTIFF copy); a source without one cannot be warped.
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
        if not src.is_georeferenced or grid.crs is None:
            raise InputError(
                f"{src.name}: not on the reference grid and not georeferenced, so it cannot "
                "be aligned with the other inputs"
            )
        if coverage(src, grid) == 0:
            raise InputError(
                f"{src.name}: covers none of the reference grid (its footprint lies outside it)"
            )
        self.source = source
        self.grid = grid
        self.resampling = resampling
        self.tolerance = tolerance
        self._fast: WarpedVRT | None = None
        self._vrt: WarpedVRT | None = None
        self._held = ExitStack()  # the input's GDAL dataset, while the warpers read it
        dataset = self._held.enter_context(source.gdal_dataset())
        nodata = source_nodata(src)
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
        except GDAL_ERRORS as exc:
            self.close()
            raise InputError(
                f"{src.name}: cannot be warped onto the reference grid ({exc})"
            ) from None
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

    @property
    def block_rows(self) -> int:
        """The rows of one block of the warper (it warps whole blocks)."""
        return int(self._vrt.block_shapes[0][0]) if self._vrt is not None else 1

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
        if self._vrt is None:
            raise InputError(f"{self.source.info.name}: its warper is closed")
        try:
            if self._fast is None:
                out = self._warped(self._vrt, indexes, window)
            else:
                out = self._warped(self._fast, indexes, window)
                self._patch_from_exact(out, indexes, row_start, row_stop)
        except CPLE_BaseError as exc:  # GDAL cannot transform these rows: not the file's fault
            raise InputError(
                f"{self.source.info.name}: cannot be warped onto rows {row_start}-{row_stop} "
                f"of the reference grid ({exc}); do the two grids overlap?"
            ) from None
        except RasterioError as exc:
            raise RasterReadError(
                f"{self.source.info.name}: cannot read it onto the reference grid, rows "
                f"{row_start}-{row_stop} ({exc}); the file may be truncated or corrupt"
            ) from exc
        return out

    def _warped(self, vrt: Any, indexes: list[int], window: Window) -> NDArray[Any]:
        """``vrt.read(indexes, window=window)``, the whole grid of several bands band by band.

        GDAL warps a read of the whole grid in several bands in one pass of its own rather
        than block by block, and its values then differ (by the approximated transform) from
        those of any other read of the same pixels; one band at a time it keeps to its blocks.
        """
        whole = (window.col_off, window.row_off) == (0, 0) and (window.width, window.height) == (
            self.grid.width,
            self.grid.height,
        )
        if whole and len(indexes) > 1:
            return np.stack([vrt.read(i, window=window) for i in indexes])
        out: NDArray[Any] = vrt.read(indexes, window=window)
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
        assert self._vrt is not None  # (read_rows checked)
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
                exact = self._warped(self._vrt, indexes, window)
                part, mask = out[..., c0:c1], redo[..., c0:c1]
                part[mask] = exact[mask]
                first = None

    def read_cost(self, bands: Sequence[int]) -> int:
        """Pixels of the input itself that ``bands`` cover (what warping them decodes)."""
        src = self.source.info
        return src.width * src.height * len(bands)

    def warp_bytes(self, bands: Sequence[int]) -> int:
        """The warper's worst-case buffer for one block: the input window it covers, float32.

        A block of the grid covers more input pixels the finer the input is than the grid
        (a 24000 x 24000 input onto a 64 x 64 grid: all of it at once).
        """
        src = self.source.info
        per_pixel = src.width * src.height / max(1, self.grid.width * self.grid.height)
        window = min(src.width * src.height, 4 * WARP_BLOCK_PIXELS * max(1.0, per_pixel))
        return int(window) * len(bands) * 4 * 2  # (the input's values and the working copy)

    def release(self) -> RasterSource:
        """Close the warpers but not the input, and hand the input back (to warp it anew)."""
        for name in ("_fast", "_vrt"):
            vrt = getattr(self, name, None)
            if vrt is not None:
                vrt.close()
                setattr(self, name, None)
        held = getattr(self, "_held", None)
        if held is not None:
            held.close()  # (the input's dataset handed back: an array's copy freed)
        return self.source

    def close(self) -> None:
        """Close the warpers and the input."""
        self.release()
        self.source.close()


def coverage(info: RasterInfo, grid: TargetGrid, per_edge: int = 32) -> float | None:
    """The fraction of ``grid`` that ``info``'s footprint covers (no pixels read).

    The footprint's outline, ``per_edge`` points a side, is transformed into the grid's pixel
    space and clipped to it. None when either is not georeferenced or the transform fails.
    """
    if info.crs is None or grid.crs is None:
        return None
    t = np.linspace(0.0, 1.0, per_edge, endpoint=False)
    w, h = info.width, info.height
    cols = np.concatenate([t * w, np.full(per_edge, w), (1 - t) * w, np.zeros(per_edge)])
    rows = np.concatenate([np.zeros(per_edge), t * h, np.full(per_edge, h), (1 - t) * h])
    xs, ys = info.transform @ (cols, rows)  # type: ignore[operator]  # (affine takes arrays)
    try:
        gx, gy = warp(info.crs, grid.crs, list(xs), list(ys))  # type: ignore[call-overload]
    except GDAL_ERRORS:
        return None
    px, py = ~grid.transform @ (np.asarray(gx), np.asarray(gy))
    if not (np.all(np.isfinite(px)) and np.all(np.isfinite(py))):
        return None
    polygon = _clip(list(zip(px.tolist(), py.tolist(), strict=True)), grid.width, grid.height)
    return min(1.0, _area(polygon) / float(grid.width * grid.height))


def _clip(points: list[tuple[float, float]], width: int, height: int) -> list[tuple[float, float]]:
    """Sutherland-Hodgman: ``points`` clipped to the rectangle [0, width] x [0, height]."""
    edges = ((0, 0.0, 1), (0, float(width), -1), (1, 0.0, 1), (1, float(height), -1))
    for axis, bound, sign in edges:
        if not points:
            break
        kept: list[tuple[float, float]] = []
        for i, cur in enumerate(points):
            prev = points[i - 1]
            cur_in = sign * (cur[axis] - bound) >= 0
            prev_in = sign * (prev[axis] - bound) >= 0
            if cur_in != prev_in:
                f = (bound - prev[axis]) / (cur[axis] - prev[axis])
                kept.append((prev[0] + f * (cur[0] - prev[0]), prev[1] + f * (cur[1] - prev[1])))
            if cur_in:
                kept.append(cur)
        points = kept
    return points


def _area(points: list[tuple[float, float]]) -> float:
    """A polygon's area (the shoelace formula)."""
    pairs = zip(points, points[1:] + points[:1], strict=True)
    return abs(sum(x0 * y1 - x1 * y0 for (x0, y0), (x1, y1) in pairs)) / 2
