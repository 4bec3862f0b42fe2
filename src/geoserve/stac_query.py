"""A STAC API search as one request input: an area and dates in, the scenes found (extra ``stac``).

:func:`stac_search` makes a :class:`StacSearch`: a catalogue (a STAC API's root URL), its
collections, a bbox in longitude/latitude, a datetime range, optionally a cloud-cover limit and
the output grid's resolution and CRS. It is a plain value: nothing is fetched when it is made,
it is stored with a job as JSON, and the engine runs it when the request is opened, knowing
then which bands and how many dates its model reads (:mod:`geoserve.raster.stac_mosaic`).

:meth:`StacSearch.find` asks the catalogue with pystac-client. Every request to the catalogue
(the landing page, each page of results) goes only to http(s) URLs, never follows a redirect,
reads at most :data:`MAX_RESPONSE_BYTES` and passes the caller's ``vet_api`` first (the server:
its URL allow-list); a catalogue that matches more than ``max_items`` Items is refused rather
than read in part. Items over ``max_cloud`` (``eo:cloud_cover``) are left out, by the
catalogue where it offers the query extension, and here in any case.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from geoserve.errors import InputError

if TYPE_CHECKING:
    import pystac

#: Most Items one search may match (a request may ask for fewer).
MAX_SEARCH_ITEMS = 100
#: The largest response read from a catalogue (one page of Items).
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
#: Seconds for each request to a catalogue (connect, and each read).
SEARCH_TIMEOUT_S = 30.0
_COLLECTION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
_CRS = re.compile(r"(?i)epsg:\d{4,6}")


@dataclass(frozen=True)
class StacSearch:
    """One STAC API search, run when its request is opened (see the module docstring).

    Attributes:
        url: The STAC API's root URL (http or https).
        collections: The collections searched.
        bbox: West, south, east, north in degrees (WGS 84).
        datetime: A datetime or range as STAC APIs take it (``2024-06-01/2024-06-30``,
            ``2024-06``), or None for any.
        max_cloud: Leave out Items whose ``eo:cloud_cover`` is above this (percent).
        resolution: The output grid's pixel size in its CRS's units (None: the finest of the
            bands read).
        crs: The output grid's CRS (``EPSG:32633``); None: the UTM zone of the bbox's centre.
        max_items: Refuse a search matching more Items than this.
        vet_api: Called with every URL asked of the catalogue before it is asked; raises to
            refuse it (the server's allow-list). Not stored, not compared.
        vet_asset: Called with every file an Item names before it is opened; returns the href
            to open or raises (the server's input rules). Not stored, not compared.
    """

    url: str
    collections: tuple[str, ...]
    bbox: tuple[float, float, float, float]
    datetime: str | None = None
    max_cloud: float | None = None
    resolution: float | None = None
    crs: str | None = None
    max_items: int = MAX_SEARCH_ITEMS
    vet_api: Callable[[str], None] | None = field(default=None, compare=False, repr=False)
    vet_asset: Callable[[str], str] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url.startswith(("http://", "https://")):
            raise InputError(f"stac.url: an http(s) URL of a STAC API, got {self.url!r:.80}")
        cols = self.collections
        if isinstance(cols, str) or not isinstance(cols, Sequence) or not cols:
            raise InputError("stac.collections: a non-empty list of collection ids")
        for c in cols:
            if not isinstance(c, str) or not _COLLECTION.fullmatch(c):
                raise InputError(f"stac.collections: {c!r:.80} is not a collection id")
        object.__setattr__(self, "collections", tuple(cols))
        object.__setattr__(self, "bbox", _bbox(self.bbox))
        if self.datetime is not None and (
            not isinstance(self.datetime, str) or not _datetime_range(self.datetime)
        ):
            raise InputError(f"stac.datetime: a date or range as text, got {self.datetime!r:.80}")
        if self.max_cloud is not None and not _number_in(self.max_cloud, 0, 100):
            raise InputError(f"stac.max_cloud: a percentage 0..100, got {self.max_cloud!r:.40}")
        if self.resolution is not None and not _number_in(self.resolution, 1e-9, 1e6, True):
            raise InputError(f"stac.resolution: a positive number, got {self.resolution!r:.40}")
        if self.crs is not None and (not isinstance(self.crs, str) or not _known_crs(self.crs)):
            raise InputError(
                f"stac.crs: a projected or geographic CRS's EPSG code such as EPSG:32633, got "
                f"{self.crs!r:.40}"
            )
        n = self.max_items
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SEARCH_ITEMS:
            raise InputError(f"stac.max_items: 1..{MAX_SEARCH_ITEMS}, got {n!r:.40}")

    def __str__(self) -> str:
        """The search as a STAC API ``GET /search`` URL (how results name their input)."""
        from urllib.parse import urlencode

        query: dict[str, str] = {
            "collections": ",".join(self.collections),
            "bbox": ",".join(f"{v:g}" for v in self.bbox),
        }
        if self.datetime:
            query["datetime"] = self.datetime
        return f"{self.url.rstrip('/')}/search?{urlencode(query, safe=',/:')}"

    @property
    def name(self) -> str:
        """How messages name the search."""
        return f"STAC search of {', '.join(self.collections)} at {self.url}"

    def to_json(self) -> dict[str, Any]:
        """The search as plain JSON values (its guards left out)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.compare}
        return {**out, "collections": list(self.collections), "bbox": list(self.bbox)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], **guards: Any) -> StacSearch:
        """A search from :meth:`to_json`'s form (or a request body's ``stac`` object).

        Raises:
            InputError: an unknown or missing field, or an invalid value (naming it).
        """
        if not isinstance(data, Mapping):
            raise InputError("stac: an object with url, collections and bbox")
        known = {f.name for f in dataclasses.fields(cls)} - {"vet_api", "vet_asset"}
        extra = sorted(set(data) - known)
        if extra:
            raise InputError(
                f"stac: unknown field {extra[0]!r:.40}; known: {', '.join(sorted(known))}"
            )
        missing = [k for k in ("url", "collections", "bbox") if k not in data]
        if missing:
            raise InputError(f"stac: {missing[0]} is required")
        return cls(**dict(data), **guards)

    def with_guards(
        self, vet_api: Callable[[str], None] | None, vet_asset: Callable[[str], str] | None
    ) -> StacSearch:
        """The same search under the given guards."""
        return dataclasses.replace(self, vet_api=vet_api, vet_asset=vet_asset)

    def find(self) -> list[pystac.Item]:
        """The Items the catalogue matches, clearest and then earliest first.

        Raises:
            InputError: the catalogue cannot be reached or answers wrongly (naming its URL),
                it matches more than ``max_items`` Items, or none.
            ForbiddenInputError: ``vet_api`` refused a URL.
        """
        from geoserve.stac_client import search_items  # (pystac-client, imported on use)

        items = search_items(self)
        if not items:
            raise InputError(f"{self.name}: no Items in {describe_where(self)}")
        return sorted(items, key=lambda i: (item_cloud(i), str(i.datetime or ""), i.id))


