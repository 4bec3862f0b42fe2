"""xarray DataArrays as request inputs (the optional ``xarray`` extra).

A ``DataArray`` with dims (band, [time,] y, x), its CRS and transform set the rioxarray way
(a ``spatial_ref`` coordinate: ``da.rio.crs``, ``da.rio.transform()``), numpy- or Dask-backed,
becomes one :class:`~geoserve.raster.input_values.RasterArray` per date: its data the array
itself (a lazy Dask array stays lazy: each read slices and computes only the chunks it needs,
see :mod:`geoserve.raster.arrays`), its band names the ``band`` coordinate's values where they
are text (else the ``long_name`` attribute rioxarray reads from a file's band descriptions),
its nodata ``da.rio.nodata``, its date the ``time`` coordinate's.

Nothing here imports xarray unless the caller already has: an input is a DataArray only if
xarray is in ``sys.modules`` (where else would it come from), and rioxarray is imported only
to read one.
"""

from __future__ import annotations

import datetime as dt
import sys
from typing import Any

import numpy as np

from geoserve.errors import InputError
from geoserve.raster.input_values import CARRIED_TAGS, RasterArray

#: The dims a DataArray input may have besides its spatial ones.
BAND_DIM, TIME_DIM = "band", "time"


def is_dataarray(obj: Any) -> bool:
    """Whether ``obj`` is an ``xarray.DataArray`` (without importing xarray)."""
    xr = sys.modules.get("xarray")
    return xr is not None and isinstance(obj, xr.DataArray)


def expand(obj: Any) -> list[Any]:
    """One request input as its list of inputs.

    A DataArray: one :class:`RasterArray` per date of its ``time`` dim (one, without it);
    anything else: ``[obj]``.
    """
    return cube_rasters(obj) if is_dataarray(obj) else [obj]


def cube_raster(obj: Any) -> RasterArray:
    """A DataArray of one date (no ``time`` dim, or one of length 1) as a :class:`RasterArray`.

    Raises:
        InputError: it has several dates (a list item that is itself a time series).
    """
    rasters = cube_rasters(obj)
    if len(rasters) != 1:
        raise InputError(
            f"{_name(obj)}: {len(rasters)} dates on its time dim inside a list of inputs; give "
            "the DataArray as the request's input itself (its dates are the request's)"
        )
    return rasters[0]


def _rio() -> None:
    """Import rioxarray (it registers ``.rio``), or say which extra to install."""
    try:
        import rioxarray  # noqa: F401
    except ImportError as exc:
        raise InputError(
            "an xarray DataArray input needs rioxarray: pip install 'geoserve[xarray]'"
        ) from exc


def _name(da: Any) -> str:
    return f"DataArray {str(da.name)[:60]!r}" if da.name is not None else "<DataArray>"


def cube_rasters(da: Any) -> list[RasterArray]:
    """A DataArray as one :class:`RasterArray` per date (see the module docstring).

    Raises:
        InputError: naming the DataArray: no spatial dims, dims other than band and time,
            or rioxarray missing.
    """
    _rio()
    name = _name(da)
    try:
        y_dim, x_dim = da.rio.y_dim, da.rio.x_dim
    except Exception as exc:  # (rioxarray's MissingSpatialDimensionError)
        raise InputError(
            f"{name}: no spatial dims (dims {da.dims}); expected (band, [time,] y, x) ({exc})"
        ) from None
    other = [d for d in da.dims if d not in (y_dim, x_dim, BAND_DIM, TIME_DIM)]
    if other:
        raise InputError(
            f"{name}: dims {tuple(da.dims)}; expected (band, [time,] y, x), not {other[0]!r}"
        )
    try:
        crs, transform, nodata = da.rio.crs, da.rio.transform(), da.rio.nodata
    except Exception as exc:  # (coords that are not a regular grid, say)
        raise InputError(f"{name}: cannot read its CRS and transform ({exc})") from None
    profile: dict[str, Any] = {"crs": crs, "transform": transform}
    carried = da.attrs.get(CARRIED_TAGS)
    if isinstance(carried, dict):
        profile[CARRIED_TAGS] = {str(k): str(v) for k, v in carried.items()}
    if nodata is not None:
        profile["nodata"] = float(nodata)
    order = [d for d in (BAND_DIM, y_dim, x_dim) if d in da.dims]
    names = _band_names(da)
    if names is not None:
        profile["descriptions"] = names
    if TIME_DIM not in da.dims:
        when = _date(da.coords[TIME_DIM].values) if TIME_DIM in da.coords else None
        tags = {"ACQUISITION_DATE": when} if when is not None else {}
        data = da.transpose(*order).data
        return [RasterArray(data, {**profile, "tags": tags}, name)]
    rasters = []
    for i, value in enumerate(da[TIME_DIM].values):
        when = _date(value)
        one = da.isel({TIME_DIM: i}).transpose(*order)
        tags = {"ACQUISITION_DATE": when} if when is not None else {}
        label = f"{name}[time={when.isoformat() if when else i}]"
        rasters.append(RasterArray(one.data, {**profile, "tags": tags}, label))
    return rasters


def _band_names(da: Any) -> tuple[str | None, ...] | None:
    """The band coordinate's text values, or rioxarray's ``long_name`` tuple; else None."""
    count = da.sizes.get(BAND_DIM, 1)
    if BAND_DIM in da.coords:
        values = np.atleast_1d(da.coords[BAND_DIM].values)
        if values.dtype.kind in "UO" and all(isinstance(v, str) for v in values):
            return tuple(str(v) for v in values)
    long_name = da.attrs.get("long_name")
    if isinstance(long_name, list | tuple) and len(long_name) == count:
        return tuple(str(v) if v is not None else None for v in long_name)
    if isinstance(long_name, str) and count == 1:
        return (long_name,)
    return None


def _date(value: Any) -> dt.date | None:
    """A ``time`` coordinate's value as a date (numpy datetime64, datetime, cftime)."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if isinstance(value, np.datetime64):
        if np.isnat(value):
            return None
        return dt.date.fromisoformat(np.datetime_as_string(value, unit="D"))
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, dt.date):
        return value
    if hasattr(value, "year") and hasattr(value, "month") and hasattr(value, "day"):
        return dt.date(int(value.year), int(value.month), int(value.day))  # (cftime)
    return None
