"""In-memory inputs: a :class:`~geoserve.raster.source.RasterArray` read as a raster source."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from affine import Affine
from numpy.typing import NDArray

from geoserve.errors import InputError
from geoserve.raster.source import (
    RasterArray,
    RasterInfo,
    RasterSource,
    check_dtype,
    check_size,
    warn_if_not_georeferenced,
)


class ArraySource(RasterSource):
    """A source backed by a :class:`RasterArray`."""

    def __init__(self, raster: RasterArray) -> None:
        data = np.asarray(raster.data)
        if data.ndim == 2:
            data = data[np.newaxis]
        if data.ndim != 3:
            raise InputError(
                f"{raster.name}: array must be (bands, height, width), got shape {data.shape}"
            )
        check_dtype(raster.name, str(data.dtype))
        prof = dict(raster.profile)
        count, height, width = data.shape
        descriptions = tuple(prof.pop("descriptions", None) or (None,) * count)
        if len(descriptions) != count:
            raise InputError(
                f"{raster.name}: {len(descriptions)} band descriptions for {count} bands"
            )
        self._data = data
        self.info = RasterInfo(
            name=raster.name,
            width=width,
            height=height,
            count=count,
            dtype=str(data.dtype),
            crs=prof.get("crs"),
            transform=prof.get("transform") or Affine.identity(),
            nodata=prof.get("nodata"),
            descriptions=descriptions,
            tags=dict(prof.pop("tags", {}) or {}),
            profile={**prof, "count": count, "height": height, "width": width},
        )
        check_size(self.info)
        warn_if_not_georeferenced(self.info)

    @property
    def array(self) -> NDArray[Any]:
        """The (bands, height, width) array."""
        return self._data

    def read_rows(self, row_start: int, row_stop: int, bands: Sequence[int]) -> NDArray[Any]:
        """See :meth:`RasterSource.read_rows`."""
        return self._data[list(bands), row_start:row_stop, :]
