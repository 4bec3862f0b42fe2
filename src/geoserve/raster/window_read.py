"""One windowed read for every kind of source: what :meth:`RasterSource.read` checks and does.

``source.read(window, bands, out_shape=..., resampling=..., masked=...)`` reads a window of a
source at full resolution or at another size, for every kind of source alike (a file, bytes, an
array, a warped or stacked input). This module holds its parts that do not depend on the kind:

- :func:`check_read`: the arguments checked against the source (an untrusted request can reach
  them: a map tile's window, a picture's size), every refusal an
  :class:`~geoserve.errors.InputError` naming the source;
- :func:`samples`: the pixels GDAL's nearest-neighbour resampling picks, so that a source that
  is not a GDAL dataset gives the same values as GDAL's own reduced read of the same pixels;
- :func:`read_picked` and :func:`read_resampled`: the default read, built on the source's rows
  (:meth:`RasterSource.read_rows`): nearest reads only the rows it samples, a band of rows at a
  time; any other resampling puts the window (with the margin GDAL's kernel would read around
  it) in an in-memory GeoTIFF and lets GDAL resample it, so it matches a file's read;
- :func:`value_mask` and :func:`dataset_mask`: which pixels are missing, computed the cheap
  way: a nodata value is compared on the values read (GDAL's own nodata mask would decode the
  band a second time), and only a real mask or alpha band is read, once when it is shared.
"""

from __future__ import annotations

import math
import operator
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray
from rasterio.enums import MaskFlags, Resampling
from rasterio.errors import NotGeoreferencedWarning
from rasterio.io import MemoryFile
from rasterio.windows import Window

from geoserve.errors import InputError

if TYPE_CHECKING:
    from geoserve.raster.source import RasterInfo

#: Resamplings a windowed read takes: those of GDAL's reduced read (``RasterIO``), by the
#: names rasterio gives them.
READ_RESAMPLINGS: tuple[str, ...] = (
    "nearest",
    "bilinear",
    "cubic",
    "cubic_spline",
    "lanczos",
    "average",
    "mode",
    "gauss",
    "rms",
)

#: Rows read at once by a source without blocks of its own (:attr:`RasterSource.block_rows` 1).
READ_ROWS = 256

#: GDAL's nudge when it picks the nearest source pixel (it keeps ``(i + 0.5) * ratio`` from
#: falling just short of a whole number).
_NEAREST_EPS = 1e-10

#: Source pixels (per output pixel, at least one) GDAL's widest kernel (Lanczos) reads on each
#: side of a window: the margin an in-memory copy carries so its resampling matches a file's.
_KERNEL_RADIUS = 3

#: A block of rows: ``(row_start, row_stop, col_start, col_stop, bands) -> (bands, rows, cols)``.
BlockReader = Callable[[int, int, int, int, Sequence[int]], NDArray[Any]]


@dataclass(frozen=True)
class WindowRead:
    """A windowed read, checked.

    The window (``row``, ``col``, ``height``, ``width``) in the source's grid, its 0-based
    ``bands``, the ``out_shape`` (rows, cols), the resampling, whether it is masked.
    """

    row: int
    col: int
    height: int
    width: int
    bands: tuple[int, ...]
    out_shape: tuple[int, int]
    resampling: str
    masked: bool

    @property
    def full(self) -> bool:
        """Whether the window is read at its own resolution (nothing resampled)."""
        return self.out_shape == (self.height, self.width)

    @property
    def window(self) -> Window:
        """The window as rasterio's."""
        return Window(self.col, self.row, self.width, self.height)


def _whole(name: str, what: str, value: Any) -> int:
    """``value`` as an int when it is a whole number, else InputError naming ``name``."""
    if isinstance(value, bool):
        raise InputError(f"{name}: {what} must be a whole number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{name}: {what} must be a whole number, got {value!r}") from None
    if not math.isfinite(number) or not number.is_integer():
        raise InputError(f"{name}: {what} must be a whole number, got {value!r}")
    return int(number)


