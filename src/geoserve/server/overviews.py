"""Overviews of a stored whole-scene class map, so the map's low zooms read little of it."""

from __future__ import annotations

import contextlib
from pathlib import Path

import rasterio
from rasterio.enums import Resampling
from rasterio.errors import RasterioError

from geoserve.raster.write import write_error

#: Decimation factors tried, each kept while the overview is at least this many pixels a side.
FACTORS = (2, 4, 8, 16, 32, 64)
MIN_SIDE = 64


def add_overviews(path: Path) -> None:
    """Overviews for the low zooms' tiles of the class map at ``path`` (nearest: classes stay).

    Raises:
        OutputWriteError: (:class:`OutputSpaceError` on a full disk) the map is removed.
    """
    try:
        with rasterio.open(path, "r+") as ds:
            factors = [f for f in FACTORS if min(ds.width, ds.height) // f >= MIN_SIDE]
            if factors:
                ds.build_overviews(factors, Resampling.nearest)
    except (RasterioError, OSError) as exc:  # a map with half its overviews is not kept
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
        raise write_error(str(path), exc) from exc
