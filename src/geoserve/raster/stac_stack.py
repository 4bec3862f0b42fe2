"""A STAC Item read as one input, its bands stacked: the bands a model needs, from their files.

Most Items keep one band per file: a Sentinel-2 L2A Item has ``blue``, ``green``, ``red``,
``nir`` at 10 m and ``nir08``, ``swir16``, ``swir22`` at 20 m, each its own Cloud-Optimized
GeoTIFF. :func:`open_item` picks the bands a model reads (:func:`wanted_bands`), opens only
the files holding them (a file once for several bands in a row), puts them on one grid (the
finest of them) and gives one :class:`~geoserve.raster.align.StackedSource` whose band
descriptions are the model's own band names, so the model's processor selects them as it does
in a single file. Coarser bands are resampled as the scene streams (bilinear; nearest for
categorical bands), never loaded whole; files on the chosen grid are read as they are.

A band selector (a model's band or ``--bands``) picks, first match wins:

1. an asset by its key (``red``, ``B04``), for an asset of one band;
2. a band by its ``name`` (``B04``);
3. a band by its ``common_name`` (``red``, ``nir08``).

Names match without regard to case, and Sentinel-2's ``B04`` and ``B4`` are the same band.
Only GeoTIFF assets are read: an Item's JPEG 2000 copy of a band (``red-jp2``) is never picked.
A model that selects bands by position (``bands=(1, 2, 3, 8, 11, 12)`` for a 13-band stack)
reads an Item by its ``band_roles`` instead (``BLUE``, ``NIR_NARROW``, ...: the STAC common
names ``blue``, ``nir08``, ...); without roles, name the bands (``--bands``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from geoserve.errors import BandMismatchError, GeoServeError, InputError, count, prefixed
from geoserve.raster.align import StackedSource, TargetGrid, align
from geoserve.raster.budget import add_pixels
from geoserve.raster.source import RasterSource
from geoserve.raster.stac_item import AssetBand, StacItem

#: The STAC common name of each band role a model may declare (``GeoTiffPatcher.band_roles``).
ROLE_COMMON_NAMES = {
    "COASTAL": "coastal",
    "BLUE": "blue",
    "GREEN": "green",
    "RED": "red",
    "YELLOW": "yellow",
    "PAN": "pan",
    "RED_EDGE_1": "rededge071",
    "RED_EDGE_2": "rededge075",
    "RED_EDGE_3": "rededge078",
    "NIR": "nir",
    "NIR_BROAD": "nir",
    "NIR_NARROW": "nir08",
    "WATER_VAPOR": "nir09",
    "CIRRUS": "cirrus",
    "SWIR_1": "swir16",
    "SWIR_2": "swir22",
}

#: Most files one Item input may open.
MAX_ITEM_FILES = 64

Opener = Callable[[str], RasterSource]


@dataclass(frozen=True)
class Wanted:
    """One band a model reads from an Item.

    Attributes:
        label: The band's description in the stack (what the model's processor selects).
        match: The name looked up among the Item's assets and bands.
    """

    label: str
    match: str


def wanted_bands(selectors: Sequence[int | str] | None) -> list[Wanted] | None:
    """The bands to read from an Item for a model's band selectors (``None``: every band).

    A selector that is a band role (``NIR_NARROW``) is looked up as its common name (``nir08``).

    Raises:
        BandMismatchError: positional selectors (an Item's bands have no positions).
    """
    if selectors is None:
        return None
    if any(not isinstance(s, str) or s.lstrip("-").isdecimal() for s in selectors):
        shown = ", ".join(map(str, selectors))
        raise BandMismatchError(
            f"the model selects bands by position ({shown}), and a STAC Item's bands have no "
            "positions; choose them by name (e.g. --bands B04,B03,B02)"
        )
    return [Wanted(str(s), ROLE_COMMON_NAMES.get(str(s).upper(), str(s))) for s in selectors]


def roles_for(selectors: Sequence[int | str] | None, roles: Sequence[str] | None) -> bool:
    """Whether positional ``selectors`` can be read from an Item by the model's ``roles``."""
    return (
        selectors is not None
        and roles is not None
        and len(roles) == len(selectors)
        and any(not isinstance(s, str) or s.lstrip("-").isdecimal() for s in selectors)
    )


def _norm(name: str) -> str:
    """A band name for matching: lower case, ``B04`` the same as ``B4``."""
    return re.sub(r"^([a-z]+)0+(?=\d)", r"\1", name.strip().lower())


def select_bands(
    item: StacItem, wanted: Sequence[Wanted] | None, partial: bool = False
) -> list[tuple[Wanted, AssetBand]]:
    """The Item's band for each wanted one, in order (``None``: every GeoTIFF data band).

    With ``partial`` a wanted band the Item lacks is left out (at least one must be there).

    Raises:
        BandMismatchError: a band the Item lacks; InputError: one that several assets hold,
        or that only a non-GeoTIFF asset holds.
    """
    bands = item.bands()
    if wanted is None:
        data = [b for b in bands if b.geotiff and _is_data(item, b.asset)]
        if not data:
            raise InputError(f"{item.name}: no GeoTIFF data asset")
        return [(Wanted(b.label, b.label), b) for b in data]
    out = []
    for w in wanted:
        hit = _find(item, bands, w)
        if hit is not None:
            out.append((w, hit))
        elif not partial:
            raise BandMismatchError(f"{item.name}: no band {w.label!r} ({_listing(bands)})")
    if not out:
        names = ", ".join(w.label for w in wanted)
        raise BandMismatchError(f"{item.name}: none of the bands {names} ({_listing(bands)})")
    return out


def _find(item: StacItem, bands: Sequence[AssetBand], w: Wanted) -> AssetBand | None:
    key = _norm(w.match)
    tiers = (
        [b for b in bands if b.single and _norm(b.asset) == key],
        [b for b in bands if b.name and _norm(b.name) == key],
        [b for b in bands if b.common_name and _norm(b.common_name) == key],
    )
    hits = next((t for t in tiers if t), [])
    readable = [b for b in hits if b.geotiff]
    if len(readable) == 1:
        return readable[0]
    if len(readable) > 1:
        assets = ", ".join(repr(b.asset) for b in readable)
        raise InputError(f"{item.name}: band {w.label!r} is in several assets ({assets})")
    if hits:
        raise InputError(
            f"{item.name}: band {w.label!r} is in asset {hits[0].asset!r}, which is "
            f"{hits[0].media_type or 'not a GeoTIFF'}; only GeoTIFF assets are read"
        )
    return None


def _is_data(item: StacItem, key: str) -> bool:
    roles = item.data["assets"][key].get("roles")
    return not isinstance(roles, list) or not roles or "data" in roles


def _listing(bands: Sequence[AssetBand]) -> str:
    shown = []
    for b in bands:
        if b.geotiff:
            extra = f" ({b.common_name})" if b.common_name and b.common_name != b.label else ""
            shown.append(f"{b.label}{extra}")
    return f"its GeoTIFF bands are {', '.join(shown)}" if shown else "it has no GeoTIFF bands"


def open_item(
    item: StacItem,
    wanted: Sequence[Wanted] | None,
    opener: Opener,
    threads: int = 1,
    partial: bool = False,
) -> StackedSource:
    """The wanted bands of ``item`` as one stack on the finest of their grids.

    ``opener`` opens one file (a path or an http(s) URL) as a raster input, through the
    allowed drivers. The stack's band descriptions are the wanted labels, its date the Item's.

    Raises:
        GeoServeError: a subclass naming the Item, the asset and its file.
    """
    picked = select_bands(item, wanted, partial)
    runs: list[list[tuple[Wanted, AssetBand]]] = []
    for pair in picked:  # one part per run of bands of the same file
        if runs and runs[-1][-1][1].asset == pair[1].asset and pair[1].band is not None:
            runs[-1].append(pair)
        else:
            runs.append([pair])
    if len(runs) > MAX_ITEM_FILES:
        raise InputError(f"{item.name}: {len(runs)} files to read; at most {MAX_ITEM_FILES}")
    parts: list[RasterSource] = []
    selection: list[list[int]] = []
    labels: list[str | None] = []
    try:
        for run in runs:
            part, bands, names = _open_asset(item, run, opener, whole=wanted is None)
            parts.append(part)
            selection.append(bands)
            labels.extend(names)
            # the request's size guard, file by file: not only once all of them are open
            add_pixels(f"{item.name}: asset {run[0][1].asset!r}", part.read_cost(bands))
        grid = _finest(parts)
        how = ["nearest" if run[0][1].categorical else "bilinear" for run in runs]
        for i, resampling in enumerate(how):
            try:
                parts[i] = align(parts[i], grid, resampling, threads)  # (it owns the file)
            except GeoServeError as exc:
                raise prefixed(exc, f"{item.name}: asset {runs[i][0][1].asset!r}") from None
        stack = StackedSource(parts, item.name, selection, how)
    except BaseException:
        for part in parts:
            part.close()
        raise
    stack.info = dataclasses.replace(stack.info, descriptions=tuple(labels), date=item.date)
    return stack


def _open_asset(
    item: StacItem, run: Sequence[tuple[Wanted, AssetBand]], opener: Opener, whole: bool
) -> tuple[RasterSource, list[int], list[str | None]]:
    """One file opened: the source, its bands to stack and their labels.

    An asset whose bands the Item does not list is read whole when every band is wanted,
    else it must hold one band.
    """
    first = run[0][1]
    what = f"{item.name}: asset {first.asset!r}"
    try:
        src = opener(first.href)
    except GeoServeError as exc:
        raise prefixed(exc, what) from None
    info = src.info
    try:
        if first.band is None:
            if whole:
                bands = list(range(info.count))
                names = [first.asset] if info.count == 1 else [
                    f"{first.asset}:{d or f'band_{b + 1}'}" for b, d in enumerate(info.descriptions)
                ]  # fmt: skip
                return _with_nodata(src, first), bands, list(names)
            if info.count != 1:
                raise BandMismatchError(
                    f"{what}: {info.name} has {count(info.count, 'band')} and the Item does "
                    "not name them; select a band the Item names"
                )
            return _with_nodata(src, first), [0], [run[0][0].label]
        need = max(b.band or 0 for _, b in run) + 1
        if info.count < need:
            raise BandMismatchError(
                f"{what}: the Item lists {count(need, 'band')}, but {info.name} has "
                f"{count(info.count, 'band')}"
            )
    except BaseException:
        src.close()
        raise
    return _with_nodata(src, first), [b.band or 0 for _, b in run], [w.label for w, _ in run]


def _with_nodata(src: RasterSource, band: AssetBand) -> RasterSource:
    """The Item's nodata value on a file that declares none."""
    info = src.info
    if info.nodata is None and band.nodata is not None:
        src.info = dataclasses.replace(
            info, nodata=band.nodata, profile={**info.profile, "nodata": band.nodata}
        )
    return src


def _finest(parts: Sequence[RasterSource]) -> TargetGrid:
    """The grid of the part with the smallest pixels (in the first part's CRS; ties: first)."""
    first = parts[0].info
    best, area = first, abs(first.transform.a * first.transform.e)
    for part in parts[1:]:
        info = part.info
        size = abs(info.transform.a * info.transform.e)
        if info.crs == first.crs and info.is_georeferenced and size < area:
            best, area = info, size
    return TargetGrid.of(best)
