"""Band selection: band selectors (0-based indices or band descriptions) to band indices."""

from __future__ import annotations

from collections.abc import Sequence

from geoserve.errors import BandMismatchError, count
from geoserve.raster.source import RasterInfo


def resolve_bands(info: RasterInfo, bands: Sequence[int | str] | None) -> list[int]:
    """Turn band selectors (0-based indices or band descriptions) into 0-based indices.

    Raises:
        BandMismatchError: an index out of range, or a name no band carries.
    """
    if bands is None:
        return list(range(info.count))
    names = [d.lower() if d else None for d in info.descriptions]
    out: list[int] = []
    for sel in bands:
        if isinstance(sel, str) and not sel.lstrip("-").isdecimal():
            try:
                out.append(names.index(sel.lower()))
            except ValueError:
                known = [d for d in info.descriptions if d]
                listing = (
                    f"its bands are {', '.join(known)}"
                    if known
                    else "its bands have no descriptions; select them by 0-based index"
                )
                raise BandMismatchError(f"{info.name}: no band named {sel!r} ({listing})") from None
        else:
            idx = int(sel)
            if not 0 <= idx < info.count:
                raise BandMismatchError(
                    f"{info.name} has {count(info.count, 'band')}; band index {idx} (0-based) "
                    "does not exist"
                )
            out.append(idx)
    return out
