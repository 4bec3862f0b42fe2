"""STAC Items as inputs: reading one, and listing the bands its assets hold.

A STAC Item (the SpatioTemporal Asset Catalog specification, https://stacspec.org) is a JSON
document describing one acquisition: an ``id``, ``properties.datetime`` and ``assets``, one per
file, each with an ``href`` (a URL or a path; a relative one is relative to the Item's own
location), a media ``type``, ``roles`` and the bands the file holds (the ``eo:bands`` and
``raster:bands`` lists of STAC 1.0's extensions, or STAC 1.1's ``bands``, each band with a
``name``, a ``common_name`` such as ``red`` or ``nir08``, a ``nodata`` value).

:class:`StacItem` reads and checks one (from a file, an http(s) URL, a parsed dict or a
``pystac.Item``; pystac checks its structure and resolves relative hrefs) and lists its bands
as :class:`AssetBand` entries, hrefs resolved.
:mod:`geoserve.raster.stac` picks the bands a model reads and opens them as one input.

An Item names other files, so where its hrefs may point is restricted: an Item read from a URL
may name only http(s) URLs (never a local file), one read from a local file also local paths;
other schemes (``s3://``, ``gs://``) are refused. Each file is then opened like any input, by
the allowed GDAL drivers only (:mod:`geoserve.raster.trust`). The HTTP server reads an Item only
from an allowed path or URL, and hands it a ``vet`` guard: every file the Item names must pass
the same allow-lists as a path or URL the request named itself.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pystac
from pystac.utils import make_absolute_href

from geoserve.errors import InputError, RasterReadError
from geoserve.raster.budget import current
from geoserve.raster.dates import parse_date
from geoserve.raster.trust import read_head

#: The largest Item document read (a Sentinel-2 Item is about 30 KB).
MAX_ITEM_BYTES = 4 * 1024 * 1024
#: Seconds allowed for fetching an Item from a URL.
ITEM_TIMEOUT_S = 30.0

_HTTP = ("http://", "https://")
#: The path of a STAC API Item: ``.../collections/{collection}/items/{item}``.
_API_ITEM = re.compile(r"/collections/[^/]+/items/[^/]+/?$")
#: Media types of assets read as rasters (GeoTIFF, Cloud-Optimized or not).
_TIFF_TYPES = ("image/tiff", "image/geotiff", "image/vnd.stac.geotiff")
_TIFF_SUFFIXES = (".tif", ".tiff")


@dataclass(frozen=True)
class AssetBand:
    """One band of one asset of a STAC Item.

    Attributes:
        asset: The asset's key (``"red"``, ``"B04"``).
        href: The file: a local path or an http(s) URL.
        band: Its 0-based band in the file; ``None`` when the Item does not list the asset's
            bands (the whole file, read as it is).
        name, common_name: The band's ``name`` and ``common_name``, if the Item gives them.
        single: Whether the asset holds this band alone (its key then selects it too).
        geotiff: Whether the asset is a GeoTIFF (its media type, or its file name without one).
        media_type: The asset's media ``type``.
        nodata: The band's nodata value from the Item (used when the file declares none).
        categorical: The band holds classes (``classification`` extension): resampled with
            nearest neighbour, never averaged.
    """

    asset: str
    href: str
    band: int | None
    name: str | None
    common_name: str | None
    single: bool
    geotiff: bool
    media_type: str | None
    nodata: float | None
    categorical: bool

    @property
    def label(self) -> str:
        """How band lists show it: its name, else its asset's key."""
        return self.name or self.asset


