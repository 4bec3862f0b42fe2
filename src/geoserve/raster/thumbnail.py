"""Small pictures of large rasters: nearest-neighbour samples, every block decoded at most once.

GDAL's own reduced read (``read(out_shape=...)``) walks the picture one output row at a time,
and each output row needs every block of its full-width block row. Unless GDAL's block cache
holds a whole block row (of every band, for a pixel-interleaved file) the blocks are decoded
again for each output row: with the cache capped for streaming, a 13-band tiled scene took
seconds instead of milliseconds, and the cost grows with the scene's width. Here each block
row that holds a sampled row is read once, at full resolution, and the sampled rows and
columns are picked out, so every compressed block is decoded at most once whatever the cache
size, and memory stays at one block row of the requested bands. When the file has overviews,
the smallest one at least as large as the picture is read the same way instead.

The samples are the pixels GDAL's nearest-neighbour resampling picks: output pixel ``i`` takes
source pixel ``floor((i + 0.5) * size / out_size)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from typing import Any

import numpy as np
import rasterio
from numpy.typing import NDArray
from rasterio.enums import MaskFlags

from geoserve.raster.trust import input_env

#: Above this many bytes per block row, only the sampled rows themselves are read (files
#: stored as a few huge strips).
_MAX_BLOCK_ROW_BYTES = 256 << 20


def thumbnail_shape(height: int, width: int, max_side: int) -> tuple[int, int]:
    """(rows, cols) of a picture at most ``max_side`` pixels on its long side, never upsampled."""
    scale = max(max(width, height) / max(max_side, 1), 1.0)
    return max(1, round(height / scale)), max(1, round(width / scale))


def _samples(size: int, out: int) -> NDArray[np.intp]:
    idx: NDArray[np.intp] = np.floor((np.arange(out) + 0.5) * (size / out)).astype(np.intp)
    return np.minimum(idx, size - 1)


def _overview_level(ds: Any, band: int, rows: int, cols: int) -> int | None:
    """0-based overview level of the smallest overview still >= (rows, cols), if any."""
    best = None
    for level, factor in enumerate(ds.overviews(band)):
        if -(-ds.height // factor) >= rows and -(-ds.width // factor) >= cols:
            best = level
    return best


def read_thumbnail(ds: Any, bands: Sequence[int], max_side: int) -> np.ma.MaskedArray[Any, Any]:
    """Bands ``bands`` (1-based) of dataset ``ds``, at most ``max_side`` pixels on the long side.

    Masked where the file marks a pixel of that band as nodata (its nodata value or mask).
    """
    rows, cols = thumbnail_shape(ds.height, ds.width, max_side)
    with ExitStack() as stack:
        level = _overview_level(ds, bands[0], rows, cols)
        if level is not None and ds.name and not str(ds.name).startswith("/vsimem/"):
            stack.enter_context(input_env())  # the same driver, the same guards
            ds = stack.enter_context(rasterio.open(ds.name, driver=ds.driver, overview_level=level))
        return _sampled(ds, list(bands), _samples(ds.height, rows), _samples(ds.width, cols))


def _sampled(
    ds: Any, bands: list[int], rows: NDArray[np.intp], cols: NDArray[np.intp]
) -> np.ma.MaskedArray[Any, Any]:
    data = np.zeros((len(bands), len(rows), len(cols)), dtype=ds.dtypes[bands[0] - 1])
    mask = np.zeros(data.shape, dtype=bool)
    block = max(1, int(ds.block_shapes[bands[0] - 1][0]))
    itemsize = np.dtype(data.dtype).itemsize
    if block * ds.width * len(bands) * itemsize > _MAX_BLOCK_ROW_BYTES:
        block = 1
    first = 0
    while first < len(rows):
        start = rows[first] // block * block
        last = int(np.searchsorted(rows, start + block))  # sampled rows in this block row
        lo, hi = int(rows[first]), int(rows[last - 1]) + 1
        window = ((lo, hi), (0, ds.width))
        picked = ds.read(bands, window=window)[:, rows[first:last] - lo][:, :, cols]
        data[:, first:last] = picked
        mask[:, first:last] = _invalid(ds, bands, picked, window, rows[first:last] - lo, cols)
        first = last
    return np.ma.MaskedArray(data, mask=mask)


def _invalid(
    ds: Any,
    bands: list[int],
    picked: NDArray[Any],
    window: Any,
    rows: NDArray[np.intp],
    cols: NDArray[np.intp],
) -> NDArray[np.bool_]:
    """Which picked samples are nodata, band by band.

    A nodata value is compared here: GDAL's own nodata mask would decode the band again. A
    mask band or alpha band (its own data) is read, once for all bands when it is shared.
    """
    out = np.zeros(picked.shape, dtype=bool)
    shared: NDArray[np.bool_] | None = None
    for i, band in enumerate(bands):
        flags = ds.mask_flag_enums[band - 1]
        if MaskFlags.nodata in flags:
            nodata = ds.nodatavals[band - 1]
            out[i] = np.isnan(picked[i]) if np.isnan(nodata) else picked[i] == nodata
        elif MaskFlags.all_valid not in flags:
            if shared is None or MaskFlags.per_dataset not in flags:
                masks = ds.read_masks(band, window=window)[rows][:, cols]
                shared = masks == 0
            out[i] = shared
        if picked.dtype.kind == "f":
            out[i] |= ~np.isfinite(picked[i])
    return out
