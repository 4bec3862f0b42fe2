"""What GDAL may do when geoserve opens an input: the library side of the trust boundary.

Every input (a path, bytes, base64, a URL) is untrusted content. GDAL, left to itself, picks a
driver by sniffing the content, and several drivers let a file *name other files*: a VRT
document reads any local path or ``/vsicurl/`` URL it lists, and other formats open sidecars
found by listing the directory. So geoserve never lets GDAL choose:

- inputs are opened with an explicit **driver allow-list** (:data:`DEFAULT_INPUT_FORMATS`:
  ``GTiff`` only, which covers Cloud-Optimized GeoTIFFs); content of any other format is refused
  with :class:`~geoserve.errors.InputFormatError` naming the format it looks like, detected
  here from its first bytes without handing it to GDAL;
- every open runs with ``GDAL_DISABLE_READDIR_ON_OPEN=EMPTY_DIR`` (no directory listing, so no
  sidecar ``.ovr`` / ``.aux.xml`` / ``.msk`` of a neighbouring file is picked up) and with
  Python in VRTs disabled;
- remote reads (``/vsicurl/``) get a connect timeout, a per-request timeout, a low-speed abort,
  no retries and no ``.netrc`` credentials (:data:`GDAL_HTTP_DEFAULTS`, set process-wide unless
  the environment already sets them, so the reader threads see them too).

A GeoTIFF cannot name another file or URL: what an allowed input can make GDAL read is that
input, and nothing else. docs/serving.md ("Security model") lists the whole boundary.

Two GDAL knobs are deliberately not used. ``CPL_VSIL_CURL_ALLOWED_EXTENSIONS`` guards against
chained ``/vsicurl/`` opens, which the allow-list already rules out, and would refuse
legitimate URLs without a ``.tif`` suffix. GDAL (3.10) has no option to stop ``/vsicurl/``
following redirects: the server checks a URL itself, without redirects, before GDAL sees it,
and ``--url-reads download`` keeps GDAL off the network altogether.

This module imports nothing from geoserve but its errors.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import rasterio

from geoserve.errors import ConfigError, InputFormatError

#: Input formats (GDAL driver short names) opened unless a deployment allows more.
DEFAULT_INPUT_FORMATS: tuple[str, ...] = ("GTiff",)

#: GDAL drivers that may be allowed as inputs: raster formats whose files hold their own pixels
#: and cannot name another file or URL. VRT, the ``/vsi`` archive handlers, GDAL's WMS/WCS/
#: tile-server drivers, MBTiles/GPKG (SQLite), netCDF/HDF (external links) are not in it.
ALLOWABLE_INPUT_FORMATS: tuple[str, ...] = ("GTiff", "COG", "JP2OpenJPEG", "PNG", "JPEG")

#: HTTP limits for GDAL's own remote reads (``/vsicurl/``), seconds unless stated.
GDAL_HTTP_DEFAULTS: dict[str, str] = {
    "GDAL_HTTP_CONNECTTIMEOUT": "10",
    "GDAL_HTTP_TIMEOUT": "60",  # one range request, start to end
    "GDAL_HTTP_LOW_SPEED_TIME": "10",  # abort a transfer slower than ...
    "GDAL_HTTP_LOW_SPEED_LIMIT": "1024",  # ... this many bytes/s for that long
    "GDAL_HTTP_MAX_RETRY": "0",
    "GDAL_HTTP_NETRC": "NO",  # never send the host's ~/.netrc credentials anywhere
    "CPL_VSIL_CURL_USE_HEAD": "YES",
}

#: Forced for every open of an input, whatever the environment says.
OPEN_OPTIONS: dict[str, str] = {
    "GDAL_DISABLE_READDIR_ON_OPEN": "EMPTY_DIR",
    "GDAL_VRT_ENABLE_PYTHON": "NO",
}


def apply_http_defaults() -> None:
    """Set :data:`GDAL_HTTP_DEFAULTS` process-wide (an option already in the environment wins).

    GDAL reads a configuration option it was not given from the environment, in every thread.
    """
    for key, value in GDAL_HTTP_DEFAULTS.items():
        os.environ.setdefault(key, value)


def input_env() -> rasterio.Env:
    """The GDAL environment every input is opened in (see the module docstring)."""
    return rasterio.Env(**OPEN_OPTIONS)


def check_formats(formats: Iterable[str]) -> tuple[str, ...]:
    """Validate a configured input-format allow-list.

    Raises:
        ConfigError: empty, or naming a driver that could chain other files.
    """
    out = tuple(dict.fromkeys(str(f).strip() for f in formats if str(f).strip()))
    if not out:
        raise ConfigError("allowed input formats: the list is empty; GTiff is the default")
    bad = [f for f in out if f not in ALLOWABLE_INPUT_FORMATS]
    if bad:
        raise ConfigError(
            f"allowed input formats: {', '.join(bad)} cannot be allowed (a file of that format "
            f"can name other files, or it is not a raster format); choose from "
            f"{', '.join(ALLOWABLE_INPUT_FORMATS)}"
        )
    return out


def gdal_drivers(formats: Iterable[str]) -> list[str]:
    """GDAL driver names to open ``formats`` with (a COG is read by the GTiff driver)."""
    return list(dict.fromkeys("GTiff" if f == "COG" else f for f in formats))


# (magic bytes at offset 0, format name as GDAL calls it, what it is)
_SIGNATURES: tuple[tuple[bytes, str, str], ...] = (
    (b"II*\x00", "GTiff", "TIFF"),
    (b"MM\x00*", "GTiff", "TIFF"),
    (b"II+\x00", "GTiff", "BigTIFF"),
    (b"MM\x00+", "GTiff", "BigTIFF"),
    (b"\x00\x00\x00\x0cjP  \r\n\x87\n", "JP2OpenJPEG", "JPEG 2000"),
    (b"\xff\x4f\xff\x51", "JP2OpenJPEG", "JPEG 2000 codestream"),
    (b"\x89PNG\r\n\x1a\n", "PNG", "PNG"),
    (b"\xff\xd8\xff", "JPEG", "JPEG"),
    (b"\x89HDF\r\n\x1a\n", "HDF5", "HDF5"),
    (b"CDF\x01", "netCDF", "netCDF"),
    (b"CDF\x02", "netCDF", "netCDF"),
    (b"PK\x03\x04", "ZIP", "a ZIP archive"),
    (b"\x1f\x8b", "GZIP", "a gzip stream"),
    (b"SQLite format 3\x00", "SQLite", "an SQLite database (GeoPackage, MBTiles)"),
    (b"GIF8", "GIF", "GIF"),
    (b"BM", "BMP", "BMP"),
)


def detect_format(head: bytes) -> tuple[str, str]:
    """(GDAL format name, description) of content from its first bytes, without GDAL.

    Used only to say *what* was refused; the refusal itself is GDAL's allow-list.
    """
    for magic, name, what in _SIGNATURES:
        if head.startswith(magic):
            return name, what
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")[:4096].lower()
    if text.startswith(b"<") and b"<vrtdataset" in text:
        return "VRT", "a GDAL virtual raster (VRT) document, which can name other files"
    if text.startswith(b"<"):
        return "XML", "the content is an XML document"
    if text.startswith(b"{"):
        return "JSON", "the content is a JSON document"
    return "unknown", "the content is not a recognised format"


#: What :func:`detect_format` says of content that is no raster format at all.
NOT_RASTER = frozenset({"XML", "JSON", "unknown"})


def refuse_other_formats(name: str, head: bytes, formats: Iterable[str]) -> None:
    """Raise if ``head`` (an input's first bytes) is a known format outside ``formats``.

    Raises:
        InputFormatError: naming the input and the format its content is in.
    """
    allowed = set(formats)
    fmt, what = detect_format(head)
    if fmt in NOT_RASTER or fmt in allowed or (fmt == "GTiff" and "COG" in allowed):
        return
    raise InputFormatError(
        f"{name}: the content is {what} (format {fmt}); allowed input formats: {', '.join(formats)}"
    )


def read_head(path: str, size: int = 4096) -> bytes:
    """The first ``size`` bytes of a local file (empty if it cannot be read)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(size)
    except OSError:
        return b""
