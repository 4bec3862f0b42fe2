"""Per-request coordinates for models that take them (Prithvi's temporal and location encoders).

Location is the raster's centre as (lon, lat) in degrees, the same convention as the reference
Prithvi inference scripts. The acquisition date is the one given with the input if there is
one, else a date tag the file carries, else a ``YYYYMMDDTHHMMSS`` or ``YYYYDDDTHHMMSS`` stamp in
the file name (the HLS and Sentinel-2 naming conventions; see :mod:`geoserve.raster.dates`), and
reaches the model as (year, day of year).
"""

from __future__ import annotations

import datetime as dt
import re

from rasterio.warp import transform as warp_transform

from geoserve.errors import InputError
from geoserve.raster.dates import name_date
from geoserve.raster.source import RasterInfo

#: Tags (case-insensitive) read for an input's date, in this order; the first holding a
#: ``YYYY-MM-DD`` / ``YYYY:MM:DD`` / ``YYYYMMDD`` date wins.
DATE_TAGS = (
    "ACQUISITION_DATE",
    "DATE_ACQUIRED",
    "SENSING_TIME",
    "SENSING_DATE",
    "DATETIME",
    "TIFFTAG_DATETIME",
)
_TAG_DATE = re.compile(r"(\d{4})[-:]?(\d{2})[-:]?(\d{2})")


def centre_lonlat(info: RasterInfo) -> tuple[float, float]:
    """The raster's centre as (longitude, latitude) in degrees.

    Raises:
        InputError: if the raster is not georeferenced.
    """
    if not info.is_georeferenced:
        raise InputError(f"{info.name}: not georeferenced, so it has no location for the model")
    x, y = info.transform @ (info.width / 2, info.height / 2)
    lons, lats = warp_transform(info.crs, "EPSG:4326", [x], [y])
    return float(lons[0]), float(lats[0])


def acquisition_date(info: RasterInfo) -> dt.date:
    """The date given with the input, else the one in its tags, else in its file name.

    Raises:
        InputError: if none of them carries a date.
    """
    if info.date is not None:
        return info.date
    tags = {str(k).upper(): v for k, v in info.tags.items()}
    for key in DATE_TAGS:
        value = tags.get(key, "")
        if isinstance(value, dt.datetime):  # a RasterArray's tags may hold dates themselves
            return value.date()
        if isinstance(value, dt.date):
            return value
        match = _TAG_DATE.search(str(value))
        if match:
            try:
                return dt.date(*map(int, match.groups()))
            except ValueError:
                continue
    date = name_date(info.name)
    if date is not None:
        return date
    raise InputError(
        f"{info.name}: no acquisition date found (looked for tags {', '.join(DATE_TAGS)} "
        "and a YYYYMMDDTHHMMSS stamp in the file name); give it with dates= in Python, "
        "--dates on the CLI or a 'dates' field over HTTP"
    )


def year_doy(date: dt.date) -> tuple[int, int]:
    """(year, day of year), the temporal encoding Prithvi models take."""
    return date.year, date.timetuple().tm_yday