@dataclass(frozen=True)
class StacItem:
    """A STAC Item given as an input.

    Args:
        data: The Item as parsed JSON.
        location: Where it was read from (a path or an http(s) URL); relative hrefs are
            relative to it. ``None`` for an Item given as a dict: its ``self`` link, if
            absolute, stands in.

    Raises:
        InputError: not a STAC Item (naming the field at fault).
    """

    data: Mapping[str, Any]
    location: str | None = None
    vet: Callable[[str], str] | None = field(default=None, compare=False, repr=False)
    """A guard every file the Item names passes before it is opened (the server's allow-lists):
    it returns what to open (a resolved path, the URL) or raises ForbiddenInputError."""

    def __post_init__(self) -> None:
        data = self.data
        where = self.location or "STAC Item"
        if not isinstance(data, Mapping):
            raise InputError(f"{where}: not a STAC Item (a JSON object is needed)")
        if data.get("type") != "Feature":
            raise InputError(f"{where}: not a STAC Item (its 'type' is not 'Feature')")
        assets = data.get("assets")
        if not isinstance(assets, Mapping) or not assets:
            raise InputError(f"{where}: a STAC Item without assets")
        for key, asset in assets.items():
            if not isinstance(asset, Mapping) or not isinstance(asset.get("href"), str):
                raise InputError(f"{where}: asset {str(key)[:60]!r} has no href")
        if not isinstance(data.get("properties", {}), Mapping):
            raise InputError(f"{where}: 'properties' is not an object")
        try:  # the rest of the Item's structure, as pystac reads it
            pystac.Item.from_dict(dict(data), preserve_dict=True, migrate=False)
        except Exception as exc:  # pystac raises KeyError, TypeError, ValueError, its own
            raise InputError(f"{where}: not a STAC Item ({type(exc).__name__}: {exc})") from None
        if self.location is None:
            object.__setattr__(self, "location", _self_href(data))

    @property
    def id(self) -> str:
        """The Item's ``id`` (shown in messages, at most 100 characters)."""
        return str(self.data.get("id", ""))[:100]

    @property
    def name(self) -> str:
        """How messages name it: where it was read from, else its id."""
        return self.location or f"STAC Item {self.id!r}"

    @property
    def remote(self) -> bool:
        """Whether it was read from an http(s) URL (it may then name only URLs)."""
        return bool(self.location) and str(self.location).startswith(_HTTP)

    @property
    def date(self) -> dt.date | None:
        """Its acquisition date: ``properties.datetime``, else ``start_datetime``."""
        props = self.data.get("properties", {})
        for key in ("datetime", "start_datetime"):
            value = props.get(key)
            if value is not None:
                return parse_date(value, f"{self.name}: properties.{key}")
        return None

    def bands(self) -> list[AssetBand]:
        """Every band of every asset, in the Item's order, hrefs resolved.

        Raises:
            InputError: an href that may not be read (see the module docstring).
        """
        out: list[AssetBand] = []
        for key, asset in self.data["assets"].items():
            media = asset.get("type")
            media = media if isinstance(media, str) else None
            href = self.resolve(str(key), asset["href"])
            tiff = (
                media.lower().split(";")[0].strip() in _TIFF_TYPES
                if media
                else urlsplit(href).path.lower().endswith(_TIFF_SUFFIXES)
            )
            infos = _band_infos(asset)
            categorical = _categorical(asset)
            if not infos:
                out.append(
                    AssetBand(str(key), href, None, None, None, True, tiff, media, None,
                              categorical)
                )  # fmt: skip
            for i, band in enumerate(infos):
                out.append(
                    AssetBand(
                        asset=str(key),
                        href=href,
                        band=i,
                        name=_text(band.get("name")),
                        common_name=_text(band.get("common_name") or band.get("eo:common_name")),
                        single=len(infos) == 1,
                        geotiff=tiff,
                        media_type=media,
                        nodata=_number(band.get("nodata")),
                        categorical=categorical or _categorical(band),
                    )
                )
        return out

    def resolve(self, key: str, href: str) -> str:
        """Asset ``key``'s ``href`` as a local path or an http(s) URL.

        Raises:
            InputError: a scheme other than http(s) and file, a local file named by an Item
            read from a URL, or a relative href of an Item whose location is unknown.
        """
        what = f"{self.name}: asset {key!r}"
        text = href.strip()
        if not text or "\x00" in text:
            raise InputError(f"{what}: empty or invalid href")
        scheme = urlsplit(text).scheme.lower()
        if len(scheme) == 1:  # a Windows drive letter, not a scheme
            scheme = ""
        if scheme in ("http", "https"):
            return text
        if scheme and scheme != "file":
            raise InputError(
                f"{what}: {scheme}:// hrefs are not read (only local paths and http(s) URLs)"
            )
        if self.remote:
            if scheme == "file":
                raise InputError(f"{what}: an Item read from a URL may not name local files")
            return make_absolute_href(text, str(self.location))
        if scheme == "file":
            parts = urlsplit(text)
            if parts.netloc not in ("", "localhost"):
                raise InputError(f"{what}: file:// href on another host ({parts.netloc})")
            return unquote(parts.path)
        if os.path.isabs(text):
            return text
        if self.location is None:
            raise InputError(
                f"{what}: relative href {text!r}, but the Item's location is unknown (read "
                "it from its file or URL, or give it a 'self' link)"
            )
        return make_absolute_href(text, str(self.location))

    @classmethod
    def read(
        cls,
        where: str | os.PathLike[str],
        max_bytes: int = MAX_ITEM_BYTES,
        vet: Callable[[str], str] | None = None,
    ) -> StacItem:
        """The Item in a local JSON file or at an http(s) URL (``vet``: see the class).

        Raises:
            RasterReadError: a missing file; InputError: a failed download, too large, not
            JSON, or not a STAC Item.
        """
        text = os.fspath(where)
        if text.startswith(_HTTP):
            raw = _fetch(text, max_bytes)
            location = text
        else:
            path = Path(text)
            if not path.is_file():
                raise RasterReadError(f"{text}: no such file")
            if path.stat().st_size > max_bytes:
                raise InputError(f"{text}: larger than {max_bytes} bytes; not a STAC Item")
            raw = path.read_bytes()
            location = os.path.abspath(text)
        return cls(_parse(raw, text), location, vet)

    @classmethod
    def parse(cls, raw: bytes, location: str, vet: Callable[[str], str] | None = None) -> StacItem:
        """The Item in ``raw`` (JSON bytes, e.g. downloaded), read from ``location``.

        Raises:
            InputError: not JSON, or not a STAC Item.
        """
        return cls(_parse(raw, location), location, vet)

    @classmethod
    def of(cls, obj: Any) -> StacItem:
        """``obj`` as a :class:`StacItem`: one already, a ``pystac.Item``, a file or a URL."""
        if isinstance(obj, StacItem):
            return obj
        if _is_pystac_item(obj):
            return cls(obj.to_dict(), obj.get_self_href())
        return cls.read(obj)


