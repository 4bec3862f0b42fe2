"""The ``polygons`` output: a request's class map as class regions, in a vector file.

:class:`PolygonSink` takes the class map's rows like any raster sink and streams them into a
temporary GeoTIFF (beside the target, or in memory for bytes and base64 outputs). When the last
row is in, GDAL's polygonizer (``rasterio.features.shapes`` on the file's band, so the map is
read block by block, never loaded whole) traces each region of one class with
**8-connectivity** (pixels touching at a corner belong to the same polygon), in the input's
CRS. A region whose pixels touch only at a corner somewhere has a ring touching itself there,
which is not a valid polygon: it is written as the valid MultiPolygon of its parts (shapely's
``make_valid``), so every row is one 8-connected region and every geometry is valid. Nodata
pixels make no polygon; with ``min_area`` (pixels) smaller regions are dropped (they leave
holes, nothing is merged). Each region becomes one row: ``class_id`` (integer),
``class_name``, and the geometry.

Tracing is bounded: the vertices of the polygons kept are counted as they come, before each is
made valid (``make_valid`` is superlinear in a polygon's vertices: a 256 x 256 checkerboard,
one 8-connected region per class of 160,000 vertices each, took 22 s), and past
:func:`vertex_budget` the request fails with :class:`~geoserve.errors.OutputTooComplexError`.
A request aborted meanwhile (timed out, its client gone) stops at the next polygon: the sink's
``cancelled`` flag, the request's own, is checked before each.

The file format follows the output's name: ``.gpkg`` (GeoPackage 1.2, through pyogrio: the
version GDAL 3.6 and QGIS 3.22 open without a warning), ``.geojson`` / ``.json`` (also through
pyogrio), or ``.parquet`` (GeoParquet 1.1, written with pyarrow in row groups as polygons
come, WKB geometry, the CRS as PROJJSON; GDAL reads it only from 3.8, built with Arrow). Bytes
answers and engine-chosen names take EngineConfig's ``polygon_format`` (GeoPackage by
default). The file is written under a temporary name, checked (its feature count read back)
and renamed into place; a failure leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import tempfile
import threading
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
from rasterio.errors import NotGeoreferencedWarning, RasterioError
from rasterio.features import shapes
from rasterio.io import MemoryFile

from geoserve.errors import (
    ConfigError,
    GeoServeError,
    OutputTooComplexError,
    OutputWriteError,
    RequestAbortedError,
)
from geoserve.raster import tempfiles
from geoserve.raster.sinks import DEFAULT_POLYGON_FORMAT, POLYGON_FORMATS, OutputSink
from geoserve.raster.write import IN_MEMORY, OutputRaster, RowWriter, write_error
from geoserve.schemas import ImageOutput, OutFormat

#: pyogrio's driver for each format it writes.
_DRIVERS = {"geojson": "GeoJSON", "gpkg": "GPKG"}
#: GDAL's creation options for each: GeoPackage 1.2, not the 1.4 of GDAL >= 3.7, which GDAL 3.6
#: (Debian 12, QGIS 3.22) warns about on every open.
_DATASET_OPTIONS: dict[str, dict[str, str]] = {"gpkg": {"VERSION": "1.2"}, "geojson": {}}
#: Polygons per Parquet row group (and per conversion batch).
BATCH = 4096
#: The geometry types written: a region, or a region whose parts touch only at corners.
GEOMETRY_TYPES = ["Polygon", "MultiPolygon"]
#: How regions are traced: pixels touching at an edge or a corner are one region.
CONNECTIVITY = 8
#: Vertices a class map's polygons may always have together, however small the map.
MIN_VERTEX_BUDGET = 50_000
#: Most vertices of one self-touching polygon that is made valid while a bound is on (the
#: repair cannot be interrupted: a checkerboard-like region of 81,545 vertices took 12 s on
#: one core; ordinary regions, with few self-touches, far less).
MAX_REPAIR_VERTICES = 100_000
#: The option that sets the bound, as the command line names it (for messages).
BOUND_OPTION = "--max-polygon-vertices-per-pixel"


def vertex_budget(pixels: int, per_pixel: float | None) -> int | None:
    """Most vertices the polygons of a class map of ``pixels`` may have (None: no bound).

    ``per_pixel`` of them per pixel (EngineConfig's ``max_polygon_vertices_per_pixel``), at
    least :data:`MIN_VERTEX_BUDGET`. The polygons of a Sentinel-2 class map have about 0.05
    vertices per pixel (0.045 measured for ndwi-water on the bundled lake scene, 0.012 for
    demo-water); a 1-pixel checkerboard has 5 (every pixel a square of one region).
    """
    if not per_pixel:
        return None
    return max(MIN_VERTEX_BUDGET, math.ceil(per_pixel * pixels))


def vector_format(path: Path) -> str:
    """The vector format ``path``'s suffix names.

    Raises:
        ConfigError: a suffix of no vector format, naming the path and the accepted ones.
    """
    fmt = POLYGON_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise ConfigError(
            f"{path}: polygons are written as {', '.join(POLYGON_FORMATS)}; name the output "
            "with one of these suffixes"
        )
    return fmt


class PolygonSink(OutputSink):
    """Class map rows in, a vector file of class regions out; see the module docstring.

    Args:
        path: The vector file (``None``: bytes, for ``b64`` / ``bytes`` outputs).
        fmt: Its format (``gpkg``, ``geojson`` or ``parquet``); default: from ``path``'s
            suffix, else GeoPackage.
        class_names: The class name of each class id.
        min_area: Polygons of fewer pixels are dropped.
        max_vertices: Most vertices the polygons kept may have together (None: no bound;
            see :func:`vertex_budget`).
    """

    def __init__(
        self,
        path: Path | None,
        profile: Mapping[str, Any],
        height: int,
        width: int,
        *,
        class_names: Sequence[str],
        fmt: str | None = None,
        min_area: float = 0.0,
        max_vertices: int | None = None,
    ) -> None:
        super().__init__(height, width)
        self.max_vertices = max_vertices
        self.path = path
        self.fmt = fmt or (vector_format(path) if path is not None else DEFAULT_POLYGON_FORMAT)
        self.class_names = tuple(class_names)
        self.min_area = min_area
        self._profile = profile
        self._map_path = tempfiles.new_temporary(path) if path is not None else None
        self._map = RowWriter(self._map_path, profile, height, width)
        self._tmp: list[Path] = []

    @property
    def target(self) -> Path | None:
        """The vector file's path (None for bytes)."""
        return self.path

    def _write(self, row: int, out: OutputRaster) -> None:
        self._map.write(row, dataclasses.replace(out, categories=()))  # (no sidecar for it)

    def commit(self, out_format: OutFormat) -> ImageOutput:
        """Polygonize the finished class map and write the vector file (or its bytes)."""
        name = str(self.path) if self.path is not None else IN_MEMORY
        try:
            finished = self._map.commit()  # the class map: a (temporary) file, or its bytes
            with _opened(finished) as ds:
                if self.path is not None:  # (GDAL warns about a GeoPackage named otherwise)
                    suffix = ".gpkg" if self.fmt == "gpkg" else ""
                    target = tempfiles.new_temporary(self.path, suffix)
                    self._tmp.append(target)
                    n = self._write_vector(ds, target)
                    os.replace(target, self.path)
                    out = self._vector_output(out_format, n)
                    out.path = self.path
                    return out
                with tempfile.TemporaryDirectory(prefix="geoserve-") as tmp:
                    target = Path(tmp) / f"polygons.{self.fmt}"
                    n = self._write_vector(ds, target)
                    data = target.read_bytes()
            out = self._vector_output(out_format, n)
            if out_format == "b64":
                import base64

                out.b64 = base64.b64encode(data).decode("ascii")
            else:
                out.data = data
            return out
        except GeoServeError:  # (too complex, aborted, or a write error already named)
            raise
        except (RasterioError, OSError, ValueError, RuntimeError) as exc:
            raise write_error(name, exc) from exc
        finally:
            self._cleanup()

    def _vector_output(self, out_format: OutFormat, n: int) -> ImageOutput:
        return ImageOutput(out_format, self.width, self.height, n, self.fmt)

    def _write_vector(self, ds: Any, target: Path) -> int:
        """Trace ``ds``'s regions into ``target``; the number of polygons, read back."""
        crs = ds.crs
        where = str(self.path) if self.path is not None else "polygons"
        bound = _Bound(where, self.max_vertices, self.cancelled, self.width, self.height)
        rows = polygon_rows(ds, self.class_names, self.min_area, bound)
        if self.fmt == "parquet":
            written = _write_parquet(target, rows, crs)
            import pyarrow.parquet as pq

            found = pq.ParquetFile(target).metadata.num_rows
        else:
            import pyogrio

            with warnings.catch_warnings():  # (the temporary name's suffix is not .gpkg)
                warnings.filterwarnings("ignore", "The filename extension", RuntimeWarning)
                warnings.filterwarnings("ignore", ".*non conformant file extension", RuntimeWarning)
                written = _write_ogr(target, rows, crs, self.fmt)
                found = pyogrio.read_info(target)["features"]
        if found != written:
            raise OutputWriteError(f"{target}: {written} polygons written but {found} read back")
        return written

    def abort(self) -> None:
        """Remove the class map and any vector file begun."""
        self._map.abort()
        self._cleanup()

    def _cleanup(self) -> None:
        for tmp in [*self._tmp, *([self._map_path] if self._map_path else [])]:
            tempfiles.release(tmp, remove=True)
        self._tmp.clear()


@contextlib.contextmanager
def _opened(finished: Path | bytes) -> Iterator[Any]:
    """The finished class map opened for reading (a file, or bytes in a ``MemoryFile``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NotGeoreferencedWarning)
        if isinstance(finished, Path):
            with rasterio.open(finished) as ds:
                yield ds
        else:
            with MemoryFile(finished) as mem, mem.open() as ds:
                yield ds


@dataclasses.dataclass
class _Bound:
    """What stops tracing: the vertex budget and the request's cancel flag."""

    where: str  # the output, for messages
    max_vertices: int | None = None
    cancelled: threading.Event | None = None
    width: int = 0
    height: int = 0
    vertices: int = 0

    def check(self, polygon_vertices: int = 0) -> None:
        """Raise when the request was aborted, or ``polygon_vertices`` more overflow the budget.

        Raises:
            RequestAbortedError: the request's cancel flag is set.
            OutputTooComplexError: naming the count, the bound and the options.
        """
        if self.cancelled is not None and self.cancelled.is_set():
            raise RequestAbortedError(f"{self.where}: the request was aborted; tracing stopped")
        self.vertices += polygon_vertices
        if self.max_vertices is not None and self.vertices > self.max_vertices:
            pixels = self.width * self.height
            raise OutputTooComplexError(
                f"{self.where}: polygons output too complex: {self.vertices:,} vertices "
                f"traced so far, over the bound of {self.max_vertices:,} for a "
                f"{self.width}x{self.height} class map ({self.max_vertices / max(pixels, 1):.2g}"
                f" per pixel; {BOUND_OPTION}, at least {MIN_VERTEX_BUDGET:,}); the class map "
                "is too fragmented to trace (a checkerboard-like map): drop small regions "
                "with --min-area, or raise the bound"
            )

    def check_repair(self, polygon_vertices: int) -> None:
        """Refuse to make valid one polygon too large to repair in bounded time.

        ``make_valid`` cannot be interrupted and is superlinear in a fragmented region's
        vertices, so with a bound on, one invalid polygon of more than
        :data:`MAX_REPAIR_VERTICES` fails the request instead.

        Raises:
            OutputTooComplexError: naming the polygon's size, the limit and the option.
        """
        if self.max_vertices is not None and polygon_vertices > MAX_REPAIR_VERTICES:
            raise OutputTooComplexError(
                f"{self.where}: polygons output too complex: one region of "
                f"{polygon_vertices:,} vertices needs repair (it touches itself), over the "
                f"{MAX_REPAIR_VERTICES:,} that can be repaired in bounded time; drop small "
                f"regions with --min-area, or lift every polygon bound with {BOUND_OPTION} 0"
            )


def polygon_rows(
    ds: Any, class_names: Sequence[str], min_area: float = 0.0, bound: _Bound | None = None
) -> Iterator[tuple[list[int], list[str], list[bytes]]]:
    """``ds``'s band 1 (a class map) traced into batches of (class ids, names, WKB polygons).

    Nodata pixels make no polygon; polygons under ``min_area`` pixels are dropped. ``bound``
    is checked before each polygon kept is made valid (see the module docstring).
    """
    import shapely
    import shapely.geometry

    nodata = ds.nodata
    t = ds.transform
    pixel_area = abs(t.a * t.e - t.b * t.d) or 1.0
    ids: list[int] = []
    names: list[str] = []
    wkbs: list[bytes] = []
    bound = bound or _Bound(ds.name)
    for geom, value in shapes(rasterio.band(ds, 1), connectivity=CONNECTIVITY, transform=t):
        bound.check()
        if nodata is not None and value == nodata:
            continue
        polygon = shapely.geometry.shape(geom)
        # (its area is its rings' whether or not they touch: no need to make it valid first)
        if min_area and polygon.area / pixel_area < min_area:
            continue
        vertices = shapely.get_num_coordinates(polygon)
        bound.check(vertices)
        if not polygon.is_valid:  # a ring touching itself at a corner: its parts
            bound.check_repair(vertices)
            polygon = shapely.make_valid(polygon, method="structure")
        cid = int(value)
        ids.append(cid)
        names.append(class_names[cid] if 0 <= cid < len(class_names) else f"class_{cid}")
        wkbs.append(polygon.wkb)
        if len(ids) >= BATCH:
            yield ids, names, wkbs
            ids, names, wkbs = [], [], []
    if ids:
        yield ids, names, wkbs


def geo_metadata(crs: Any) -> dict[str, Any]:
    """GeoParquet 1.1 file metadata for a WKB ``geometry`` column of (multi)polygons in ``crs``.

    No CRS (an ungeoreferenced input) is written as ``null``, "undefined", not left out
    (which would mean longitude/latitude).
    """
    projjson = crs.to_dict(projjson=True) if crs is not None else None
    return {
        "version": "1.1.0",
        "primary_column": "geometry",
        "columns": {
            "geometry": {"encoding": "WKB", "geometry_types": GEOMETRY_TYPES, "crs": projjson}
        },
    }


def _write_parquet(
    target: Path, rows: Iterator[tuple[list[int], list[str], list[bytes]]], crs: Any
) -> int:
    """GeoParquet, one row group per batch as polygons come."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema(
        [("class_id", pa.int32()), ("class_name", pa.string()), ("geometry", pa.binary())],
        metadata={"geo": json.dumps(geo_metadata(crs))},
    )
    n = 0
    with pq.ParquetWriter(target, schema, compression="zstd") as writer:
        for ids, names, wkbs in rows:
            writer.write_table(pa.table([ids, names, wkbs], schema=schema))
            n += len(ids)
    return n


def _write_ogr(
    target: Path,
    rows: Iterator[tuple[list[int], list[str], list[bytes]]],
    crs: Any,
    fmt: str,
) -> int:
    """GeoJSON or GeoPackage through pyogrio, appended batch by batch."""
    import pyogrio.raw

    n = 0
    wkt = crs.to_wkt() if crs is not None else None
    driver, options = _DRIVERS[fmt], _DATASET_OPTIONS[fmt]
    for ids, names, wkbs in rows:
        pyogrio.raw.write(
            str(target),
            geometry=np.array(wkbs, dtype=object),
            field_data=[np.array(ids, dtype=np.int32), np.array(names, dtype=object)],
            fields=["class_id", "class_name"],
            crs=wkt,
            geometry_type="Unknown",
            driver=driver,
            append=n > 0,
            layer="polygons",
            dataset_options=options if n == 0 else None,
        )
        n += len(ids)
    if n == 0:  # no polygon at all: still a valid, empty file
        pyogrio.raw.write(
            str(target),
            geometry=np.array([], dtype=object),
            field_data=[np.array([], dtype=np.int32), np.array([], dtype=object)],
            fields=["class_id", "class_name"],
            crs=wkt,
            geometry_type="Unknown",
            driver=driver,
            layer="polygons",
            dataset_options=options,
        )
    return n
