"""The Items a STAC search found, as one lazy cube on one grid (odc-stac), ready for a model.

:func:`search_cube` runs a :class:`~geoserve.stac_query.StacSearch` for a model that reads
given bands and dates, and returns an ``xarray.DataArray`` (band, [time,] y, x), Dask-backed,
that the engine reads like any cube (:mod:`geoserve.raster.cube`): one grid row at a time,
only the chunks a row needs computed.

- **Bands**: each band the model reads picks an asset of the first Item as for one Item
  (:func:`geoserve.raster.stac_stack.select_bands`: asset key, band name, common name; band
  roles for a model that selects by position); every Item must hold them.
- **Grid**: the bbox, in the search's CRS (default: the UTM zone of the bbox's centre), at its
  resolution (default: the finest of the bands read, from the Items' ``proj`` metadata),
  pixel edges on multiples of the resolution. odc-stac places every Item's files on it,
  mosaicking the Items of one day (items that straddle the bbox or a zone line); bands coarser
  than the grid are resampled bilinearly, classes (``scl``, ``classification`` bands) by nearest
  neighbour. Pixels are float32, nodata NaN.
- **Clouds**: where the Items have a scene classification band (Sentinel-2 L2A ``scl``),
  pixels of the classes in :data:`CLOUD_CLASSES` are nodata.
- **Dates**: a model that reads one date gets a composite: each pixel from the clearest day
  (lowest mean ``eo:cloud_cover`` of its Items) that sees it unclouded, then the next clearest;
  its date the clearest day's. A model that reads T dates gets T days: the search's datetime
  range (else the span of the days found) cut into T equal windows, and in each window its
  clearest day (ties: the earliest); a window without a day is an error naming it.

Every file is opened by geoserve's own reader (:mod:`geoserve.raster.stac_reader`), not
odc-stac's: each href must be an http(s) URL (an Item from a catalogue never names a local
file), passes the search's ``vet_asset`` once (the server's input rules), and is opened
through the allowed GDAL drivers (:mod:`geoserve.raster.trust`) like any URL input.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import quote

import numpy as np

from geoserve.errors import BandMismatchError, GeoServeError, InputError, prefixed
from geoserve.raster.budget import current
from geoserve.raster.input_values import CARRIED_TAGS
from geoserve.raster.stac_item import AssetBand, StacItem
from geoserve.raster.stac_reader import Opener, SearchFiles, guarded_driver
from geoserve.raster.stac_stack import Wanted, select_bands, wanted_bands
from geoserve.stac_query import StacSearch, item_cloud

if TYPE_CHECKING:
    import pystac
    import xarray as xr


#: Sentinel-2 scene classes masked as nodata: cloud shadow, cloud (medium and high
#: probability), thin cirrus.
CLOUD_CLASSES = (3, 8, 9, 10)
#: The scene classification band looked up in every Item.
SCL = Wanted("scl", "scl")
#: Dask chunks of the cube (rows, columns): a grid row of patches computes a few of them.
CHUNK_ROWS, CHUNK_COLS = 512, 2048
#: Most pixels (rows x columns) of a search's grid.
MAX_GRID_PIXELS = 1 << 30


@dataclass(frozen=True)
class Found:
    """What a search found and what will be read of it (``geoserve info --stac``).

    Attributes:
        items: The Items found, clearest first.
        days: The days read, in cube order, each with its Items.
        assets: The asset key read for each band, by the band's label (``scl`` included).
        crs, resolution, shape: The output grid (``shape``: rows, columns).
        origin: The grid's top-left corner (x, y) in ``crs``.
    """

    items: list[pystac.Item]
    days: list[tuple[dt.date, list[pystac.Item]]]
    assets: dict[str, str]
    crs: str
    resolution: float
    shape: tuple[int, int]
    origin: tuple[float, float]


def plan_search(search: StacSearch, selectors: Sequence[int | str] | None, frames: int) -> Found:
    """Run ``search`` and decide what to read for a model (see the module docstring).

    Raises:
        InputError, BandMismatchError: naming the search or the Item at fault.
    """
    items = search.find()
    try:
        return _plan(search, items, selectors, frames)
    except GeoServeError:
        raise
    except Exception as exc:  # (an Item's metadata, malformed in a way pystac let through)
        raise InputError(
            f"{search.name}: the Items found cannot be read ({type(exc).__name__})"
        ) from None


def _plan(
    search: StacSearch,
    items: list[pystac.Item],
    selectors: Sequence[int | str] | None,
    frames: int,
) -> Found:
    stac = [_as_stac(i, search) for i in items]
    wanted = wanted_bands(selectors)
    picked = select_bands(stac[0], wanted)
    try:
        scl = select_bands(stac[0], [SCL], partial=True)
    except BandMismatchError:  # (no scene classes: nothing is masked)
        scl = []
    assets = {w.label: _band_key(b) for w, b in picked}
    if scl and "scl" not in {k.lower() for k in assets}:
        assets["scl"] = _band_key(scl[0][1])
    for s in stac[1:]:
        have = {_band_key(b) for b in s.bands() if b.geotiff}
        lacking = [k for k in assets.values() if k not in have]
        if lacking:
            raise InputError(f"{s.name}: no asset {lacking[0]!r}, which the other Items have")
    epsg = _crs(search)
    resolution = search.resolution
    if resolution is None:
        from pyproj import CRS

        if not CRS.from_epsg(epsg).is_projected:  # (the Items' sizes are in metres)
            raise InputError(
                f"{search.name}: crs {search.crs} is not in metres; give the resolution in "
                "its units (--resolution, resolution=)"
            )
        resolution = _finest(stac[0], picked)
    bounds = _bounds(search.bbox, epsg, resolution)
    shape = (
        round((bounds[3] - bounds[1]) / resolution),
        round((bounds[2] - bounds[0]) / resolution),
    )
    if shape[0] * shape[1] > MAX_GRID_PIXELS:
        raise InputError(
            f"{search.name}: the bbox is {shape[1]} x {shape[0]} pixels at {resolution:g}; at "
            f"most {MAX_GRID_PIXELS} pixels (a smaller bbox, or a coarser resolution)"
        )
    days = _choose_days(search, _by_day(items, search.bbox), frames)
    origin = (bounds[0], bounds[3])
    return Found(items, days, assets, f"EPSG:{epsg}", resolution, shape, origin)


def search_cube(
    search: StacSearch, selectors: Sequence[int | str] | None, frames: int, opener: Opener
) -> xr.DataArray:
    """The cube a model reads from ``search`` (see the module docstring).

    ``opener`` opens one vetted href as a raster input (the allowed drivers).
    """
    import odc.stac
    import rioxarray  # noqa: F401  (it registers .rio)
    import xarray as xr
    from affine import Affine
    from odc.geo.geobox import GeoBox

    found = plan_search(search, selectors, frames)
    vetted = _vet_hrefs(search, found)
    files = SearchFiles(search.name, vetted, opener, current())
    crs, res, (x0, y1) = found.crs, found.resolution, found.origin
    geobox = GeoBox(found.shape, Affine(res, 0, x0, 0, -res, y1), crs)
    rank = {i.id: r for r, (_, day) in enumerate(found.days) for i in day}
    chosen = [_resolved(i, search) for _, day in found.days for i in day]
    keys = list(dict.fromkeys(found.assets.values()))
    classes = {k for label, k in found.assets.items() if label.lower() == "scl"}
    classes |= {_band_key(b) for b in _as_stac(chosen[0], search).bands() if b.categorical}
    try:
        ds = odc.stac.load(
            chosen,
            bands=keys,
            geobox=geobox,
            groupby=lambda item, parsed, idx: rank[item.id],
            resampling={k: "nearest" if k in classes else "bilinear" for k in keys},
            dtype="float32",
            chunks={"y": CHUNK_ROWS, "x": CHUNK_COLS},
            driver=guarded_driver(files.open),
        )
    except GeoServeError:
        raise
    except Exception as exc:  # (metadata odc-stac cannot use: a CRS, a transform)
        raise InputError(
            f"{search.name}: odc-stac cannot place the Items ({type(exc).__name__}: "
            f"{str(exc)[:160]})"
        ) from None
    labels = [label for label in found.assets if label != "scl" or _reads_scl(selectors)]
    scl_key = found.assets.get("scl")
    bands = [ds[found.assets[label]] for label in labels]
    if scl_key is not None:
        cloudy = ds[scl_key].isin(CLOUD_CLASSES)
        bands = [b if found.assets[lab] == scl_key else b.where(~cloudy)
                 for b, lab in zip(bands, labels, strict=True)]  # fmt: skip
    cube = xr.concat(bands, dim="band").assign_coords(band=labels)
    days = [d for d, _ in found.days]
    if frames <= 1:
        out = cube.isel(time=0)
        for t in range(1, cube.sizes["time"]):
            out = out.fillna(cube.isel(time=t))
        out = out.assign_coords(time=np.datetime64(days[0].isoformat(), "ns"))
    else:
        out = cube.assign_coords(time=[np.datetime64(d.isoformat(), "ns") for d in days])
        out = out.transpose("band", "time", "y", "x")
    out = out.rio.write_crs(crs).rio.write_nodata(np.nan)
    out.name = search.name
    out.attrs = {CARRIED_TAGS: provenance(search, found)}
    return cast("xr.DataArray", out)


def provenance(search: StacSearch, found: Found) -> dict[str, str]:
    """The tags an output of ``search`` carries: the catalogue, and the Items read and when."""
    items = [i for _, day in found.days for i in day]
    return {
        "STAC_API": search.url,
        "STAC_COLLECTIONS": ",".join(search.collections),
        "STAC_BBOX": ",".join(f"{v:g}" for v in search.bbox),
        "STAC_ITEMS": ",".join(i.id for i in items),
        "STAC_ITEM_HREFS": ",".join(_as_stac(i, search).name for i in items),
        "STAC_DATETIMES": ",".join(i.datetime.isoformat() if i.datetime else "" for i in items),
        "STAC_DAYS": ",".join(d.isoformat() for d, _ in found.days),
    }


def _resolved(item: pystac.Item, search: StacSearch) -> pystac.Item:
    """``item`` with its asset hrefs absolute, as geoserve resolved (and vetted) them.

    Its links dropped: odc-stac then reads exactly those URLs, never one it resolves itself.
    """
    import pystac

    stac = _as_stac(item, search)
    data = json.loads(json.dumps(item.to_dict(transform_hrefs=False)))
    for band in stac.bands():
        data["assets"][band.asset]["href"] = band.href
    data["links"] = []
    return pystac.Item.from_dict(data, migrate=False)


def _as_stac(item: pystac.Item, search: StacSearch) -> StacItem:
    """``item`` as a :class:`StacItem` located at its URL in the catalogue searched.

    Its own ``self`` link is not trusted to say where it is: relative hrefs resolve against
    the catalogue's URL of it, so an Item names only what its catalogue could.
    """
    collection = quote(str(item.collection_id), safe="")
    where = f"{search.url.rstrip('/')}/collections/{collection}/items/{quote(item.id, safe='')}"
    data = item.to_dict(transform_hrefs=False)
    data["links"] = [link for link in data.get("links", []) if link.get("rel") != "self"]
    return StacItem(data, where)


def _band_key(band: AssetBand) -> str:
    """odc-stac's name of a band: the asset's key, with the band's number in several."""
    return band.asset if band.single or band.band is None else f"{band.asset}.{band.band + 1}"