def is_stac_input(obj: Any, data_format: str = "auto", sniff: bool = True) -> bool:
    """Whether a request input is a STAC Item.

    A :class:`StacItem` or ``pystac.Item`` always is; with ``data_format="auto"`` also a path
    to a local JSON file, and an http(s) URL ending in ``.json`` or of the form of a STAC API
    Item (``.../collections/C/items/I``). A dict never is (a dict request is modalities), nor
    are bytes or base64. A local file is one when its first bytes are a JSON object's; with
    ``sniff=False`` nothing is read and it counts only when its name ends in ``.json``.
    """
    if isinstance(obj, StacItem) or _is_pystac_item(obj):
        return True
    if data_format != "auto" or not isinstance(obj, str | os.PathLike):
        return False
    text = os.fspath(obj)
    if not isinstance(text, str) or len(text) > 4096 or "\x00" in text:
        return False
    if text.startswith(_HTTP):
        path = urlsplit(text).path
        return path.lower().endswith(".json") or _API_ITEM.search(path) is not None
    if not sniff:
        return text.lower().endswith(".json")
    try:
        if not Path(text).is_file():
            return False
    except (OSError, ValueError):
        return False
    return read_head(text, 64).lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"{")


def _is_pystac_item(obj: Any) -> bool:
    return isinstance(obj, pystac.Item)


def _fetch(url: str, max_bytes: int) -> bytes:
    request = urllib.request.Request(
        url, headers={"Accept": "application/geo+json, application/json"}
    )
    budget = current()  # a request's, while it opens its inputs: charged, its deadline kept
    timeout = ITEM_TIMEOUT_S
    if budget is not None:
        budget.charge(url)
        timeout = budget.http_timeout(ITEM_TIMEOUT_S)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:  # noqa: S310
            if not resp.geturl().startswith(_HTTP):
                raise InputError(f"{url}: redirected away from http(s)")
            raw: bytes = resp.read(max_bytes + 1)
    except urllib.error.HTTPError as exc:
        raise InputError(f"{url}: cannot fetch the STAC Item (HTTP {exc.code})") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        why = getattr(exc, "reason", None) or exc
        raise InputError(f"{url}: cannot fetch the STAC Item ({why})") from None
    if len(raw) > max_bytes:
        raise InputError(f"{url}: larger than {max_bytes} bytes; not a STAC Item")
    if budget is not None:
        budget.add_bytes(url, len(raw))
    return raw


def _parse(raw: bytes, name: str) -> Any:
    try:
        return json.loads(raw.decode("utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{name}: not a STAC Item (not valid JSON: {exc})") from None
    except RecursionError:
        raise InputError(f"{name}: not a STAC Item (JSON nested too deeply)") from None


def _self_href(data: Mapping[str, Any]) -> str | None:
    """The Item's absolute ``self`` link, if it has one."""
    links = data.get("links")
    for link in links if isinstance(links, list) else ():
        if isinstance(link, Mapping) and link.get("rel") == "self":
            href = link.get("href")
            if isinstance(href, str) and (href.startswith(_HTTP) or os.path.isabs(href)):
                return href
    return None


def _band_infos(asset: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The asset's bands: STAC 1.1 ``bands``, else ``eo:bands`` merged with ``raster:bands``."""
    lists: list[list[Any]] = []
    for key in ("bands", "eo:bands", "raster:bands"):
        value = asset.get(key)
        lists.append(value if isinstance(value, list) else [])
    if lists[0]:
        return [b if isinstance(b, Mapping) else {} for b in lists[0]]
    eo, raster = lists[1], lists[2]
    out: list[Mapping[str, Any]] = []
    for i in range(max(len(eo), len(raster))):
        merged: dict[str, Any] = {}
        for part in (raster[i] if i < len(raster) else {}, eo[i] if i < len(eo) else {}):
            if isinstance(part, Mapping):
                merged.update(part)
        out.append(merged)
    return out


def _categorical(obj: Mapping[str, Any]) -> bool:
    return any(k in obj for k in ("classification:classes", "classification:bitfields"))


def _text(value: Any) -> str | None:
    return value[:100] if isinstance(value, str) and value.strip() else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        return float(value)  # also "nan", as some Items write it
    except ValueError:
        return None
