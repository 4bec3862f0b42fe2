"""Writing outputs as GeoTIFFs that line up pixel for pixel with the input.

The output profile is the input's profile with CRS, transform, width and height kept verbatim
and count, dtype, nodata, tiling and compression replaced. Files are written to a temporary name
in the target directory and renamed into place, so a failed or interrupted write never leaves a
partial file under the requested name. In-memory outputs go through rasterio's ``MemoryFile``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
import rasterio.shutil
from affine import Affine
from numpy.typing import NDArray
from rasterio.errors import NotGeoreferencedWarning, RasterioError
from rasterio.io import MemoryFile
from rasterio.windows import Window

from geoserve.errors import OutputSpaceError, OutputWriteError
from geoserve.raster import tempfiles
from geoserve.raster.codecs import DEFAULT_CODEC, Codec
from geoserve.raster.input_values import CARRIED_TAGS

#: Internal tile size of written GeoTIFFs (a multiple of 16, as TIFF tiling requires).
BLOCK_SIZE = 256


@dataclass(frozen=True)
class OutputRaster:
    """A finished output: (bands, height, width) data plus what the GeoTIFF should carry."""

    data: NDArray[Any]
    nodata: float | None = None
    descriptions: Sequence[str] = ()
    colormap: Mapping[int, tuple[int, int, int, int]] | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    categories: Sequence[str] = ()
    nbits: int | None = None
    """Bits per stored value when fewer than the dtype's (16: float32 kept as half floats)."""
    nonfinite: int = 0
    """Pixels the model returned NaN or inf for, written as nodata (counted by class maps)."""


def output_profile(
    source_profile: Mapping[str, Any],
    out: OutputRaster,
    height: int | None = None,
    width: int | None = None,
    codec: Codec = DEFAULT_CODEC,
) -> dict[str, Any]:
    """The GeoTIFF profile for ``out``: the source's grid, the output's bands and encoding.

    ``height``/``width`` give the full raster size when ``out`` holds only some of its rows;
    ``codec`` its compression (default: :data:`~geoserve.raster.codecs.DEFAULT_COMPRESSION`).
    """
    count, rows, cols = out.data.shape
    dtype = np.dtype(out.data.dtype)
    profile: dict[str, Any] = {
        "driver": "GTiff",
        "width": width or cols,
        "height": height or rows,
        "count": count,
        "dtype": dtype.name,
        "nodata": out.nodata,
        "tiled": True,
        "blockxsize": BLOCK_SIZE,
        "blockysize": BLOCK_SIZE,
        **codec.gtiff_options(dtype),
        "interleave": "band" if count > 1 else "pixel",
        "BIGTIFF": "IF_SAFER",
    }
    if out.nbits is not None:
        profile["NBITS"] = out.nbits
    if source_profile.get("crs") is not None:
        profile["crs"] = source_profile["crs"]
    transform = source_profile.get("transform")
    if transform is not None and transform != Affine.identity():
        profile["transform"] = transform
    return profile


