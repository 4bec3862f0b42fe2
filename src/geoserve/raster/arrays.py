"""In-memory and lazy inputs: a :class:`~geoserve.raster.source.RasterArray` read as a source.

The array is kept as it was given, never loaded whole: a numpy array, an ``np.memmap``, or any
array-like with ``shape``, ``dtype``, ``ndim`` and numpy-style slicing (a Dask, Zarr or h5py
array). A read slices what it needs (integers and slices only, one band at a time unless the
bands are consecutive) and converts just that with ``np.asarray``, so a lazy array computes or
loads only the rows (and, for a window, the columns) asked for.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
from affine import Affine
from numpy.typing import NDArray
from rasterio.io import MemoryFile
from rasterio.windows import Window

from geoserve.errors import InputError, RasterReadError
from geoserve.raster.source import (
    RasterArray,
    RasterInfo,
    RasterSource,
    check_dtype,
    check_size,
    warn_if_not_georeferenced,
)

#: Rows copied at once into the in-memory GeoTIFF the warper reads (:meth:`gdal_dataset`).
_COPY_ROWS = 256


def _array_like(data: Any) -> Any:
    """``data`` itself when it is array-like (shape, dtype, ndim, slicing), else as numpy."""
    if all(hasattr(data, a) for a in ("shape", "dtype", "ndim", "__getitem__")):
        try:
            np.dtype(data.dtype)
            return data
        except TypeError:  # (a dtype numpy does not know: a torch tensor, say)
            pass
    return np.asarray(data)


class ArraySource(RasterSource):
    """A source backed by a :class:`RasterArray` (see the module docstring)."""

    def __init__(self, raster: RasterArray) -> None:
        data = _array_like(raster.data)
        shape = tuple(int(s) for s in data.shape)
        if len(shape) not in (2, 3):
            raise InputError(
                f"{raster.name}: array must be (bands, height, width), got shape {shape}"
            )
        dtype = np.dtype(data.dtype)
        check_dtype(raster.name, str(dtype))
        self._flat = len(shape) == 2  # a 2-D array is one band
        prof = dict(raster.profile)
        count, height, width = (1, *shape) if self._flat else shape
        descriptions = tuple(prof.pop("descriptions", None) or (None,) * count)
        if len(descriptions) != count:
            raise InputError(
                f"{raster.name}: {len(descriptions)} band descriptions for {count} bands"
            )
        self._data = data
        self.info = RasterInfo(
            name=raster.name,
            width=width,
            height=height,
            count=count,
            dtype=str(dtype),
            crs=prof.get("crs"),
            transform=prof.get("transform") or Affine.identity(),
            nodata=prof.get("nodata"),
            descriptions=descriptions,
            tags=dict(prof.pop("tags", {}) or {}),
            profile={**prof, "count": count, "height": height, "width": width},
        )
        check_size(self.info)
        warn_if_not_georeferenced(self.info)

    @property
    def block_rows(self) -> int:
        """The array's chunk height where it has chunks (Dask, Zarr, h5py), else 1."""
        chunks = getattr(self._data, "chunks", None)
        if not isinstance(chunks, tuple) or len(chunks) != (2 if self._flat else 3):
            return 1
        rows = chunks[0 if self._flat else 1]
        if isinstance(rows, tuple):  # (Dask: the size of every chunk)
            rows = max(rows, default=1)
        return rows if isinstance(rows, int) and rows > 0 else 1

    def read_rows(self, row_start: int, row_stop: int, bands: Sequence[int]) -> NDArray[Any]:
        """See :meth:`RasterSource.read_rows`: only these rows are sliced and converted."""
        return self._read_block(row_start, row_stop, 0, self.info.width, bands)

    def _read_block(
        self, row_start: int, row_stop: int, col_start: int, col_stop: int, bands: Sequence[int]
    ) -> NDArray[Any]:
        """Rows and columns of ``bands`` sliced from the array, and only those converted."""
        rows, cols = slice(row_start, row_stop), slice(col_start, col_stop)
        picked = list(bands)
        if not picked:
            return np.empty((0, row_stop - row_start, col_stop - col_start), self.info.dtype)
        for band in picked:
            if not 0 <= band < self.info.count:
                raise InputError(
                    f"{self.info.name}: band {band + 1} requested; it has {self.info.count} band(s)"
                )
        want = (len(picked), row_stop - row_start, col_stop - col_start)
        try:
            if self._flat:
                out = np.asarray(self._data[rows, cols])[np.newaxis]
            elif picked == list(range(picked[0], picked[0] + len(picked))):
                out = np.asarray(self._data[picked[0] : picked[-1] + 1, rows, cols])
            else:
                out = np.stack([np.asarray(self._data[b, rows, cols]) for b in picked])
        except Exception as exc:  # (a lazy array's own failure: a chunk it cannot load)
            raise RasterReadError(
                f"{self.info.name}: cannot read rows {row_start}-{row_stop} ({exc})"
            ) from exc
        if out.shape != want:
            raise RasterReadError(
                f"{self.info.name}: rows {row_start}-{row_stop} came back as {out.shape}, "
                f"not {want}"
            )
        return out.astype(self.info.dtype, copy=False)

    @contextmanager
    def gdal_dataset(self) -> Iterator[Any]:
        """The array as an in-memory GeoTIFF, copied into it a band of rows at a time."""
        info = self.info
        profile = {
            "driver": "GTiff",
            "width": info.width,
            "height": info.height,
            "count": info.count,
            "dtype": info.dtype,
            "crs": info.crs,
            "transform": info.transform,
            "nodata": info.nodata,
        }
        with MemoryFile() as mem:
            with mem.open(**profile) as dst:
                step = max(self.block_rows, _COPY_ROWS)
                for start in range(0, info.height, step):
                    stop = min(info.height, start + step)
                    rows = self.read_rows(start, stop, range(info.count))
                    dst.write(rows, window=Window(0, start, info.width, stop - start))
            with mem.open() as ds:
                yield ds
