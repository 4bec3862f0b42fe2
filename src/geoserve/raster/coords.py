"""Per-request coordinates for models that take them (Prithvi's temporal and location encoders).

Location is the raster's centre as (lon, lat) in degrees, the same convention as the reference
Prithvi inference scripts. The acquisition date comes from a date tag if the file carries one,
else from a ``YYYYMMDDTHHMMSS`` or ``YYYYDDDTHHMMSS`` stamp in the file name (the HLS and
Sentinel-2 naming conventions), and is returned as (year, day of year).
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import PurePath

from rasterio.warp import transform as warp_transform

from geoserve.errors import InputError
from geoserve.raster.source import RasterInfo

_DATE_TAGS = (
    "ACQUISITION_DATE",
    "DATE_ACQUIRED",
    "SENSING_TIME",
    "SENSING_DATE",
    "DATETIME",
    "TIFFTAG_DATETIME",
)
_NAME_STAMP = re.compile(r"(?<!\d)(\d{8}|\d{7})T\d{6}")
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


def _from_stamp(stamp: str) -> dt.date:
    if len(stamp) == 8:
        return dt.datetime.strptime(stamp, "%Y%m%d").date()
    return dt.datetime.strptime(stamp, "%Y%j").date()


def acquisition_date(info: RasterInfo) -> dt.date:
    """The acquisition date from the raster's tags or, failing that, its file name.

    Raises:
        InputError: if neither carries a date.
    """
    tags = {k.upper(): v for k, v in info.tags.items()}
    for key in _DATE_TAGS:
        match = _TAG_DATE.search(tags.get(key, ""))
        if match:
            try:
                return dt.date(*map(int, match.groups()))
            except ValueError:
                continue
    stamp = _NAME_STAMP.search(PurePath(info.name).name)
    if stamp:
        try:
            return _from_stamp(stamp.group(1))
        except ValueError:
            pass
    raise InputError(
        f"{info.name}: no acquisition date found (looked for tags {', '.join(_DATE_TAGS)} "
        "and a YYYYMMDDTHHMMSS stamp in the file name)"
    )


def year_doy(date: dt.date) -> tuple[int, int]:
    """(year, day of year), the temporal encoding Prithvi models take."""
    return date.year, date.timetuple().tm_yday
