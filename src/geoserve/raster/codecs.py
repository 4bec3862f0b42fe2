"""How written GeoTIFFs are compressed: the codec, its level, the predictor, GDAL's threads.

:class:`Codec` turns EngineConfig's ``output_compression`` / ``output_compression_level`` into
GDAL creation options, for the GTiff driver (:meth:`Codec.gtiff_options`, every output) and for
the COG driver (:meth:`Codec.cog_options`, ``cog=True``). Every codec here is lossless: what a
reader decodes is the output's values bit for bit, whichever is chosen; only the file's size
and the time to write it change.

The default, :data:`DEFAULT_COMPRESSION`, was chosen from ``python -m bench.writer`` (figures
and the readers checked in docs/performance.md, "Writer"): ZSTD at level 1 writes a class map
several times faster than DEFLATE at level 6, within a few percent of its size, and a float
output about as fast as DEFLATE level 1 and smaller. Every GDAL from 2.3 built with libzstd
reads it (Debian 12's GDAL 3.6 and QGIS 3.22, rasterio's wheels); ``deflate`` is there for a
reader that does not (an old or minimal libtiff).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

#: The codecs an output may be written with (EngineConfig's ``output_compression``).
Compression = Literal["zstd", "deflate", "lzw", "packbits", "none"]
#: The default codec (module docstring).
DEFAULT_COMPRESSION: Compression = "zstd"
#: The levels each codec takes (none: it has no level).
LEVELS: dict[str, tuple[int, int] | None] = {
    "zstd": (1, 22),
    "deflate": (1, 12),
    "lzw": None,
    "packbits": None,
    "none": None,
}
#: Each codec's level when none is given, for integer outputs (class maps) and float ones.
#: DEFLATE keeps what geoserve always wrote (6 for integers; 1 for floats, 2.4x faster than 6
#: at 2 % more bytes); ZSTD's 1 is its fastest (bench.writer).
DEFAULT_LEVELS: dict[str, tuple[int, int]] = {"zstd": (1, 1), "deflate": (6, 1)}
#: GDAL's creation option naming each codec's level.
_LEVEL_OPTION = {"zstd": "ZSTD_LEVEL", "deflate": "ZLEVEL"}

#: Threads GDAL may use to compress tiles while writing.
WRITE_THREADS = max(1, min(4, os.cpu_count() or 1))


def check_level(compression: str, level: int | None) -> None:
    """Refuse a level the codec does not take.

    Raises:
        ValueError: naming the codec and the levels it takes (pydantic reports it as the
            field's error).
    """
    if level is None:
        return
    bounds = LEVELS[compression]
    if bounds is None:
        raise ValueError(f"{compression} has no compression level; leave the level unset")
    low, high = bounds
    if not low <= level <= high:
        raise ValueError(f"{compression} takes levels {low} to {high}, not {level}")


@dataclass(frozen=True)
class Codec:
    """One output's compression.

    Args:
        compression: The codec (:data:`Compression`).
        level: Its level (None: :data:`DEFAULT_LEVELS` by dtype).
        predictor: Difference neighbouring values before compressing (None: as
            :meth:`predictor_for` says; True: always; False: never). Ignored by ``packbits``
            and ``none``.
        threads: GDAL's compression threads.
    """

    compression: Compression = DEFAULT_COMPRESSION
    level: int | None = None
    predictor: bool | None = None
    threads: int = WRITE_THREADS

    def __post_init__(self) -> None:
        if self.compression not in LEVELS:
            raise ValueError(f"unknown compression {self.compression!r}; choose one of {LEVELS}")
        check_level(self.compression, self.level)

    def level_for(self, dtype: np.dtype[Any]) -> int | None:
        """The level written for outputs of ``dtype`` (None: the codec has none)."""
        if self.level is not None:
            return self.level
        defaults = DEFAULT_LEVELS.get(self.compression)
        if defaults is None:
            return None
        return defaults[1] if dtype.kind == "f" else defaults[0]

    def predictor_for(self, dtype: np.dtype[Any]) -> int:
        """TIFF's predictor code for ``dtype``: 1 none, 2 horizontal, 3 floating point.

        By default floats get the floating-point predictor, and integers (class maps) the
        horizontal one only with ``deflate`` (as geoserve always wrote them): differencing
        class codes makes a class map larger and slower with every other codec (bench.writer).
        """
        if self.compression in ("packbits", "none") or self.predictor is False:
            return 1
        if dtype.kind == "f":
            return 3
        return 2 if self.predictor or self.compression == "deflate" else 1

    def gtiff_options(self, dtype: np.dtype[Any]) -> dict[str, Any]:
        """The GTiff driver's creation options for outputs of ``dtype``."""
        options: dict[str, Any] = {"compress": self.compression, "NUM_THREADS": self.threads}
        predictor = self.predictor_for(dtype)
        if predictor != 1:
            options["predictor"] = predictor
        level = self.level_for(dtype)
        if level is not None:
            options[_LEVEL_OPTION[self.compression]] = level
        return options

    def cog_options(self, dtype: np.dtype[Any]) -> dict[str, Any]:
        """The COG driver's creation options (compression part) for outputs of ``dtype``."""
        options: dict[str, Any] = {
            "COMPRESS": self.compression.upper(),
            "NUM_THREADS": self.threads,
        }
        predictor = self.predictor_for(dtype)
        if predictor != 1:
            options["PREDICTOR"] = "FLOATING_POINT" if predictor == 3 else "STANDARD"
        level = self.level_for(dtype)
        if level is not None:
            options["LEVEL"] = level
        return options


#: What every output is written with unless EngineConfig says otherwise.
DEFAULT_CODEC = Codec()