def stac_search(
    url: str,
    collections: str | Sequence[str],
    bbox: Sequence[float],
    datetime: str | None = None,
    *,
    max_cloud: float | None = None,
    resolution: float | None = None,
    crs: str | None = None,
    max_items: int = MAX_SEARCH_ITEMS,
) -> StacSearch:
    """A STAC API search, as an input of :meth:`Engine.generate_image` (see :class:`StacSearch`).

    ``collections``: one id, or several; ``bbox``: west, south, east, north in degrees.
    """
    cols = (collections,) if isinstance(collections, str) else tuple(collections)
    return StacSearch(
        url,
        cols,
        _bbox(bbox),
        datetime,
        max_cloud,
        resolution,
        crs,
        max_items,  # type: ignore[arg-type]
    )


def parse_bbox(text: str) -> tuple[float, float, float, float]:
    """``W,S,E,N`` (degrees) from the command line.

    Raises:
        InputError: not four numbers separated by commas.
    """
    parts = [p.strip() for p in str(text).split(",")]
    try:
        values = [float(p) for p in parts]
    except ValueError:
        values = []
    if len(values) != 4:
        raise InputError(f"bbox: four numbers W,S,E,N in degrees, got {text!r:.80}")
    return _bbox(values)


def _bbox(value: Any) -> tuple[float, float, float, float]:
    if isinstance(value, str) or not isinstance(value, Sequence) or len(value) != 4:
        raise InputError("stac.bbox: four numbers, west, south, east, north in degrees")
    if not all(_number_in(v, -180, 180) for v in value):
        raise InputError(f"stac.bbox: {list(value)!r:.120} is not in degrees")
    w, s, e, n = (float(v) for v in value)
    if not (w < e and s < n and s >= -90 and n <= 90):
        raise InputError(
            f"stac.bbox: [{w}, {s}, {e}, {n}] is not west, south, east, north (west < east, "
            "south < north, latitudes within ±90; an area across the antimeridian is two "
            "searches)"
        )
    return (w, s, e, n)


def _known_crs(text: str) -> bool:
    """An ``EPSG:N`` code pyproj knows, of a projected or geographic CRS."""
    if not _CRS.fullmatch(text):
        return False
    from pyproj import CRS
    from pyproj.exceptions import CRSError

    try:
        crs = CRS.from_epsg(int(text.split(":")[1]))
    except CRSError:
        return False
    return bool(crs.is_projected or crs.is_geographic)


_DATE = re.compile(r"\d{4}(-\d{2}(-\d{2})?)?")


def _datetime_range(text: str) -> bool:
    """A STAC API ``datetime``: one date or datetime, or a range of two (``..``: open)."""
    import datetime as dt

    parts = text.split("/")
    if not 0 < len(text) <= 64 or len(parts) > 2 or parts == ["..", ".."]:
        return False
    for part in parts:
        if part in ("", "..") and len(parts) == 2:
            continue
        if _DATE.fullmatch(part):
            continue
        try:
            dt.datetime.fromisoformat(part.replace("Z", "+00:00"))
        except ValueError:
            return False
    return True


def _number_in(v: Any, lo: float, hi: float, open_low: bool = False) -> bool:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return False
    return (lo < v if open_low else lo <= v) and v <= hi


def item_cloud(item: pystac.Item) -> float:
    """An Item's ``eo:cloud_cover`` (100 when it gives none: the least preferred)."""
    value = item.properties.get("eo:cloud_cover")
    return float(value) if value is not None and _number_in(value, 0, 100) else 100.0


def describe_where(search: StacSearch) -> str:
    """The search's area, dates and cloud limit, for messages."""
    when = f", {search.datetime}" if search.datetime else ""
    cloud = f", at most {search.max_cloud:g}% cloud" if search.max_cloud is not None else ""
    return f"bbox {list(search.bbox)}{when}{cloud}"
