"""Reading a file (or bytes) a band of rows at a time: :class:`DatasetSource`.

Files are read in bands aligned to their internal blocks (tiles or strips) and the decoded rows
are kept until the reader moves past them: neighbouring patch rows overlap and straddle block
boundaries, and without the cache every compressed block would be decoded two or three times.
The kept rows live in a rolling row buffer that GDAL decodes into (``out=``): moving down the
image copies only the rows still needed to the buffer's top, never the whole cache, and no
array is allocated per read. GDAL decodes the blocks of one band on ``threads`` threads (its
``NUM_THREADS`` open option).

Other readers (pictures, map tiles) read windows at any size with GDAL's own windowed read
(:meth:`DatasetSource.read`, from an overview where the file has one), and the warper alone
takes the dataset itself (:meth:`DatasetSource.gdal_dataset`).

Bytes go through rasterio's ``MemoryFile``; no temporary files.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import numpy as np
import rasterio
import rasterio.errors
from numpy.typing import NDArray
from rasterio._err import CPLE_BaseError
from rasterio.enums import Resampling
from rasterio.errors import NotGeoreferencedWarning, RasterioError
from rasterio.io import MemoryFile
from rasterio.windows import Window

from geoserve.errors import InputError, InputFormatError, RasterReadError
from geoserve.raster.budget import remote_env
from geoserve.raster.source import (
    RasterInfo,
    RasterSource,
    check_dtype,
    check_size,
    warn_if_not_georeferenced,
)
from geoserve.raster.trust import (
    DEFAULT_INPUT_FORMATS,
    NOT_RASTER,
    apply_http_defaults,
    detect_format,
    gdal_drivers,
    input_env,
    read_head,
    refuse_other_formats,
)
from geoserve.raster.window_read import WindowRead, dataset_mask

#: Fewest rows the row buffer decodes at once (whole block rows: a strip-per-row file is still
#: decoded in bands of rows, and a row of patches spans one or two chunks).
CHUNK_ROWS = 128

#: GDAL drivers that take the ``NUM_THREADS`` open option (the others log that they do not).
THREADED_DRIVERS = frozenset({"GTiff"})


class DatasetSource(RasterSource):
    """A source backed by a rasterio dataset (a file, or bytes in a ``MemoryFile``).

    Reads go through a cache of decoded, block-aligned rows; see the module docstring.
    """

    def __init__(
        self,
        name: str,
        path: str | None = None,
        data: bytes | MemoryFile | None = None,
        threads: int = 1,
        formats: Sequence[str] = DEFAULT_INPUT_FORMATS,
        overview_level: int | None = None,
    ) -> None:
        """Open ``path`` or ``data`` (bytes, or a ``MemoryFile`` read but not owned).

        ``overview_level``: open that 0-based overview of the file instead, as a raster of its
        own (:meth:`overview`).
        """
        self._memfile: MemoryFile | None = None
        self._owns_memfile = not isinstance(data, MemoryFile)
        self._path, self._threads, self._formats = path, threads, tuple(formats)
        self._restricted = False
        # the rolling row buffer: decoded chunks of whole block rows of the bands
        # _cache_bands, (first row, rows, array) in row order; chunks the reader has moved past
        # go to _spare, and GDAL decodes the next chunks into them
        self._chunks: deque[tuple[int, int, NDArray[Any]]] = deque()
        self._spare: list[NDArray[Any]] = []
        self._cache_bands: tuple[int, ...] = ()
        self.rows_decoded = 0  # rows read from the file (for tests: each block once)
        self._offset = (0, 0)  # of a window (restrict): its first column and row
        apply_http_defaults()
        options: dict[str, Any] = {"NUM_THREADS": str(threads)} if threads > 1 else {}
        if overview_level is not None:
            options["OVERVIEW_LEVEL"] = str(overview_level)
        if isinstance(data, MemoryFile):
            self._memfile = data
        elif data is not None:
            self._memfile = MemoryFile(data)
        try:
            with warnings.catch_warnings(), input_env():  # geoserve warns itself, naming it
                warnings.simplefilter("ignore", rasterio.errors.NotGeoreferencedWarning)
                self._ds = self._open_with(gdal_drivers(formats), path, options)
        except RasterioError as exc:
            internal = self._memfile.name if self._memfile is not None else None
            self.close()
            local = data is None and path is not None and not path.startswith("/vsi")
            raw = data if isinstance(data, bytes) else b""  # (a shared MemoryFile: checked)
            head = read_head(path) if local and path else raw[:4096]
            refuse_other_formats(name, head, formats)
            fmt, what = detect_format(head)
            why = what if fmt in NOT_RASTER else _without(str(exc), internal)
            raise RasterReadError(f"{name}: not a readable raster ({why})") from exc
        ds = self._ds
        if ds.driver not in gdal_drivers(formats):  # belt and braces: GDAL honoured the list
            self.close()
            raise InputFormatError(f"{name}: format {ds.driver} is not allowed")
        self.info = RasterInfo(
            name=name,
            width=ds.width,
            height=ds.height,
            count=ds.count,
            dtype=ds.dtypes[0],
            crs=ds.crs,
            transform=ds.transform,
            nodata=ds.nodata,
            descriptions=tuple(ds.descriptions),
            tags=ds.tags(),
            units=tuple(u or None for u in ds.units),
            profile=dict(ds.profile),
            block_bytes=_block_bytes(ds),
            held_bytes=len(data) if isinstance(data, bytes) else 0,
            colormap=_colormap(ds),
        )
        try:
            check_dtype(name, self.info.dtype)
            check_size(self.info)
        except InputError:
            self.close()
            raise
        warn_if_not_georeferenced(self.info)
        self._block_rows = max(1, int(ds.block_shapes[0][0]))
        self._chunk_rows = -(-CHUNK_ROWS // self._block_rows) * self._block_rows

    def _open_with(self, drivers: list[str], path: str | None, options: dict[str, Any]) -> Any:
        """Open with each allowed driver in turn: never GDAL's own sniffing of the content."""
        for i, driver in enumerate(drivers):
            if driver not in THREADED_DRIVERS:
                options = {k: v for k, v in options.items() if k != "NUM_THREADS"}
            try:
                if self._memfile is not None:
                    return self._memfile.open(driver=driver, **options)
                return rasterio.open(path, driver=driver, **options)
            except RasterioError:
                if i == len(drivers) - 1:
                    raise
        raise AssertionError("no drivers")  # check_formats refuses an empty list

    @property
    def block_rows(self) -> int:
        """The file's block height (a tile's, or a strip's rows)."""
        return self._block_rows

    @contextmanager
    def gdal_dataset(self) -> Iterator[Any]:
        """The file's own rasterio dataset, opened through the trust rules (for the warper).

        It stays open as long as the source (leaving the context closes nothing). A window of
        a file (:meth:`restrict`) hands the whole file: the warper places its pixels by their
        georeferencing.
        """
        yield self._ds

    def overview(self, rows: int, cols: int) -> RasterSource | None:
        """The smallest of the file's overviews still at least ``rows`` x ``cols``, if any.

        Opened as the file was (the same bytes, path or URL, drivers and trust rules; bytes
        are never reopened by their in-memory name), as a source of its own for the caller to
        close. None for a window of a file (:meth:`restrict`), or when no overview is as large.
        """
        if self._restricted:
            return None
        ds, level = self._ds, None
        for i, factor in enumerate(ds.overviews(1)):
            if -(-ds.height // factor) >= rows and -(-ds.width // factor) >= cols:
                level = i
        if level is None:
            return None
        kw: dict[str, Any] = {"threads": self._threads, "formats": self._formats}
        name = f"{self.info.name} (overview {level + 1})"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NotGeoreferencedWarning)  # (warned for the file)
            if self._memfile is not None:
                return DatasetSource(name, data=self._memfile, overview_level=level, **kw)
            path = self._path or ""
            remote = path.startswith("/vsicurl/")  # (charged to the request's budget)
            with remote_env(path.removeprefix("/vsicurl/")) if remote else nullcontext():
                return DatasetSource(name, path=path, overview_level=level, **kw)

    def _read_window(self, req: WindowRead) -> NDArray[Any]:
        """See :meth:`RasterSource.read`: GDAL's own windowed read.

        ``out_shape`` and ``resampling`` as GDAL takes them: from an overview where the file
        has one.
        """
        col, row = self._offset
        window = Window(col + req.col, row + req.row, req.width, req.height)
        indexes = [b + 1 for b in req.bands]
        shape = None if req.full else (len(indexes), *req.out_shape)
        try:
            with input_env():
                data: NDArray[Any] = self._ds.read(
                    indexes,
                    window=window,
                    out_shape=shape,
                    resampling=Resampling[req.resampling],
                )
                if not req.masked:
                    return data
                mask = dataset_mask(self._ds, indexes, data, window, req)
        except (RasterioError, CPLE_BaseError) as exc:
            raise RasterReadError(
                f"{self.info.name}: cannot read window {req.window} ({exc}); "
                "the file may be truncated or corrupt"
            ) from exc
        return np.ma.MaskedArray(data, mask=mask)

    def read_rows(self, row_start: int, row_stop: int, bands: Sequence[int]) -> NDArray[Any]:
        """See :meth:`RasterSource.read_rows`; rows come from the rolling row buffer.

        The returned array may be a view of that buffer: it stays valid only until the next
        read of this source, and callers must not modify it (copy what you keep).
        """
        pieces = self.read_pieces(row_start, row_stop, bands)
        if len(pieces) == 1:
            return pieces[0][1]
        return np.concatenate([piece for _, piece in pieces], axis=1)

    def read_pieces(
        self, row_start: int, row_stop: int, bands: Sequence[int]
    ) -> list[tuple[int, NDArray[Any]]]:
        """See :meth:`RasterSource.read_pieces`: views of the decoded chunks, never a copy.

        Chunks are whole block rows (at least :data:`CHUNK_ROWS` rows), each decoded once, in
        order, into a recycled array; a chunk is dropped when a read starts below it. Reading
        backwards, past every cached row, or other bands starts afresh.
        """
        key = tuple(bands)
        chunks = self._chunks
        if key != self._cache_bands or not chunks or row_start < chunks[0][0]:
            self._recycle(len(chunks))
            self._cache_bands = key
        while chunks and chunks[0][0] + chunks[0][1] <= row_start:
            self._recycle(1)  # the reader has moved past it
        if chunks:
            next_row = chunks[-1][0] + chunks[-1][1]
        else:  # (also after a jump past every cached row)
            next_row = row_start - row_start % self._block_rows
        while next_row < row_stop:
            rows = min(self._chunk_rows, self.info.height - next_row)
            out = self._spare.pop() if self._spare else None
            if out is None or out.shape[0] < len(key):
                shape = (len(key), min(self._chunk_rows, self.info.height), self.info.width)
                out = np.empty(shape, self.info.dtype)
            self._read(next_row, next_row + rows, key, out[: len(key), :rows])
            chunks.append((next_row, rows, out))
            next_row += rows
        pieces = []
        for first, rows, arr in chunks:
            lo, hi = max(first, row_start), min(first + rows, row_stop)
            if lo < hi:
                pieces.append((lo, arr[: len(key), lo - first : hi - first]))
        return pieces

    def _recycle(self, n: int) -> None:
        """Drop the first ``n`` chunks, keeping their arrays for the next decodes."""
        for _ in range(n):
            self._spare.append(self._chunks.popleft()[2])
        del self._spare[1:]  # (one is all a forward reader needs: see memory_estimate)

    def restrict(self, window: Window, name: str) -> None:
        """From now on, the source is ``window`` of the file (its grid, its rows), named ``name``.

        Raises:
            InputError: the window is empty or not inside the raster.
        """
        ds = self._ds
        col, row = int(window.col_off), int(window.row_off)
        width, height = int(window.width), int(window.height)
        if (
            width < 1
            or height < 1
            or min(col, row) < 0
            or col + width > ds.width
            or (row + height > ds.height)
        ):
            raise InputError(f"{name}: window {window} is not inside {self.info.name}")
        self._offset = (col, row)
        self._restricted = True
        transform = ds.window_transform(window)
        profile = {**self.info.profile, "width": width, "height": height, "transform": transform}
        across = int(ds.block_shapes[0][1])  # GDAL decodes the blocks the window touches
        touched = min(ds.width, -(-(col + width) // across) * across) - col // across * across
        self.info = dataclasses.replace(
            self.info,
            name=name,
            width=width,
            height=height,
            transform=transform,
            profile=profile,
            block_bytes=self.info.block_bytes * touched // ds.width,
        )
        self._recycle(len(self._chunks))
        self._spare.clear()  # (chunks of the old width)

    def _read(self, row_start: int, row_stop: int, bands: Sequence[int], out: NDArray[Any]) -> None:
        """Decode rows ``[row_start, row_stop)`` of ``bands`` into ``out``."""
        col, row = self._offset
        window = Window(col, row + row_start, self.info.width, row_stop - row_start)
        try:
            self._ds.read([b + 1 for b in bands], window=window, out=out)
        except RasterioError as exc:
            raise RasterReadError(
                f"{self.info.name}: cannot read rows {row_start}-{row_stop} ({exc}); "
                "the file may be truncated or corrupt"
            ) from exc
        self.rows_decoded += row_stop - row_start

    def close(self) -> None:
        """Close the dataset and its memory file."""
        ds = getattr(self, "_ds", None)
        if ds is not None:
            ds.close()
        if self._memfile is not None and self._owns_memfile:
            self._memfile.close()


def _block_bytes(ds: Any) -> int:
    """Bytes of a decoded block row (one strip: all of it; pixel-interleaved: every band)."""
    rows = max(1, int(ds.block_shapes[0][0]))
    pixel = str(getattr(ds, "interleaving", None) or "").lower().endswith("pixel")
    bands = ds.count if pixel else 1
    return int(rows * ds.width * bands * np.dtype(ds.dtypes[0]).itemsize)


def _colormap(ds: Any) -> dict[int, tuple[int, int, int, int]] | None:
    """Band 1's colour table (value -> RGBA), or None when it has none."""
    try:
        table = ds.colormap(1)
    except (ValueError, RasterioError):  # (rasterio: "NULL color table")
        return None
    return {int(k): (int(r), int(g), int(b), int(a)) for k, (r, g, b, a) in table.items()}


def _without(message: str, internal: str | None) -> str:
    """GDAL's message without the in-memory file name it gave uploaded bytes."""
    for form in (internal, internal and internal.rsplit("/", 1)[-1]) if internal else ():
        message = message.replace(f"{form}: ", "").replace(str(form), "the file")
    return message
