"""Opening request inputs as rasters, and reading them a band of rows at a time.

An input is a path, GeoTIFF ``bytes``, a base64 string of those bytes, or a
:class:`RasterArray` (an array, or a lazy array-like, with a rasterio-style profile). Whatever
the form, it becomes a :class:`RasterSource`, which exposes the metadata (:class:`RasterInfo`)
and two reads: :meth:`RasterSource.read_rows`, a band of full-width rows (what the engine
streams; reading a band of rows at a time, never the whole scene, keeps memory proportional to
the scene's width, not its area), and :meth:`RasterSource.read`, any window at any size
(pictures, map tiles), built on ``read_rows`` unless a kind of source reads windows itself.
Every reader of pixels goes through these two, so a new kind of source is one subclass; GDAL's
warper alone takes a GDAL dataset (:meth:`RasterSource.gdal_dataset`).

Files are read by :class:`~geoserve.raster.dataset.DatasetSource`, a band of rows at a time.

Bytes go through rasterio's ``MemoryFile``; no temporary files.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import os
import re
import warnings
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from affine import Affine
from numpy.typing import NDArray
from rasterio.windows import Window

from geoserve.errors import (
    InputError,
    NotGeoreferencedWarning,
    RasterReadError,
)
from geoserve.raster.budget import remote_env
from geoserve.raster.cube import cube_raster, is_dataarray

# the input values open_raster takes beside paths and bytes (their own module; named here too)
from geoserve.raster.input_values import NamedBytes as NamedBytes
from geoserve.raster.input_values import RasterArray as RasterArray
from geoserve.raster.input_values import RasterWindow as RasterWindow
from geoserve.raster.trust import (
    DEFAULT_INPUT_FORMATS,
)
from geoserve.raster.window_read import (
    WindowRead,
    check_read,
    read_picked,
    read_resampled,
    samples,
    value_mask,
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
    colormap: Mapping[int, tuple[int, int, int, int]] | None = None
    """Band 1's colour table (value -> RGBA), where the file has one (a class map)."""

    @property
    def is_georeferenced(self) -> bool:
        """Whether the raster has a CRS and a non-identity transform."""
        return self.crs is not None and self.transform != Affine.identity()