def _reads_scl(selectors: Sequence[int | str] | None) -> bool:
    return selectors is not None and any(str(s).lower() == "scl" for s in selectors)


def _vet_hrefs(search: StacSearch, found: Found) -> dict[str, str]:
    """Each file to read, checked once: href -> what to open."""
    out: dict[str, str] = {}
    keys = set(found.assets.values())
    for _, day in found.days:
        for item in day:
            stac = _as_stac(item, search)
            for band in stac.bands():
                if _band_key(band) not in keys or band.href in out:
                    continue
                if not band.href.startswith(("http://", "https://")):
                    raise InputError(f"{stac.name}: asset {band.asset!r} is not an http(s) URL")
                try:
                    out[band.href] = search.vet_asset(band.href) if search.vet_asset else band.href
                except GeoServeError as exc:
                    raise prefixed(exc, f"{stac.name}: asset {band.asset!r}") from None
    return out


def _crs(search: StacSearch) -> int:
    if search.crs is not None:
        return int(search.crs.split(":")[1])
    w, s, e, n = search.bbox
    lon, lat = (w + e) / 2, (s + n) / 2
    zone = min(60, int((lon + 180) // 6) + 1)
    return (32600 if lat >= 0 else 32700) + zone


def _bounds(
    bbox: tuple[float, float, float, float], epsg: int, res: float
) -> tuple[float, float, float, float]:
    """The bbox in ``epsg``, its edges out to multiples of ``res``."""
    from rasterio.warp import transform_bounds

    x0, y0, x1, y1 = transform_bounds("EPSG:4326", f"EPSG:{epsg}", *bbox, densify_pts=21)
    return (
        math.floor(x0 / res) * res,
        math.floor(y0 / res) * res,
        math.ceil(x1 / res) * res,
        math.ceil(y1 / res) * res,
    )


def _finest(item: StacItem, picked: Sequence[tuple[Wanted, AssetBand]]) -> float:
    sizes = []
    for _, band in picked:
        transform = item.data["assets"][band.asset].get("proj:transform")
        if isinstance(transform, list) and len(transform) >= 6 and _size(transform[0]):
            sizes.append(abs(float(transform[0])))
    gsd = item.data.get("properties", {}).get("gsd")
    if not sizes and _size(gsd):
        sizes.append(float(gsd))
    if not sizes:
        raise InputError(
            f"{item.name}: no proj:transform or gsd to take the resolution from; give one "
            "(--resolution, resolution=)"
        )
    return min(sizes)


def _size(value: Any) -> bool:
    """A pixel size: a finite, positive number of at most 100 km (not a boolean)."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 < abs(value) <= 1e5
    )


def _solar_day(item: pystac.Item, lon: float) -> dt.date:
    when = item.datetime or item.common_metadata.start_datetime
    if when is None:
        raise InputError(f"STAC Item {item.id!r:.80}: no datetime")
    return (when + dt.timedelta(hours=lon / 15)).date()


def _by_day(
    items: Sequence[pystac.Item], bbox: tuple[float, float, float, float]
) -> list[tuple[dt.date, list[pystac.Item], float]]:
    """The days of ``items`` (solar time at the bbox's centre), each with its mean cloud."""
    lon = (bbox[0] + bbox[2]) / 2
    days: dict[dt.date, list[pystac.Item]] = {}
    for item in items:
        days.setdefault(_solar_day(item, lon), []).append(item)
    return [(d, v, sum(map(item_cloud, v)) / len(v)) for d, v in sorted(days.items())]


def _choose_days(
    search: StacSearch, days: list[tuple[dt.date, list[pystac.Item], float]], frames: int
) -> list[tuple[dt.date, list[pystac.Item]]]:
    if frames <= 1:  # all of them, clearest first
        ranked = sorted(days, key=lambda d: (d[2], d[0]))
        return [(d, v) for d, v, _ in ranked]
    start, end = _span(search, days)
    step = (end - start) / frames
    chosen = []
    for k in range(frames):
        lo, hi = start + step * k, start + step * (k + 1)
        inside = [d for d in days if lo <= d[0] < hi or (k == frames - 1 and d[0] == hi)]
        if not inside:
            raise InputError(
                f"{search.name}: no scene from {lo.isoformat()} to {hi.isoformat()}, one of "
                f"the {frames} windows the model's {frames} dates are chosen in; widen the "
                "datetime range or raise max_cloud"
            )
        best = min(inside, key=lambda d: (d[2], d[0]))
        chosen.append((best[0], best[1]))
    return chosen


def _span(
    search: StacSearch, days: list[tuple[dt.date, list[pystac.Item], float]]
) -> tuple[dt.date, dt.date]:
    """The search's datetime range as dates, else the first and last day found."""
    text = search.datetime or ""
    if "/" in text:
        a, b = (p.strip() for p in text.split("/", 1))
        try:
            start = dt.date.fromisoformat(a[:10]) if a not in ("", "..") else days[0][0]
            end = dt.date.fromisoformat(b[:10]) if b not in ("", "..") else days[-1][0]
        except ValueError:
            start, end = days[0][0], days[-1][0]
    else:
        start, end = days[0][0], days[-1][0]
    if end <= start:
        end = start + dt.timedelta(days=1)
    return start, end
