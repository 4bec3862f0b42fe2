"""Opening request inputs as rasters, and reading them a band of rows at a time.

An input is a path, GeoTIFF ``bytes``, a base64 string of those bytes, or a
:class:`RasterArray` (a numpy array with a rasterio-style profile). Whatever the form, it becomes
a :class:`RasterSource`, which exposes the metadata (:class:`RasterInfo`) and one read method,
:meth:`RasterSource.read_rows`. Reading a band of rows at a time (never the whole scene) keeps
memory proportional to the scene's width, not its area.

Files are read in bands aligned to their internal blocks (tiles or strips) and the decoded rows
are kept until the reader moves past them: neighbouring patch rows overlap and straddle block
boundaries, and without the cache every compressed block would be decoded two or three times.
The kept rows live in a rolling row buffer that GDAL decodes into (``out=``): moving down the
image copies only the rows still needed to the buffer's top, never the whole cache, and no
array is allocated per read. GDAL decodes the blocks of one band on ``threads`` threads (its
``NUM_THREADS`` open option).

Bytes go through rasterio's ``MemoryFile``; no temporary files.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime as dt
import os
import re
import warnings
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import rasterio
import rasterio.errors
from affine import Affine
from numpy.typing import NDArray
from rasterio.errors import RasterioError
from rasterio.io import MemoryFile
from rasterio.windows import Window

from geoserve.errors import (
    InputError,
    InputFormatError,
    NotGeoreferencedWarning,
    RasterReadError,
)
from geoserve.raster.budget import remote_env

# the input values open_raster takes beside paths and bytes (their own module; named here too)
from geoserve.raster.input_values import NamedBytes as NamedBytes
from geoserve.raster.input_values import RasterArray as RasterArray
from geoserve.raster.input_values import RasterWindow as RasterWindow
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

DataFormat = Literal["auto", "path", "bytes", "b64", "url"]

RasterLike = str | os.PathLike[str] | bytes | NamedBytes | RasterArray | RasterWindow


@dataclass(frozen=True)
class RasterInfo:
    """Metadata of one input raster, read once when the request is admitted."""

    name: str
    width: int
    height: int
    count: int
    dtype: str
    crs: Any
    transform: Affine
    nodata: float | None
    descriptions: tuple[str | None, ...]
    tags: Mapping[str, str]
    profile: Mapping[str, Any]
    block_bytes: int = 0
    """Bytes GDAL decodes at once for one block row (every band if pixel-interleaved)."""
    held_bytes: int = 0
    """Bytes the opened input itself holds in memory (uploaded or decoded base64 bytes)."""
    date: dt.date | None = None
    """The acquisition date given with the input (``dates=``): it wins over tags and name."""
    units: tuple[str | None, ...] = ()
    """Each band's unit (GDAL's band unit type, ``"dB"``), where the file declares one."""

    @property
    def is_georeferenced(self) -> bool:
        """Whether the raster has a CRS and a non-identity transform."""
        return self.crs is not None and self.transform != Affine.identity()


class RasterSource(ABC):
    """An opened input raster that is read by bands of rows."""

    info: RasterInfo

    @abstractmethod
    def read_rows(self, row_start: int, row_stop: int, bands: Sequence[int]) -> NDArray[Any]:
        """Read rows ``[row_start, row_stop)`` of the 0-based ``bands``, full width.

        Returns an array of shape (len(bands), row_stop - row_start, width) in the file dtype.

        Raises:
            RasterReadError: if the data cannot be decoded (truncated or corrupt file).
        """

    def read_cost(self, bands: Sequence[int]) -> int:
        """Pixels decoded to read ``bands`` over the whole grid (a request's size guard)."""
        return self.info.width * self.info.height * len(bands)

    def warp_bytes(self, bands: Sequence[int]) -> int:
        """Memory GDAL's warper may hold at once to read ``bands`` (0: nothing is warped)."""
        return 0

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release the underlying dataset."""

    def __enter__(self) -> RasterSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_dtype(name: str, dtype: str) -> None:
    """Refuse data types the engine cannot read (only integer and float bands)."""
    kind = np.dtype(dtype).kind
    if kind not in "uif":
        raise InputError(f"{name}: data type {dtype} is not supported; need integer or float bands")


def check_size(info: RasterInfo) -> None:
    """Refuse an input without pixels."""
    if info.width < 1 or info.height < 1:
        raise InputError(f"{info.name}: image is {info.width}x{info.height}; it has no pixels")


def warn_if_not_georeferenced(info: RasterInfo) -> None:
    """Warn, naming the input, that its output will not be georeferenced either."""
    if not info.is_georeferenced:
        warnings.warn(
            f"{info.name}: no CRS or geotransform; the output will not be georeferenced either",
            NotGeoreferencedWarning,
            stacklevel=4,
        )


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
        data: bytes | None = None,
        threads: int = 1,
        formats: Sequence[str] = DEFAULT_INPUT_FORMATS,
    ) -> None:
        self._memfile: MemoryFile | None = None
        # the rolling row buffer: rows [_cache_start, _cache_start + _cache_rows) of the bands
        # _cache_bands, in _buffers[0]; _buffers[1] is where they move when the reader moves on
        self._buffers: list[NDArray[Any]] = []
        self._cache_rows = 0
        self._cache_start = 0
        self._cache_bands: tuple[int, ...] = ()
        self.rows_decoded = 0  # rows read from the file (for tests: each block once)
        self._offset = (0, 0)  # of a window (restrict): its first column and row
        apply_http_defaults()
        options: dict[str, Any] = {"NUM_THREADS": str(threads)} if threads > 1 else {}
        if data is not None:
            self._memfile = MemoryFile(data)
        try:
            with warnings.catch_warnings(), input_env():  # geoserve warns itself, naming it
                warnings.simplefilter("ignore", rasterio.errors.NotGeoreferencedWarning)
                self._ds = self._open_with(gdal_drivers(formats), path, options)
        except RasterioError as exc:
            internal = self._memfile.name if self._memfile is not None else None
            self.close()
            local = data is None and path is not None and not path.startswith("/vsi")
            head = read_head(path) if local and path else (data or b"")[:4096]
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
            held_bytes=len(data) if data is not None else 0,
        )
        try:
            check_dtype(name, self.info.dtype)
            check_size(self.info)
        except InputError:
            self.close()
            raise
        warn_if_not_georeferenced(self.info)
        self._block_rows = max(1, int(ds.block_shapes[0][0]))

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
    def dataset(self) -> Any:
        """The open rasterio dataset (for GDAL operations on it, such as warping)."""
        return self._ds

    def read_rows(self, row_start: int, row_stop: int, bands: Sequence[int]) -> NDArray[Any]:
        """See :meth:`RasterSource.read_rows`; rows come from the rolling row buffer.

        The returned array is a view of that buffer: it stays valid only until the next
        ``read_rows`` of this source, and callers must not modify it (copy what you keep).
        """
        key = tuple(bands)
        cached = range(self._cache_start, self._cache_start + self._cache_rows)
        if not self._buffers or key != self._cache_bands or row_start not in cached:
            # new bands, reading backwards or past every cached row: start afresh
            self._cache_bands, self._cache_rows = key, 0
            self._cache_start = row_start - row_start % self._block_rows
        elif row_start > self._cache_start:  # forget the rows above: reads only move down
            drop = row_start - self._cache_start
            keep = self._cache_rows - drop
            if keep:  # the rows still needed go to the top of the other buffer
                src, dst = self._buffers
                dst[: len(key), :keep] = src[: len(key), drop : drop + keep]
                self._buffers.reverse()
            self._cache_start += drop
            self._cache_rows = keep
        have = self._cache_start + self._cache_rows
        if row_stop > have:
            stop = min(self.info.height, -(-row_stop // self._block_rows) * self._block_rows)
            rows = stop - self._cache_start
            self._reserve(len(key), rows)
            self._read(
                have, stop, key, self._buffers[0][: len(key), have - self._cache_start : rows]
            )
            self._cache_rows = rows
        lo = row_start - self._cache_start
        return self._buffers[0][: len(key), lo : row_stop - self._cache_start]

    def _reserve(self, bands: int, rows: int) -> None:
        """Make both row buffers hold ``rows`` rows of ``bands`` bands, keeping the cached rows."""
        if self._buffers:
            have_bands, have_rows = self._buffers[0].shape[:2]
            if have_bands >= bands and have_rows >= rows:
                return
            bands, rows = max(bands, have_bands), max(rows, have_rows)
        shape = (bands, rows, self.info.width)
        grown = [np.empty(shape, dtype=self.info.dtype) for _ in range(2)]
        if self._buffers and self._cache_rows:
            old = self._buffers[0]
            grown[0][: old.shape[0], : self._cache_rows] = old[:, : self._cache_rows]
        self._buffers = grown

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
        self._buffers, self._cache_rows = [], 0

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
        if self._memfile is not None:
            self._memfile.close()


def _block_bytes(ds: Any) -> int:
    """Bytes of a decoded block row (one strip: all of it; pixel-interleaved: every band)."""
    rows = max(1, int(ds.block_shapes[0][0]))
    pixel = str(getattr(ds, "interleaving", None) or "").lower().endswith("pixel")
    bands = ds.count if pixel else 1
    return int(rows * ds.width * bands * np.dtype(ds.dtypes[0]).itemsize)


_REMOTE = ("/vsicurl/", "http://", "https://")
_B64_CHARS = re.compile(r"^[A-Za-z0-9+/=\s_-]+$")


def _decode_b64(text: str) -> bytes:
    try:
        return base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InputError(f"input is not valid base64 ({exc})") from exc


def open_raster(
    obj: RasterLike,
    data_format: DataFormat = "auto",
    *,
    threads: int = 1,
    formats: Sequence[str] = DEFAULT_INPUT_FORMATS,
) -> RasterSource:
    """Open one request input (``threads``: GDAL's decoding threads for files and bytes).

    Whatever the form, the content is opened only by the GDAL drivers in ``formats`` (GeoTIFF
    by default): see :mod:`geoserve.raster.trust`.

    ``data_format="auto"`` treats ``bytes`` as a GeoTIFF, a :class:`RasterArray` as itself, an
    existing path as a path, an ``http(s)://`` URL as a remote file read in place by range
    requests (GDAL's ``/vsicurl/``; a Cloud-Optimized GeoTIFF reads best), and any other long
    base64-looking string as base64. (The server never passes client strings here unchecked:
    it resolves paths and vets URLs first.)

    Raises:
        RasterReadError: the file is missing or is not a readable raster.
        InputFormatError: the content is a format outside ``formats`` (a VRT, say).
        InputError: bad base64, an unsupported data type, or zero width/height.
    """
    kw: dict[str, Any] = {"threads": threads, "formats": formats}
    source: RasterSource
    if isinstance(obj, RasterWindow):
        remote = obj.path.startswith(_REMOTE)
        source = _open_text(obj.path, False, "auto" if remote else "path", kw)
        try:
            assert isinstance(source, DatasetSource)  # (a path or URL opens as a dataset)
            source.restrict(obj.window, obj.name)
        except BaseException:
            source.close()
            raise
    elif isinstance(obj, RasterArray):
        from geoserve.raster.arrays import ArraySource  # (it builds on this module)

        source = ArraySource(obj)
    elif isinstance(obj, NamedBytes):
        if data_format not in ("auto", "bytes"):
            raise InputError(f"got bytes but data_format={data_format!r}")
        source = DatasetSource(obj.shown, data=bytes(obj.data), **kw)
    elif isinstance(obj, bytes | bytearray | memoryview):
        if data_format not in ("auto", "bytes"):
            raise InputError(f"got bytes but data_format={data_format!r}")
        source = DatasetSource("<bytes>", data=bytes(obj), **kw)
    elif isinstance(obj, str | os.PathLike):
        source = _open_text(os.fspath(obj), isinstance(obj, str), data_format, kw)
    else:
        raise InputError(
            f"unsupported input of type {type(obj).__name__}; pass a path, GeoTIFF bytes, "
            "a base64 string or a geoserve.RasterArray"
        )
    return source


def _without(message: str, internal: str | None) -> str:
    """GDAL's message without the in-memory file name it gave uploaded bytes."""
    for form in (internal, internal and internal.rsplit("/", 1)[-1]) if internal else ():
        message = message.replace(f"{form}: ", "").replace(str(form), "the file")
    return message


def _open_text(
    text: str, is_str: bool, data_format: DataFormat, kw: dict[str, Any]
) -> RasterSource:
    """:func:`open_raster` for a string or path: base64, a URL, or a local file."""
    if data_format == "b64" or (
        data_format == "auto"
        and is_str
        and len(text) >= 64
        and not os.path.exists(text)
        and _B64_CHARS.match(text[:4096]) is not None
    ):
        return DatasetSource("<base64>", data=_decode_b64(text), **kw)
    if data_format in ("auto", "url") and text.startswith(_REMOTE):
        url = text.removeprefix("/vsicurl/")  # read in place by HTTP range requests
        if not url.startswith(("http://", "https://")):
            raise InputError(f"{text}: only http(s) URLs are read remotely")
        with remote_env(url):  # charged to the request's budget, GDAL's timeouts capped
            return DatasetSource(url, path="/vsicurl/" + url, **kw)
    if data_format == "url":
        raise InputError(f"{text}: not an http(s) URL")
    path = Path(text)  # a local file, named literally: GDAL's /vsi prefixes mean nothing here
    if not text.strip():
        raise RasterReadError(f"{text!r}: an empty file name")
    if text.startswith("/vsi") or ":" in path.parts[0]:  # GDAL's prefixes, GTIFF_DIR:
        raise RasterReadError(f"{text}: not a local file path")
    if not path.exists():
        raise RasterReadError(f"{text}: no such file")
    if path.is_dir():
        raise RasterReadError(f"{text}: is a directory, not a raster file")
    if not path.is_file():  # a FIFO or device would block or never end
        raise RasterReadError(f"{text}: not a regular file")
    return DatasetSource(text, path=text, **kw)