class RowWriter:
    """Writes one output raster a band of rows at a time, then commits it whole or not at all.

    Rows must arrive top to bottom. They are buffered up to the next multiple of
    :data:`BLOCK_SIZE`, so every compressed tile is written exactly once. Files go to a hidden
    temporary name beside ``path`` and are renamed into place by :meth:`commit`; :meth:`abort`
    (or a failed commit) removes them, so no partial file is ever left under the requested
    name. ``path=None`` writes into a rasterio ``MemoryFile`` and :meth:`commit` returns the
    bytes. ``cog=True`` converts the finished file with GDAL's COG driver (tiles, overviews,
    header first), the layout range readers such as ``/vsicurl/`` fetch windows from.
    ``codec``: how the file (and the COG) is compressed.

    Raises:
        OutputWriteError: naming the path, from the constructor (missing directory),
            :meth:`write` or :meth:`commit`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        source_profile: Mapping[str, Any],
        height: int,
        width: int,
        *,
        cog: bool = False,
        codec: Codec = DEFAULT_CODEC,
    ) -> None:
        self.path = Path(path) if path is not None else None
        self.name = str(self.path) if self.path is not None else IN_MEMORY
        if self.path is not None and not self.path.parent.is_dir():
            raise OutputWriteError(
                f"{self.path}: output directory {self.path.parent} does not exist"
            )
        tempfiles.retry_orphans()
        if self.path is not None:  # a killed earlier run's leftovers for this target
            tempfiles.sweep(self.path.parent, self.path.name, sidecar(self.path).name)
        self._source_profile = source_profile
        self.height, self.width, self.cog, self.codec = height, width, cog, codec
        self._tmp: list[Path] = []
        self._mem: list[MemoryFile] = []
        self._dst: Any = None
        self._meta: OutputRaster | None = None
        self._buffer: list[NDArray[Any]] = []
        self._buffer_row = 0
        self._next_row = 0

    def _open(self, out: OutputRaster) -> None:
        profile = output_profile(self._source_profile, out, self.height, self.width, self.codec)
        with warnings.catch_warnings():  # an ungeoreferenced input was already warned about
            warnings.simplefilter("ignore", NotGeoreferencedWarning)
            if self.path is not None:
                self._dst = rasterio.open(self._new_tmp(), "w", **profile)
            else:
                mem = MemoryFile()
                self._mem.append(mem)
                self._dst = mem.open(**profile)
        for i, desc in enumerate(out.descriptions, start=1):
            self._dst.set_band_description(i, desc)
        if out.colormap is not None:
            self._dst.write_colormap(1, dict(out.colormap))
        carried = self._source_profile.get(CARRIED_TAGS) or {}
        if out.tags or carried:
            self._dst.update_tags(**{**carried, **out.tags})
        self._meta = out

    def _new_tmp(self, target: Path | None = None) -> Path:
        assert self.path is not None
        tmp = tempfiles.new_temporary(target or self.path)
        self._tmp.append(tmp)
        return tmp

    def write(self, row: int, out: OutputRaster) -> None:
        """Write ``out`` (bands, rows, width) as image rows starting at ``row``."""
        if row != self._next_row:
            raise ValueError(f"rows must arrive in order: expected row {self._next_row}, got {row}")
        try:
            if self._dst is None:
                self._open(out)
            self._buffer.append(out.data)
            self._next_row += out.data.shape[1]
            aligned = self._next_row - self._next_row % BLOCK_SIZE
            if self._next_row >= self.height:
                aligned = self.height
            if aligned > self._buffer_row:
                self._flush(aligned)
        except (RasterioError, OSError) as exc:
            self.abort()
            raise write_error(self.name, exc) from exc

    def _flush(self, stop: int) -> None:
        data = self._buffer[0] if len(self._buffer) == 1 else np.concatenate(self._buffer, axis=1)
        n = stop - self._buffer_row
        self._dst.write(data[:, :n], window=Window(0, self._buffer_row, self.width, n))
        rest = data[:, n:]
        self._buffer = [rest] if rest.shape[1] else []
        self._buffer_row = stop

    def commit(self) -> Path | bytes:
        """Finish the raster: the output path, or the encoded bytes for in-memory output.

        Raises:
            OutputWriteError: rows are missing, or the file cannot be finished.
        """
        if self._next_row != self.height or self._dst is None:
            self.abort()
            raise OutputWriteError(
                f"{self.name}: only {self._next_row} of {self.height} rows were written"
            )
        try:
            self._dst.close()
            src_name = self._dst.name
            if self.cog:
                src_name = self._to_cog(src_name)
            if self.path is None:
                mem = self._mem[-1]  # the last file written: the COG when converting
                mem.seek(0)
                return bytes(mem.read())
            verify_geotiff(src_name, self.height, self.width, self._meta)
            aux = None
            if self._meta is not None and self._meta.categories:
                aux = self._new_tmp(sidecar(self.path))
                aux.write_text(_pam_xml(self._meta.categories, self._meta.colormap))
                os.replace(aux, sidecar(self.path))
            try:
                os.replace(src_name, self.path)
            except OSError:
                if aux is not None:  # no sidecar without its file
                    with contextlib.suppress(OSError):
                        sidecar(self.path).unlink(missing_ok=True)
                raise
            return self.path
        except (RasterioError, OSError) as exc:
            raise write_error(self.name, exc) from exc
        finally:
            self._cleanup()

    def _to_cog(self, src_name: str) -> str:
        assert self._meta is not None
        options = {
            **self.codec.cog_options(self._meta.data.dtype),
            "BLOCKSIZE": 512,
            "BIGTIFF": "IF_SAFER",
            # class maps must not be averaged into codes that mean nothing
            "OVERVIEW_RESAMPLING": "AVERAGE" if self._meta.data.dtype.kind == "f" else "NEAREST",
        }
        if self.path is not None:
            dst_name = str(self._new_tmp())
        else:
            mem = MemoryFile()
            self._mem.append(mem)
            dst_name = mem.name
        rasterio.shutil.copy(src_name, dst_name, driver="COG", **options)
        return dst_name

    def abort(self) -> None:
        """Drop everything written so far; nothing is left on disk. Safe to call twice."""
        if self._dst is not None and not self._dst.closed:
            with contextlib.suppress(Exception):
                self._dst.close()
        self._cleanup()

    def _cleanup(self) -> None:
        """Remove temporaries; never raises (one that cannot be removed now is retried)."""
        for tmp in self._tmp:
            tempfiles.release(tmp, remove=True)
        self._tmp.clear()
        for mem in self._mem:
            mem.close()
        self._mem.clear()
        self._buffer.clear()


def write_error(name: str, exc: BaseException) -> OutputWriteError:
    """The error for a failed write, :class:`OutputSpaceError` when the disk is full.

    GDAL reports ENOSPC from inside libtiff only on stderr, and rasterio then raises about the
    unreadable result; so a failed write on a file system that is (nearly) full is reported
    as what it most likely is.
    """
    text = str(exc)
    code = getattr(exc, "errno", None)
    free = free_bytes(Path(name).parent) if name != IN_MEMORY else None
    if code in _NO_SPACE or any(m in text for m in _NO_SPACE_TEXT):
        return OutputSpaceError(f"{name}: no space left for the output ({text})")
    if code in (errno.EROFS, errno.EACCES, errno.EPERM) or any(m in text for m in _NO_WRITE):
        return OutputWriteError(f"{name}: the output directory is not writable ({text})")
    if free is not None and free < LOW_SPACE_BYTES:
        return OutputSpaceError(
            f"{name}: no space left for the output ({free} bytes free on "
            f"{Path(name).parent}; {text})"
        )
    return OutputWriteError(f"{name}: cannot write output ({text})")


def free_bytes(directory: Path) -> int | None:
    """Bytes an unprivileged process may still write under ``directory`` (None: unknown)."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