def check_read(
    info: RasterInfo,
    window: Window,
    bands: Sequence[int],
    out_shape: Sequence[int] | None,
    resampling: str | Resampling,
    masked: bool,
) -> WindowRead:
    """The arguments of :meth:`RasterSource.read` checked against ``info``.

    Raises:
        InputError: naming the source: a window that is not inside it (or not whole pixels),
            no bands or a band it does not have, an out_shape that is not two positive whole
            numbers, a resampling GDAL's reduced read does not know.
    """
    row, col, height, width = _checked_window(info, window)
    picked = _checked_bands(info, bands)
    shape = (height, width)
    if out_shape is not None:
        shape = _checked_shape(info.name, out_shape)
    how = resampling.name if isinstance(resampling, Resampling) else resampling
    if how not in READ_RESAMPLINGS:
        raise InputError(
            f"{info.name}: unknown resampling {resampling!r}; choose one of "
            f"{', '.join(READ_RESAMPLINGS)}"
        )
    return WindowRead(row, col, height, width, picked, shape, str(how), bool(masked))


def _checked_window(info: RasterInfo, window: Window) -> tuple[int, int, int, int]:
    """(row, col, height, width) of ``window``, whole pixels inside the raster."""
    name = info.name
    if not isinstance(window, Window):
        raise InputError(f"{name}: the window must be a rasterio Window, got {window!r}")
    col = _whole(name, "window column", window.col_off)
    row = _whole(name, "window row", window.row_off)
    width = _whole(name, "window width", window.width)
    height = _whole(name, "window height", window.height)
    inside = col >= 0 and row >= 0 and col + width <= info.width and row + height <= info.height
    if width < 1 or height < 1 or not inside:
        raise InputError(
            f"{name}: window {window} is not inside the raster ({info.width}x{info.height})"
        )
    return row, col, height, width


def _checked_bands(info: RasterInfo, bands: Sequence[int]) -> tuple[int, ...]:
    """``bands`` as 0-based indices the raster has."""
    name = info.name
    try:
        wanted = [] if isinstance(bands, str | bytes) else list(bands)
    except TypeError:
        wanted = []
    if not wanted:
        raise InputError(f"{name}: no bands asked for (give a list of 0-based band indices)")
    picked = []
    for band in wanted:
        try:
            if isinstance(band, bool):
                raise TypeError
            index = operator.index(band)
        except TypeError:
            raise InputError(f"{name}: band {band!r} is not a band index") from None
        if not 0 <= index < info.count:
            raise InputError(
                f"{name}: band index {index} asked for; it has {info.count} band(s) "
                f"(0 to {info.count - 1})"
            )
        picked.append(index)
    return tuple(picked)


def _checked_shape(name: str, out_shape: Sequence[int]) -> tuple[int, int]:
    """``out_shape`` as (rows, cols), both positive."""
    if isinstance(out_shape, str | bytes) or len(out_shape) != 2:
        raise InputError(f"{name}: out_shape must be (rows, cols), got {out_shape!r}")
    shape = (_whole(name, "out_shape", out_shape[0]), _whole(name, "out_shape", out_shape[1]))
    if min(shape) < 1:
        raise InputError(f"{name}: out_shape must be positive, got {tuple(out_shape)!r}")
    return shape


def samples(size: int, out: int) -> NDArray[np.intp]:
    """The ``out`` pixels of ``size`` GDAL's nearest-neighbour read picks.

    ``floor((i + 0.5) * size / out)``, with GDAL's own nudge against rounding.
    """
    ratio = size / out
    idx: NDArray[np.intp] = np.floor((np.arange(out) + 0.5) * ratio + _NEAREST_EPS).astype(np.intp)
    return np.minimum(idx, size - 1)


def read_picked(
    read_block: BlockReader,
    dtype: Any,
    rows: NDArray[np.intp],
    cols: NDArray[np.intp],
    bands: Sequence[int],
    block_rows: int,
) -> NDArray[Any]:
    """The pixels at ``rows`` x ``cols`` (ascending), read a band of rows at a time.

    Each band of ``block_rows`` rows (:data:`READ_ROWS` when the source has none) that holds a
    wanted row is read once, from its first to its last wanted row, over the wanted columns.
    """
    out = np.empty((len(bands), len(rows), len(cols)), dtype=dtype)
    if len(rows) == 0 or len(cols) == 0:
        return out
    c0, c1 = int(cols[0]), int(cols[-1]) + 1
    every_col = len(cols) == c1 - c0
    step = block_rows if block_rows > 1 else READ_ROWS
    first = 0
    while first < len(rows):
        start = int(rows[first]) // step * step
        last = int(np.searchsorted(rows, start + step))
        lo, hi = int(rows[first]), int(rows[last - 1]) + 1
        block = read_block(lo, hi, c0, c1, bands)
        if hi - lo != last - first:  # (some rows skipped, or taken twice)
            block = block[:, rows[first:last] - lo]
        if not every_col:
            block = block[:, :, cols - c0]
        out[:, first:last] = block
        first = last
    return out


