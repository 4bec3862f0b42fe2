"""What a STAC Item says of one output file: its grid, bands, format, size, checksum, footprint.

:func:`read_product` opens one finished output of a request (:class:`~geoserve.schemas.ImageOutput`:
a file, or the bytes or base64 of an answer) and returns a :class:`Product`: for a GeoTIFF its
grid (CRS, transform, size), its bands' data type and nodata value and whether it is a
Cloud-Optimized GeoTIFF; for a vector file (GeoPackage, GeoJSON, GeoParquet) its CRS, and its
features' extent only when asked (it is read feature by feature). :func:`footprint` turns a grid
or an extent into a GeoJSON polygon and a bounding box in longitude and latitude (WGS84), the
edges densified so that a curved edge in WGS84 is followed; an output without a CRS has none.

Nothing here is the engine's: :mod:`geoserve.stac_result` builds the Item from these.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
import shapely
from affine import Affine
from rasterio.crs import CRS
from rasterio.errors import CRSError, RasterioError
from rasterio.io import MemoryFile
from rasterio.warp import transform_bounds, transform_geom

from geoserve.errors import OutputWriteError
from geoserve.schemas import VECTOR_KINDS, ImageOutput

#: Media types of the files a request writes.
GEOTIFF = "image/tiff; application=geotiff"
COG = "image/tiff; application=geotiff; profile=cloud-optimized"
VECTOR_MEDIA_TYPES = {
    "parquet": "application/vnd.apache.parquet",
    "geojson": "application/geo+json",
    "gpkg": "application/geopackage+sqlite3",
}
#: Points added along each edge of a footprint before it is transformed to WGS84.
DENSIFY = 21
#: How far (degrees: about 1 cm) a footprint's transformed outline may be simplified.
SIMPLIFY_DEGREES = 1e-7
WGS84 = CRS.from_epsg(4326)


@dataclass(frozen=True)
class Grid:
    """A raster's grid: its CRS (None: not georeferenced), transform and size."""

    crs: CRS | None
    transform: Affine
    width: int
    height: int

    def ring(self) -> list[tuple[float, float]]:
        """The grid's outline in its CRS, counter-clockwise, each edge densified."""
        w, h = self.width, self.height
        corners = [(0.0, 0.0), (0.0, h), (w, h), (w, 0.0)]  # (col, row); north up: CCW
        ring: list[tuple[float, float]] = []
        for (c0, r0), (c1, r1) in zip(corners, [*corners[1:], corners[0]], strict=True):
            for t in np.linspace(0.0, 1.0, DENSIFY + 2)[:-1]:
                ring.append(self.transform @ (c0 + t * (c1 - c0), r0 + t * (r1 - r0)))
        return [*ring, ring[0]]

    @property
    def bounds(self) -> tuple[float, float, float, float]:
        """(left, bottom, right, top) of the grid in its CRS."""
        xs, ys = zip(
            *(
                self.transform @ c
                for c in ((0, 0), (0, self.height), (self.width, self.height), (self.width, 0))
            ),
            strict=True,
        )
        return min(xs), min(ys), max(xs), max(ys)


@dataclass(frozen=True)
class Band:
    """One raster band: its data type (numpy's name) and nodata value (None: none declared)."""

    data_type: str
    nodata: float | None


@dataclass(frozen=True)
class Product:
    """One output of a request, as read back for its STAC Item.

    ``grid`` and ``bands`` for a raster; ``crs`` for every output (a raster's is its grid's);
    ``extent``: a vector file's features' (left, bottom, right, top), when asked for and it has
    any. ``size`` (bytes) and ``sha256`` (hex) of the file or the answer's bytes.
    """

    kind: str
    output: ImageOutput
    media_type: str
    size: int
    sha256: str | None
    crs: CRS | None
    grid: Grid | None = None
    bands: tuple[Band, ...] = ()
    extent: tuple[float, float, float, float] | None = None
    sources: tuple[str, ...] = ()
    """The STAC Items a raster was made from (a STAC search's: its ``STAC_ITEM_HREFS`` tag)."""

    @property
    def is_raster(self) -> bool:
        """A GeoTIFF (not a vector file)."""
        return self.grid is not None


def read_product(
    kind: str, output: ImageOutput, *, checksum: bool = True, extent: bool = False
) -> Product:
    """``output`` (of output kind ``kind``) read back: see :class:`Product`.

    ``extent``: also read a vector file's features' extent (every feature is read once).

    Raises:
        OutputWriteError: the output is a tensor, or its file cannot be read (naming it).
    """
    where = str(output.path) if output.path is not None else f"the {kind!r} output"
    data = _payload(output)
    source: Path | bytes = data if data is not None else Path(str(output.path))
    try:
        if data is None:  # a file
            assert output.path is not None
            size = output.path.stat().st_size
            digest = sha256_of(output.path) if checksum else None
        else:
            size, digest = len(data), hashlib.sha256(data).hexdigest() if checksum else None
        if kind in VECTOR_KINDS:
            fmt = output.dtype  # (a vector output's dtype is its format)
            crs, box = _read_vector(source, fmt, extent)
            media = VECTOR_MEDIA_TYPES.get(fmt, "application/octet-stream")
            return Product(kind, output, media, size, digest, crs, extent=box)
        with _opened_raster(source) as ds:
            grid = Grid(ds.crs, ds.transform, ds.width, ds.height)
            bands = tuple(Band(t, ds.nodata) for t in ds.dtypes)
            cog = ds.tags(ns="IMAGE_STRUCTURE").get("LAYOUT") == "COG"
            hrefs = ds.tags().get("STAC_ITEM_HREFS", "")
    except (OSError, RasterioError, ValueError) as exc:
        raise OutputWriteError(f"{where}: cannot be read back for its STAC Item ({exc})") from None
    sources = tuple(h for h in hrefs.split(",") if h.startswith(("http://", "https://")))
    media = COG if cog else GEOTIFF
    return Product(kind, output, media, size, digest, grid.crs, grid, bands, sources=sources)


