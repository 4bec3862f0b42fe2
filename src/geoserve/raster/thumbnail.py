"""Small pictures of large rasters: nearest-neighbour samples, every block decoded at most once.

GDAL's own reduced read (``read(out_shape=...)``) walks the picture one output row at a time,
and each output row needs every block of its full-width block row. Unless GDAL's block cache
holds a whole block row (of every band, for a pixel-interleaved file) the blocks are decoded
again for each output row: with the cache capped for streaming, a 13-band tiled scene took
seconds instead of milliseconds, and the cost grows with the scene's width. Here each block
row (:attr:`~geoserve.raster.source.RasterSource.block_rows`) that holds a sampled row is read
once, at full resolution, through the source's windowed read
(:meth:`~geoserve.raster.source.RasterSource.read`), and the sampled rows and columns are
picked out, so every compressed block is decoded at most once whatever the cache size, and
memory stays at one block row of the requested bands. When the source has an overview
(:meth:`~geoserve.raster.source.RasterSource.overview`: a file's smallest one at least as large
as the picture), that is read the same way instead.

Any source works alike (a file, bytes, an array, a warped or stacked input): the samples are the
pixels GDAL's nearest-neighbour resampling picks (:func:`~geoserve.raster.window_read.samples`),
and the mask is the source's (its nodata value, mask or alpha band, a float's NaN).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from typing import Any

import numpy as np
from rasterio.windows import Window

from geoserve.raster.source import RasterSource
from geoserve.raster.window_read import samples

#: Above this many bytes per block row, only the sampled rows themselves are read (files
#: stored as a few huge strips).
_MAX_BLOCK_ROW_BYTES = 256 << 20


def thumbnail_shape(height: int, width: int, max_side: int) -> tuple[int, int]:
    """(rows, cols) of a picture at most ``max_side`` pixels on its long side, never upsampled."""
    scale = max(max(width, height) / max(max_side, 1), 1.0)
    return max(1, round(height / scale)), max(1, round(width / scale))


def read_thumbnail(
    source: RasterSource, bands: Sequence[int], max_side: int
) -> np.ma.MaskedArray[Any, Any]:
    """The 0-based ``bands`` of ``source``, at most ``max_side`` pixels on the long side.

    Masked where the source marks a pixel of that band as missing (see
    :meth:`~geoserve.raster.source.RasterSource.read`).

    Raises:
        InputError: a band the source does not have (naming it).
        RasterReadError: the data cannot be decoded.
    """
    info = source.info
    rows, cols = thumbnail_shape(info.height, info.width, max_side)
    with ExitStack() as stack:
        overview = source.overview(rows, cols)
        if overview is not None:
            stack.callback(overview.close)
            source = overview
        return _sampled(source, list(bands), rows, cols)


def _sampled(
    source: RasterSource, bands: list[int], out_rows: int, out_cols: int
) -> np.ma.MaskedArray[Any, Any]:
    info = source.info
    rows, cols = samples(info.height, out_rows), samples(info.width, out_cols)
    data = np.zeros((len(bands), out_rows, out_cols), dtype=info.dtype)
    mask = np.zeros(data.shape, dtype=bool)
    block = max(1, source.block_rows)
    if block * info.width * len(bands) * data.dtype.itemsize > _MAX_BLOCK_ROW_BYTES:
        block = 1
    first = 0
    while first < len(rows):
        start = rows[first] // block * block
        last = int(np.searchsorted(rows, start + block))  # sampled rows in this block row
        lo, hi = int(rows[first]), int(rows[last - 1]) + 1
        got = source.read(Window(0, lo, info.width, hi - lo), bands, masked=True)
        picked = rows[first:last] - lo
        data[:, first:last] = np.ma.getdata(got)[:, picked][:, :, cols]
        mask[:, first:last] = np.ma.getmaskarray(got)[:, picked][:, :, cols]
        first = last
    return np.ma.MaskedArray(data, mask=mask)