def read_resampled(
    read_block: BlockReader, info: RasterInfo, req: WindowRead, block_rows: int
) -> NDArray[Any]:
    """``req`` resampled by GDAL from an in-memory GeoTIFF of the window and its margin.

    The copy holds the window at full resolution with the pixels GDAL's kernel would read
    around it (clipped to the source), and the source's nodata value, so GDAL resamples the
    same pixels as it would reading a file of the same values: its memory is the window's.
    """
    margins = [
        math.ceil(_KERNEL_RADIUS * max(1.0, size / shrunk)) + 2
        for size, shrunk in ((req.height, req.out_shape[0]), (req.width, req.out_shape[1]))
    ]
    r0, r1 = max(0, req.row - margins[0]), min(info.height, req.row + req.height + margins[0])
    c0, c1 = max(0, req.col - margins[1]), min(info.width, req.col + req.width + margins[1])
    rows = np.arange(r0, r1, dtype=np.intp)
    cols = np.arange(c0, c1, dtype=np.intp)
    data = read_picked(read_block, info.dtype, rows, cols, req.bands, block_rows)
    profile = {
        "driver": "GTiff",
        "width": c1 - c0,
        "height": r1 - r0,
        "count": len(req.bands),
        "dtype": data.dtype.name,
        "nodata": info.nodata,
    }
    window = Window(req.col - c0, req.row - r0, req.width, req.height)
    with warnings.catch_warnings(), MemoryFile() as mem:
        warnings.simplefilter("ignore", NotGeoreferencedWarning)  # (pixels only: no grid)
        with mem.open(**profile) as dst:
            dst.write(data)
        del data
        with mem.open() as ds:
            out: NDArray[Any] = ds.read(
                window=window,
                out_shape=(len(req.bands), *req.out_shape),
                resampling=Resampling[req.resampling],
            )
    return out


def value_mask(data: NDArray[Any], nodata: float | None) -> NDArray[np.bool_]:
    """Where ``data`` holds the nodata value, or (float data) a NaN or an infinity."""
    if nodata is None:
        mask = np.zeros(data.shape, dtype=bool)
    elif math.isnan(nodata):
        mask = np.isnan(data) if data.dtype.kind == "f" else np.zeros(data.shape, dtype=bool)
    else:
        mask = np.asarray(data == float(nodata))
    if data.dtype.kind == "f":
        mask |= ~np.isfinite(data)
    return mask


def dataset_mask(
    ds: Any, indexes: list[int], data: NDArray[Any], window: Window, req: WindowRead
) -> NDArray[np.bool_]:
    """Which pixels of ``data`` (read from rasterio dataset ``ds``) are missing, band by band.

    A band's nodata value is compared on ``data``; a mask band or an alpha band (data of its
    own) is read for the same window, size and resampling as the values, once for all bands
    when the file has one mask for all of them; a float band's NaN and infinities are missing
    too.
    """
    out = np.zeros(data.shape, dtype=bool)
    shared: NDArray[np.bool_] | None = None
    shape = None if req.full else req.out_shape
    for i, band in enumerate(indexes):
        flags = ds.mask_flag_enums[band - 1]
        if MaskFlags.nodata in flags:
            out[i] = value_mask(data[i], ds.nodatavals[band - 1])
            continue
        if MaskFlags.all_valid not in flags:
            if shared is None or MaskFlags.per_dataset not in flags:
                masks = ds.read_masks(
                    band,
                    window=window,
                    out_shape=shape,
                    resampling=Resampling[req.resampling],
                )
                shared = masks == 0
            out[i] = shared
        if data.dtype.kind == "f":
            out[i] |= ~np.isfinite(data[i])
    return out
