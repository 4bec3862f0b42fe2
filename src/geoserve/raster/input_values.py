"""The input values :func:`~geoserve.raster.source.open_raster` takes beside paths and bytes.

An in-memory or lazy raster (:class:`RasterArray`), upload bytes with the name they are reported by
(:class:`NamedBytes`), and a window of a file read as a whole raster (:class:`RasterWindow`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from numpy.typing import NDArray
from rasterio.windows import Window


class SliceableArray(Protocol):
    """What :class:`RasterArray` needs of its data.

    numpy's ``shape``, ``dtype``, ``ndim`` and slicing by integers and slices (a numpy array,
    ``np.memmap``, a Dask, Zarr or h5py array).
    """

    @property
    def shape(self) -> tuple[int, ...]:
        """The array's shape."""

    @property
    def dtype(self) -> Any:
        """Its element type (one numpy knows)."""

    @property
    def ndim(self) -> int:
        """Its number of axes."""

    def __getitem__(self, key: Any) -> Any:
        """A slice of it, which ``np.asarray`` turns into numpy."""


#: The profile key (and DataArray attribute) of the tags an input's outputs carry.
CARRIED_TAGS = "geoserve_carried_tags"


@dataclass(frozen=True)
class RasterArray:
    """An in-memory or lazy raster: ``data`` (bands, height, width), ``profile`` as rasterio's.

    A (height, width) ``data`` is one band. ``data`` is a numpy array or any array-like
    (:class:`SliceableArray`: ``np.memmap``, Dask, Zarr, h5py); it is never loaded whole: each
    read converts only the slice it needs. The profile may hold ``crs``, ``transform``,
    ``nodata``, ``descriptions`` (band names) and ``tags`` (a dict of metadata, such as
    ``{"ACQUISITION_DATE": "2020-06-01"}``); missing keys
    mean "not georeferenced" / "no nodata" / "unnamed bands" / "no tags". Under
    :data:`CARRIED_TAGS`, tags every GeoTIFF output of the request carries (where the input
    came from: a STAC search's Items).
    """

    data: NDArray[Any] | SliceableArray
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
