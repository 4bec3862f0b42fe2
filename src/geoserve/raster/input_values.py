"""The input values :func:`~geoserve.raster.source.open_raster` takes beside paths and bytes.

An in-memory raster (:class:`RasterArray`), upload bytes with the name they are reported by
(:class:`NamedBytes`), and a window of a file read as a whole raster (:class:`RasterWindow`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from numpy.typing import NDArray
from rasterio.windows import Window


@dataclass(frozen=True)
class RasterArray:
    """An in-memory raster: ``data`` is (bands, height, width); ``profile`` as rasterio's.

    The profile may hold ``crs``, ``transform``, ``nodata``, ``descriptions`` (band names) and
    ``tags`` (a dict of metadata, such as ``{"ACQUISITION_DATE": "2020-06-01"}``); missing keys
    mean "not georeferenced" / "no nodata" / "unnamed bands" / "no tags".
    """

    data: NDArray[Any]
    profile: Mapping[str, Any] = field(default_factory=dict)
    name: str = "<array>"


@dataclass(frozen=True)
class NamedBytes:
    """Raster file bytes with the name to report them by (an upload's part file name).

    The name is the client's text: it appears in messages (last path component, printable
    characters, at most 100) and its date stamp is read like a file name's, after the file's
    own date tags; it is never used as a path.
    """

    data: bytes
    name: str

    @property
    def shown(self) -> str:
        """How messages name it: ``upload 'scene.tif'``."""
        base = re.split(r"[/\\]", self.name)[-1]
        return f"upload {''.join(c for c in base if c.isprintable())[:100]!r}"


@dataclass(frozen=True)
class RasterWindow:
    """A window of a file (or ``/vsicurl/`` URL) read as if it were the whole raster.

    Only the window's rows of the bands a request uses are read, as they are needed (a map
    tile's cut-out of a scene). ``path`` must already have passed the caller's trust checks.
    """

    path: str
    window: Window
    name: str
