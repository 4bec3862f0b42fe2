"""Multimodal requests on the command line: ``-i NAME=SOURCE``, ``--dates NAME=DATE``.

Also how each modality lands on the model's grid (``geoserve info``, the ``predict`` summary).
All the ``-i`` of one command form one request: a dict of modality name to its sources, in the
order given; a name given again adds a date of that modality. Nothing here imports torch or
rasterio at import time (the parser uses :func:`modality_input` for ``--help`` and errors).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: Metres per degree of latitude (for a geographic input's approximate pixel size).
_M_PER_DEG = 111_320.0


def modality_input(text: str) -> tuple[str, str]:
    """``-i NAME=SOURCE`` as (name, source): argparse's type, a usage error naming ``text``."""
    name, sep, source = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected NAME=SOURCE, a modality and its file (e.g. s2=scene.tif)"
        )
    if not name:
        raise argparse.ArgumentTypeError(f"{text!r}: empty modality name; expected NAME=SOURCE")
    if not name.isidentifier():
        raise argparse.ArgumentTypeError(
            f"{text!r}: invalid modality name {name!r}; use letters, digits and '_' (e.g. s2)"
        )
    if not source:
        raise argparse.ArgumentTypeError(f"{text!r}: empty source; expected NAME=SOURCE")
    return name, source


def request_of(pairs: Sequence[tuple[str, str]]) -> dict[str, str | list[str]]:
    """The ``-i`` pairs as one request: name -> its source, or its sources (dates) in order."""
    grouped: dict[str, list[str]] = {}
    for name, source in pairs:
        grouped.setdefault(name, []).append(source)
    return {name: srcs[0] if len(srcs) == 1 else srcs for name, srcs in grouped.items()}


def sources_of(request: dict[str, Any]) -> list[tuple[str, str]]:
    """(modality, source) for every source of a request, in order."""
    return [
        (name, src)
        for name, value in request.items()
        for src in (value if isinstance(value, list) else [value])
    ]


def dates_of(text: str, request: dict[str, Any]) -> dict[str, list[Any]]:
    """``--dates s2=2020-06-01,s1=2020-06-03`` with ``-i``: each modality's dates, in order.

    A modality left out takes its dates from its tags or file names; one named must get one
    date per source it was given.

    Raises:
        InputError: an item that is not NAME=DATE, a name not given with ``-i``, a bad date or
        the wrong number of dates (naming ``--dates``).
    """
    from geoserve.errors import InputError
    from geoserve.raster.dates import request_dates

    grouped: dict[str, list[str]] = {}
    for item in text.split(","):
        name, sep, date = item.strip().partition("=")
        if not sep:
            raise InputError(
                f"--dates: {item!r}: with -i give NAME=DATE for each date "
                f"(e.g. --dates {next(iter(request))}=2020-06-01)"
            )
        if name not in request:
            raise InputError(
                f"--dates: {item!r}: no modality {name!r} given with -i ({', '.join(request)})"
            )
        grouped.setdefault(name, []).append(date.strip())
    out: dict[str, list[Any]] = {}
    for name, dates in grouped.items():
        value = request[name]
        count = len(value) if isinstance(value, list) else 1
        out[name] = list(request_dates(dates, count, f"--dates {name}") or [])
    return out


@dataclass(frozen=True)
class Reference:
    """Which grid the model sees for a request: a modality's, or a fixed CRS / resolution."""

    name: str  # the modality whose grid (or extent, with crs / resolution) it is
    crs: str | None = None
    resolution: float | None = None

    def label(self) -> str:
        """``the grid of s2`` or ``EPSG:32633 at 10 over s2``."""
        if self.crs is None and self.resolution is None:
            return f"the grid of {self.name}"
        at = f" at {self.resolution:g}" if self.resolution is not None else ""
        return f"{self.crs or 'the CRS of ' + self.name}{at} over {self.name}"


def reference_of(in_proc: Any, names: Sequence[str]) -> Reference:
    """The reference of a request of modalities ``names`` for the model's input processor.

    As the processors decide it: a multimodal one's ``reference`` when given in the request,
    else the first of its declared modalities the request gives (with its fixed ``crs`` and
    ``resolution``, if any); any other processor stacks the modalities on the first one's grid.
    """
    ref = in_proc.reference_modality(list(names))
    return Reference(ref, getattr(in_proc, "crs", None), getattr(in_proc, "resolution", None))


def resampling_of(in_proc: Any, name: str) -> str:
    """How modality ``name`` is resampled onto the reference grid."""
    return str(in_proc.resampling_of(name))


# -- words for grids ---------------------------------------------------------------------------


def crs_name(crs: Any) -> str:
    """``EPSG:32633``, or the CRS's own text (shortened); ``no CRS`` for none."""
    if crs is None:
        return "no CRS"
    epsg = crs.to_epsg()
    return f"EPSG:{epsg}" if epsg else crs.to_string()[:40]


def _num(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def pixel_size(crs: Any, transform: Any, height: int) -> str:
    """A pixel's size in words: ``10 m``, ``10 x 20 m``, ``~20 m`` for degrees (approximate)."""
    sx, sy = abs(transform.a), abs(transform.e)
    if crs is None:
        return f"{_num(sx)} x {_num(sy)} (no units)"
    approx = ""
    unit = "m"
    if crs.is_geographic:
        lat = transform.f + transform.e * height / 2
        sx, sy = sx * _M_PER_DEG * math.cos(math.radians(lat)), sy * _M_PER_DEG
        approx = "~"
    else:
        units = (crs.linear_units or "").lower()
        if units not in ("metre", "meter", "m", ""):
            unit = units
    if abs(sx - sy) <= 0.05 * max(sx, sy):
        return f"{approx}{_num((sx + sy) / 2)} {unit}"
    return f"{approx}{_num(sx)} x {_num(sy)} {unit}"


def alignment(info: Any, grid: Any, resampling: str) -> str:
    """How an input is put on the reference grid, in words (with the share of it covered)."""
    if grid.matches(info):
        return "on the reference grid (read as is)"
    if info.crs is None or grid.crs is None:
        return "cannot be aligned: not georeferenced and not on the reference grid"
    words = (
        f"warped from {crs_name(info.crs)} {pixel_size(info.crs, info.transform, info.height)}"
        f" to {crs_name(grid.crs)} {pixel_size(grid.crs, grid.transform, grid.height)}, "
        f"{resampling}"
    )
    share = grid.coverage(info)
    if share == 0:
        words += ", covers none of the reference grid (its footprint lies outside it)"
    elif share is not None:
        percent = "<1" if share < 0.005 else f"{share * 100:.0f}"
        words += f", covers {percent} % of the reference grid"
    return words
