"""The ``patch-embeddings`` output: one row per patch, its core's polygon and pooled embedding.

For similarity search and clustering: each patch the model ran on gives one row with
``row`` and ``col`` (its place in the patch grid), ``embedding`` (the mean of its tokens,
float32, a fixed-size list of D values) and ``geometry``: the patch's *core* (the part of the
image it alone is responsible for, so the rows' polygons tile the input without overlap) as a
WKB polygon in the input's CRS. Patches the engine skipped (all nodata) have no row.

Rows arrive as patches finish; they are written to a GeoParquet 1.1 file (pyarrow) in row
groups as they fill, under a temporary name renamed into place once the row count read back
matches, or into bytes for ``bytes`` / ``base64`` outputs.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
from collections.abc import Mapping
from io import BytesIO
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from rasterio.windows import Window
from rasterio.windows import bounds as window_bounds

from geoserve.errors import ConfigError
from geoserve.raster import tempfiles
from geoserve.raster.sinks import OutputSink
from geoserve.raster.write import IN_MEMORY, OutputRaster, write_error
from geoserve.schemas import ImageOutput, OutFormat

#: Rows per Parquet row group.
ROW_GROUP = 1024


class PatchEmbeddingSink(OutputSink):
    """Collects (patch, pooled embedding) rows into a GeoParquet file; see the module docstring.

    Args:
        path: The ``.parquet`` file, or ``None`` for bytes.
        profile: The input's profile (its CRS and transform place the polygons).
    """

    def __init__(
        self, path: Path | None, profile: Mapping[str, Any], height: int, width: int
    ) -> None:
        super().__init__(height, width)
        if path is not None and path.suffix.lower() not in (".parquet", ".geoparquet"):
            raise ConfigError(f"{path}: patch embeddings are written as .parquet (GeoParquet)")
        self.path = path
        self._profile = profile
        self._tmp = tempfiles.new_temporary(path) if path is not None else None
        self._buffer: BytesIO | None = None if path is not None else BytesIO()
        self._writer: Any = None
        self._rows: list[tuple[int, int, NDArray[np.float32], bytes]] = []
        self._written = 0

    @property
    def target(self) -> Path | None:
        """The GeoParquet file's path (None for bytes)."""
        return self.path

    def _write(self, row: int, out: OutputRaster) -> None:
        raise TypeError("patch embeddings take patches (add_patch), not rows")

    def add_patch(self, row: int, col: int, core: Window, embedding: NDArray[np.float32]) -> None:
        """One patch's row: its grid place, core window (pixels) and pooled embedding (D,)."""
        import shapely

        transform = self._profile.get("transform")
        if transform is not None:
            box = shapely.box(*window_bounds(core, transform))
        else:
            box = shapely.box(
                core.col_off, core.row_off + core.height, core.col_off + core.width, core.row_off
            )
        self._rows.append((row, col, np.asarray(embedding, dtype=np.float32), box.wkb))
        if len(self._rows) >= ROW_GROUP:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self._rows:
            return
        dim = len(self._rows[0][2])
        schema = _schema(dim, self._profile.get("crs"))
        if self._writer is None:
            sink: Any = self._buffer if self._buffer is not None else str(self._tmp)
            self._writer = pq.ParquetWriter(sink, schema, compression="zstd")
        values = np.stack([r[2] for r in self._rows]).reshape(-1)
        embedding = pa.FixedSizeListArray.from_arrays(pa.array(values, pa.float32()), dim)
        table = pa.table(
            [
                pa.array([r[0] for r in self._rows], pa.int32()),
                pa.array([r[1] for r in self._rows], pa.int32()),
                embedding,
                pa.array([r[3] for r in self._rows], pa.binary()),
            ],
            schema=schema,
        )
        self._writer.write_table(table)
        self._written += len(self._rows)
        self._rows.clear()

    def commit(self, out_format: OutFormat) -> ImageOutput:
        """Write the last rows and finish the file (or its bytes)."""
        import pyarrow.parquet as pq

        name = str(self.path) if self.path is not None else IN_MEMORY
        try:
            self._flush()
            if self._writer is None:  # no patch ran (all nodata): an empty file still
                self._writer = pq.ParquetWriter(
                    self._buffer if self._buffer is not None else str(self._tmp),
                    _schema(0, self._profile.get("crs")),
                )
            self._writer.close()
            out = ImageOutput(out_format, self.width, self.height, self._written, "parquet")
            if self.path is None:
                assert self._buffer is not None
                data = self._buffer.getvalue()
                if out_format == "b64":
                    out.b64 = base64.b64encode(data).decode("ascii")
                else:
                    out.data = data
                return out
            assert self._tmp is not None
            found = pq.ParquetFile(self._tmp).metadata.num_rows
            if found != self._written:
                raise OSError(f"{self._written} rows written but {found} read back")
            os.replace(self._tmp, self.path)
            out.path = self.path
            return out
        except (OSError, ValueError, RuntimeError) as exc:
            raise write_error(name, exc) from exc
        finally:
            self.abort()

    def abort(self) -> None:
        """Drop the rows and the temporary file."""
        if self._writer is not None:
            with contextlib.suppress(Exception):  # a writer that failed is dropped anyway
                self._writer.close()
            self._writer = None
        self._rows.clear()
        if self._tmp is not None:
            tempfiles.release(self._tmp, remove=True)


def _schema(dim: int, crs: Any) -> Any:
    import pyarrow as pa

    projjson = crs.to_dict(projjson=True) if crs is not None else None
    geo = {
        "version": "1.1.0",
        "primary_column": "geometry",
        "columns": {
            "geometry": {"encoding": "WKB", "geometry_types": ["Polygon"], "crs": projjson}
        },
    }
    return pa.schema(
        [
            ("row", pa.int32()),
            ("col", pa.int32()),
            ("embedding", pa.list_(pa.float32(), dim)),
            ("geometry", pa.binary()),
        ],
        metadata={"geo": json.dumps(geo)},
    )