IN_MEMORY = "<in-memory output>"
#: Below this much free space, a failed write is reported as a full disk.
LOW_SPACE_BYTES = 16 * 1024 * 1024
_NO_SPACE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_NO_WRITE = ("Read-only file system", "Permission denied", "Operation not permitted")
_NO_SPACE_TEXT = ("No space left", "Disk quota exceeded", "File too large", "Free disk space")


def verify_geotiff(
    path: str | os.PathLike[str], height: int, width: int, meta: OutputRaster | None
) -> None:
    """Check a finished GeoTIFF before it is renamed into place.

    GDAL reports some failed block writes (a full disk while flushing its cache, say) only as
    logged errors, so the file is re-opened: its size and band layout must be what was
    written, and every block of every band must lie inside the file.

    Raises:
        OutputWriteError: (or :class:`OutputSpaceError`) naming what is wrong.
    """
    name = os.fspath(path)
    size = os.stat(name).st_size
    if size == 0:
        raise OutputWriteError(f"{name}: the written file is empty")
    with warnings.catch_warnings():  # (opening warns; the input's own warning said it)
        warnings.simplefilter("ignore", NotGeoreferencedWarning)
        ds = rasterio.open(name, driver="GTiff")
    with ds:
        count = meta.data.shape[0] if meta is not None else ds.count
        if (ds.height, ds.width, ds.count) != (height, width, count):
            raise OutputWriteError(
                f"{name}: the written file is {ds.count}x{ds.height}x{ds.width}, "
                f"expected {count}x{height}x{width}"
            )
        bh, bw = ds.block_shapes[0]
        rows, cols = -(-height // bh), -(-width // bw)
        for band in range(1, ds.count + 1):
            for i in range(rows):
                for j in range(cols):
                    offset = ds.get_tag_item(f"BLOCK_OFFSET_{j}_{i}", "TIFF", bidx=band)
                    nbytes = ds.get_tag_item(f"BLOCK_SIZE_{j}_{i}", "TIFF", bidx=band)
                    if not offset or not nbytes or int(offset) + int(nbytes) > size:
                        raise OutputSpaceError(
                            f"{name}: block ({i}, {j}) of band {band} is missing or cut off "
                            f"(file is {size} bytes); the disk may be full"
                        )


def write_geotiff(
    path: str | os.PathLike[str],
    out: OutputRaster,
    source_profile: Mapping[str, Any],
    *,
    cog: bool = False,
    codec: Codec = DEFAULT_CODEC,
) -> Path:
    """Write ``out`` to ``path`` atomically (temporary file in the same directory, then rename).

    Raises:
        OutputWriteError: naming the path, if the directory is missing or the write fails.
    """
    result = _write_whole(path, out, source_profile, cog, codec)
    assert isinstance(result, Path)
    return result


def _write_whole(
    path: str | os.PathLike[str] | None,
    out: OutputRaster,
    source_profile: Mapping[str, Any],
    cog: bool,
    codec: Codec,
) -> Path | bytes:
    _, height, width = out.data.shape
    writer = RowWriter(path, source_profile, height, width, cog=cog, codec=codec)
    writer.write(0, out)
    return writer.commit()


def sidecar(path: Path) -> Path:
    """GDAL's PAM sidecar of ``path`` (``<file>.aux.xml``), where class names are written."""
    return path.with_name(path.name + ".aux.xml")


def _pam_xml(names: Sequence[str], colormap: Mapping[int, tuple[int, int, int, int]] | None) -> str:
    """Class names, and the colours of exactly those classes, as GDAL's PAM sidecar holds them.

    GeoTIFF has no place for category names, and an 8-bit GeoTIFF's colour table always has
    256 entries (QGIS lists every one in its legend: the classes, then black 2 ... 255). GDAL
    (and so QGIS, rasterio, ``gdalinfo``) reads both from the sidecar, whose colour table, one
    entry per class, wins over the file's; the file keeps its own for tools that read it
    alone. The sidecar is written (by way of a temporary, as the file itself) just before the
    file is renamed into place, and removed again if that fails.
    """
    import xml.etree.ElementTree as ET

    dataset = ET.Element("PAMDataset")
    band = ET.SubElement(dataset, "PAMRasterBand", band="1")
    categories = ET.SubElement(band, "CategoryNames")
    for name in names:
        ET.SubElement(categories, "Category").text = name
    if colormap is not None:
        table = ET.SubElement(band, "ColorTable")
        for i in range(len(names)):
            c = colormap.get(i, (0, 0, 0, 255))
            ET.SubElement(table, "Entry", c1=str(c[0]), c2=str(c[1]), c3=str(c[2]), c4=str(c[3]))
    return ET.tostring(dataset, encoding="unicode") + "\n"


def geotiff_bytes(
    out: OutputRaster,
    source_profile: Mapping[str, Any],
    *,
    cog: bool = False,
    codec: Codec = DEFAULT_CODEC,
) -> bytes:
    """Encode ``out`` as GeoTIFF bytes in memory."""
    result = _write_whole(None, out, source_profile, cog, codec)
    assert isinstance(result, bytes)
    return result