class RasterSource(ABC):
    """An opened input raster that is read by bands of rows, or by windows.

    A kind of source implements :meth:`read_rows`; everything else has a default built on it:
    :meth:`read` (a window at any size, masked or not), :attr:`block_rows`, :meth:`overview`
    (none) and :meth:`gdal_dataset` (none: such a source cannot be warped). A source that can
    do better overrides them (a file: GDAL's own windowed read, its overviews).
    """

    info: RasterInfo

    @abstractmethod
    def read_rows(self, row_start: int, row_stop: int, bands: Sequence[int]) -> NDArray[Any]:
        """Read rows ``[row_start, row_stop)`` of the 0-based ``bands``, full width.

        Returns an array of shape (len(bands), row_stop - row_start, width) in the file dtype.

        Raises:
            RasterReadError: if the data cannot be decoded (truncated or corrupt file).
        """

    def read_pieces(
        self, row_start: int, row_stop: int, bands: Sequence[int]
    ) -> list[tuple[int, NDArray[Any]]]:
        """:meth:`read_rows` as consecutive pieces ``(first row, array)``, in row order.

        A source that keeps decoded rows in chunks hands out views of them, so a reader that
        copies the rows anyway (the patcher) never has them joined first. Valid until the next
        read of the source. By default one piece, :meth:`read_rows`.
        """
        return [(row_start, self.read_rows(row_start, row_stop, bands))]

    def read(
        self,
        window: Window,
        bands: Sequence[int],
        *,
        out_shape: Sequence[int] | None = None,
        resampling: str = "nearest",
        masked: bool = False,
    ) -> NDArray[Any]:
        """The pixels of ``window`` (in this source's grid) of the 0-based ``bands``.

        Returns (len(bands), rows, cols) in the source's dtype: the window's own size, or
        ``out_shape`` (rows, cols) resampled by ``resampling`` (a GDAL/rasterio name: one of
        :data:`~geoserve.raster.window_read.READ_RESAMPLINGS`). With ``masked=True``, a
        :class:`numpy.ma.MaskedArray` masked where the source says a pixel is missing (its
        nodata value, its mask or alpha band, a float's NaN or infinity).

        By default it is built on :meth:`read_rows`: the window's rows are read a band of
        :attr:`block_rows` at a time and its columns sliced; ``nearest`` picks exactly the
        pixels GDAL's nearest-neighbour read picks, reading only the rows it samples; any
        other resampling is GDAL's own, on an in-memory copy of the window and the margin its
        kernel reads (so it matches a file read the same way; memory: the window at full
        resolution). Pixels are masked where they hold the source's nodata value.

        Raises:
            InputError: naming the source: a window not inside it, no bands or a band it does
                not have, a non-positive ``out_shape``, an unknown resampling.
            RasterReadError: the data cannot be decoded.
        """
        req = check_read(self.info, window, bands, out_shape, resampling, masked)
        return self._read_window(req)

    def _read_window(self, req: WindowRead) -> NDArray[Any]:
        """:meth:`read` of a checked request (a source that reads windows better overrides it)."""
        if req.full or req.resampling == "nearest":
            rows = req.row + samples(req.height, req.out_shape[0])
            cols = req.col + samples(req.width, req.out_shape[1])
            data = read_picked(
                self._read_block, self.info.dtype, rows, cols, req.bands, self.block_rows
            )
        else:
            data = read_resampled(self._read_block, self.info, req, self.block_rows)
        if not req.masked:
            return data
        return np.ma.MaskedArray(data, mask=value_mask(data, self.info.nodata))

    def _read_block(
        self, row_start: int, row_stop: int, col_start: int, col_stop: int, bands: Sequence[int]
    ) -> NDArray[Any]:
        """Rows ``[row_start, row_stop)``, columns ``[col_start, col_stop)`` of ``bands``.

        By default :meth:`read_rows`, its columns sliced; a source that can read fewer
        columns than the whole width (an array) overrides it.
        """
        rows = self.read_rows(row_start, row_stop, bands)
        if col_start == 0 and col_stop == self.info.width:
            return rows
        return rows[:, :, col_start:col_stop]

    @property
    def block_rows(self) -> int:
        """Rows the source decodes at once (a file's block height; 1: no blocks of its own).

        A reader that must not decode a block twice reads whole bands of this many rows.
        """
        return 1

    def overview(self, rows: int, cols: int) -> RasterSource | None:
        """A smaller version of this source, at least ``rows`` x ``cols``, when it has one.

        The smallest of a file's overviews still that large, opened the way the file was (the
        caller closes it); None when there is none (by default: a source has no overviews).
        """
        return None

    def gdal_dataset(self) -> AbstractContextManager[Any]:
        """The source as a rasterio dataset, for GDAL's warper (:mod:`geoserve.raster.warp`).

        The one reader that needs a GDAL dataset rather than :meth:`read` (see
        docs/design.md, "Kept on purpose"). A file hands its own dataset, opened through the
        trust rules; an array an in-memory GeoTIFF copy of itself. The dataset is valid until
        the context exits.

        Raises:
            InputError: this kind of source cannot be warped.
        """
        raise InputError(
            f"{self.info.name}: cannot be warped (a {type(self).__name__} has no GDAL dataset)"
        )

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

    ``data_format="auto"`` treats ``bytes`` as a GeoTIFF, a :class:`RasterArray` as itself (an
    ``xarray.DataArray`` of one date as one: :mod:`geoserve.raster.cube`), an
    existing path as a path, an ``http(s)://`` URL as a remote file read in place by range
    requests (GDAL's ``/vsicurl/``; a Cloud-Optimized GeoTIFF reads best), and any other long
    base64-looking string as base64. (The server never passes client strings here unchecked:
    it resolves paths and vets URLs first.)

    Raises:
        RasterReadError: the file is missing or is not a readable raster.
        InputFormatError: the content is a format outside ``formats`` (a VRT, say).
        InputError: bad base64, an unsupported data type, or zero width/height.
    """
    from geoserve.raster.dataset import DatasetSource  # (it builds on this module)

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
    elif isinstance(obj, RasterArray) or is_dataarray(obj):
        from geoserve.raster.arrays import ArraySource  # (it builds on this module)

        source = ArraySource(obj if isinstance(obj, RasterArray) else cube_raster(obj))
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


def _open_text(
    text: str, is_str: bool, data_format: DataFormat, kw: dict[str, Any]
) -> RasterSource:
    """:func:`open_raster` for a string or path: base64, a URL, or a local file."""
    from geoserve.raster.dataset import DatasetSource

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