def footprint(
    crs: CRS | None, outline: list[tuple[float, float]], bounds: tuple[float, float, float, float]
) -> tuple[dict[str, Any] | None, list[float] | None]:
    """A GeoJSON polygon and a bounding box in WGS84 of ``outline`` / ``bounds`` in ``crs``.

    (None, None) when there is no CRS, or it cannot be transformed to WGS84 (a local
    engineering CRS): the Item then has no geometry, as STAC allows.
    """
    if crs is None:
        return None, None
    try:
        box = transform_bounds(crs, WGS84, *bounds, densify_pts=DENSIFY)
        geometry = transform_geom(crs, WGS84, {"type": "Polygon", "coordinates": [outline]})
    except (CRSError, RasterioError, ValueError):
        return None, None
    if not all(math.isfinite(v) for v in box):
        return None, None
    shape = shapely.geometry.shape(geometry)
    # points that a straight line through their neighbours passes within 1 cm of dropped (a
    # UTM grid's edges are nearly straight in WGS84 over a scene), exterior rings CCW
    shape = shapely.orient_polygons(shapely.simplify(shape, SIMPLIFY_DEGREES))
    return json.loads(shapely.to_geojson(shape)), [float(v) for v in box]


def rectangle(bounds: tuple[float, float, float, float]) -> list[tuple[float, float]]:
    """The outline of an extent (left, bottom, right, top), counter-clockwise, densified."""
    left, bottom, right, top = bounds
    grid = Grid(None, Affine(right - left, 0, left, 0, bottom - top, top), 1, 1)
    return grid.ring()


def multihash(sha256: str) -> str:
    """``sha256`` (hex) as a multihash, the form of the file extension's ``file:checksum``."""
    return "1220" + sha256  # sha2-256 (0x12), 32 bytes (0x20)


def _payload(output: ImageOutput) -> bytes | None:
    """The bytes of a bytes or base64 output; None for a file."""
    if output.data is not None:
        return output.data
    if output.b64 is not None:
        return base64.b64decode(output.b64)
    if output.path is not None:
        return None
    raise OutputWriteError(
        f"the {output.kind or 'request'!s} output is a {output.out_format}: a STAC Item "
        "describes files (out_format path, bytes or b64)"
    )


def sha256_of(path: Path) -> str:
    """The sha256 (hex) of a file's content, read a megabyte at a time."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def _opened_raster(source: Path | bytes) -> Iterator[Any]:
    """A GeoTIFF output opened (a file, or the bytes of an answer), GTiff only."""
    if isinstance(source, Path):
        with rasterio.open(source, driver="GTiff") as ds:
            yield ds
        return
    with MemoryFile(source) as mem, mem.open(driver="GTiff") as ds:
        yield ds


def _read_vector(
    source: Path | bytes, fmt: str, extent: bool
) -> tuple[CRS | None, tuple[float, float, float, float] | None]:
    """A vector output's CRS and, with ``extent``, its features' extent (None: no features)."""
    if fmt == "parquet":
        return _read_parquet(source, extent)
    import pyogrio

    src = source if isinstance(source, Path) else io.BytesIO(source)
    info = pyogrio.read_info(src, force_total_bounds=extent)
    crs = CRS.from_user_input(info["crs"]) if info.get("crs") else None
    if not (extent and info.get("features")):
        return crs, None
    left, bottom, right, top = (float(v) for v in info["total_bounds"])
    box = (left, bottom, right, top)
    return crs, box if all(math.isfinite(v) for v in box) else None


def _read_parquet(
    source: Path | bytes, extent: bool
) -> tuple[CRS | None, tuple[float, float, float, float] | None]:
    """A GeoParquet file's CRS (its ``geo`` metadata) and its geometries' extent."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    file = pq.ParquetFile(source if isinstance(source, Path) else pa.BufferReader(source))
    geo = json.loads((file.schema_arrow.metadata or {}).get(b"geo", b"{}"))
    column = geo.get("primary_column", "geometry")
    projjson = geo.get("columns", {}).get(column, {}).get("crs")
    crs = CRS.from_user_input(json.dumps(projjson)) if projjson else None
    if not extent:
        return crs, None
    lo, hi = np.full(2, np.inf), np.full(2, -np.inf)
    for i in range(file.num_row_groups):  # one row group at a time: memory stays bounded
        wkb = file.read_row_group(i, columns=[column]).column(column).to_pylist()
        b = shapely.bounds(shapely.from_wkb(wkb))
        if len(b):
            lo = np.fmin(lo, np.nanmin(b[:, :2], axis=0))
            hi = np.fmax(hi, np.nanmax(b[:, 2:], axis=0))
    if not np.isfinite([*lo, *hi]).all():
        return crs, None
    return crs, (float(lo[0]), float(lo[1]), float(hi[0]), float(hi[1]))
