"""Reading a STAC search's files for odc-stac, under geoserve's trust rules.

odc-stac decides which file covers which chunk of the cube; :func:`guarded_driver` is the
reader driver it is given, so every file is opened by geoserve, not by odc-stac's own
rasterio reader: through :class:`SearchFiles`, only the hrefs vetted for the search, each
opened once per reading thread by the allowed GDAL drivers (:mod:`geoserve.raster.trust`)
and under the budget of the request that opened the search.
"""

from __future__ import annotations

import math
import threading
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from geoserve.errors import InputError
from geoserve.raster.budget import using

if TYPE_CHECKING:
    from geoserve.raster.source import RasterSource

Opener = Callable[[str], "RasterSource"]


class SearchFiles:
    """The files of one search's cube: each opened once per reading thread, only if vetted.

    Every open runs under the budget of the request that opened the search (its remote
    requests charged, its deadline and cancellation kept: the cube is read in Dask's threads,
    after the request's inputs were opened). The files close when the cube is dropped.
    """

    def __init__(self, name: str, vetted: dict[str, str], opener: Opener, budget: Any) -> None:
        self._name, self._vetted, self._opener, self._budget = name, vetted, opener, budget
        self._open: dict[tuple[int, str], RasterSource] = {}
        self._lock = threading.Lock()

    def open(self, href: str) -> RasterSource:
        """The vetted file ``href``, opened by this thread (once).

        Raises:
            InputError: an href that is not one of the Items' vetted files.
        """
        target = self._vetted.get(href)
        if target is None:
            raise InputError(f"{self._name}: odc-stac asked for a file no Item names")
        key = (threading.get_ident(), href)
        with self._lock:
            found = self._open.get(key)
        if found is not None:
            if self._budget is not None:
                self._budget.check(target)
            return found
        with using(self._budget):
            source = self._opener(target)
        with self._lock:
            self._open[key] = source
        return source

    def __del__(self) -> None:
        for source in self._open.values():
            source.close()


def guarded_driver(opener: Opener) -> Any:
    """An odc-loader reader driver that opens files through geoserve's trust rules.

    Everything but the opening is odc-loader's rasterio driver (its environment handling and
    metadata); each read opens the href with ``opener`` (the allowed GDAL drivers) and warps
    the band onto the chunk's grid with rasterio (:class:`_Reader`).
    """
    from odc.loader import RioDriver

    class GuardedDriver(RioDriver):  # type: ignore[misc]
        def open(self, src: Any, ctx: Any) -> Any:
            """A reader of ``src`` that opens it through ``opener``."""
            return _Reader(src, opener)

    return GuardedDriver()


class _Reader:
    """One file's reads for odc-loader (its ``RasterReader`` protocol)."""

    def __init__(self, src: Any, opener: Opener) -> None:
        self._src, self._opener = src, opener

    def read(
        self, cfg: Any, dst_geobox: Any, *, dst: Any = None, selection: Any = None
    ) -> tuple[tuple[slice, slice], np.ndarray]:
        h, w = dst_geobox.shape.yx
        out = dst if dst is not None else np.empty((h, w), dtype=cfg.dtype or "float32")
        fill = cfg.fill_value if cfg.fill_value is not None else math.nan
        out[...] = fill
        source = self._opener(self._src.uri)  # (open for the cube's life: see SearchFiles)
        with source.gdal_dataset() as ds:
            band = int(self._src.band or 1)
            nodata = ds.nodatavals[band - 1]
            if nodata is None:
                nodata = cfg.src_nodata_override or cfg.src_nodata_fallback
            _warp(ds, band, out, nodata, fill, dst_geobox, cfg.resampling)
        return (slice(0, h), slice(0, w)), out


def _warp(ds: Any, band: int, out: np.ndarray, nodata: Any, fill: float, grid: Any,
          resampling: str) -> None:  # fmt: skip
    """Band ``band`` of ``ds`` warped into ``out`` on ``grid`` (an odc GeoBox)."""
    import rasterio
    from rasterio.enums import Resampling
    from rasterio.errors import NotGeoreferencedWarning
    from rasterio.warp import reproject

    # rasterio warns of its in-memory destination before it gives it the grid; a filter, not
    # catch_warnings (which is not thread-safe, and odc-stac reads in threads)
    warnings.filterwarnings("ignore", _EMPTY_GRID, NotGeoreferencedWarning)
    reproject(
        rasterio.band(ds, band),
        out,
        src_nodata=nodata,
        dst_transform=grid.transform,
        dst_crs=grid.crs.to_wkt(),
        dst_nodata=fill,
        resampling=Resampling[resampling],
    )


#: rasterio's warning of a dataset being made, before its grid is set.
_EMPTY_GRID = "Dataset has no geotransform, gcps, or rpcs"
