"""Which bands of a raster make its true-colour picture, and how far to stretch them.

Shared by the CLI's quicklook PNG (:mod:`geoserve.quicklook`) and the map's input tiles
(:mod:`geoserve.tiles`), so both draw the same picture. Which bands, in this order of
preference:

1. the file's band descriptions: B4/B3/B2, B04/B03/B02 or RED/GREEN/BLUE (any case);
2. the model's band roles (``GeoTiffPatcher(band_roles=...)``: which selected band is RED,
   GREEN, BLUE), for files whose bands have no descriptions;
3. Sentinel-2 L1C stack positions (bands 4, 3, 2) for 13-band files;
4. otherwise bands 1, 2, 3 as red, green, blue, not called true colour; band 1 in grey for
   files with fewer than three bands.

Each band is stretched between its 2nd and 98th percentile.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from geoserve.raster.source import RasterInfo

_RGB_NAMES = (("B4", "B3", "B2"), ("B04", "B03", "B02"), ("RED", "GREEN", "BLUE"))
_RGB = "red, green, blue"


def choose_bands(info: RasterInfo, roles: Mapping[int, str] | None = None) -> tuple[list[int], str]:
    """The 0-based bands of raster ``info`` to draw, and a few words saying which they are.

    Three bands are drawn as red, green, blue; one in grey. ``roles`` maps 0-based band
    indices to what the model says they are (``"RED"``, ...). The words number bands from 1,
    as GIS tools do.
    """
    names = [(d or "").upper() for d in info.descriptions]
    for triple in _RGB_NAMES:
        if all(n in names for n in triple):
            bands = [names.index(n) for n in triple]
            shown = ", ".join(str(info.descriptions[b]) for b in bands)
            return bands, f"true colour: {_RGB} = {shown}"
    by_role = {role.upper(): i for i, role in (roles or {}).items()}
    if all(r in by_role for r in ("RED", "GREEN", "BLUE")):
        bands = [by_role["RED"], by_role["GREEN"], by_role["BLUE"]]
        return bands, f"true colour: {_RGB} = bands {_listed(bands)} (the model's band roles)"
    if info.count == 13:  # Sentinel-2 L1C stack B1..B8, B8A, B9..B12
        return [3, 2, 1], f"true colour: {_RGB} = bands 4, 3, 2 (Sentinel-2 band order)"
    if info.count >= 3:
        return [0, 1, 2], f"bands 1, 2, 3 as {_RGB} (bands not named)"
    return [0], "band 1 in grey"


def _listed(bands: list[int]) -> str:
    return ", ".join(str(b + 1) for b in bands)


def stretch_limits(bands: np.ma.MaskedArray[Any, Any]) -> list[tuple[float, float]]:
    """Each band's 2nd and 98th percentile over its unmasked pixels ((0, 1) when none)."""
    limits = []
    for band in bands.astype(np.float64):
        values = band.compressed()
        lo, hi = np.percentile(values, (2, 98)) if values.size else (0.0, 1.0)
        limits.append((float(lo), float(hi)))
    return limits
