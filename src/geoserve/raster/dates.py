"""Acquisition dates a caller gives with its inputs, and dates read from file names.

A multi-date model needs the date of every input. It comes, first match wins, from:

1. an explicit date given with the request (``dates=`` in Python, ``--dates`` on the CLI, a
   ``dates`` field over HTTP, or a date stamp in an uploaded part's file name);
2. a date tag in the file (see :data:`geoserve.raster.coords.DATE_TAGS`);
3. a ``YYYYMMDDTHHMMSS`` or ``YYYYDDDTHHMMSS`` stamp in the file name (the HLS and Sentinel-2
   naming conventions).

Explicit dates are ISO 8601 strings (``2020-06-01``, ``2020-06-01T10:21:01Z``; the date part
is used as written, without converting time zones), :class:`datetime.date` or
:class:`datetime.datetime` objects. ``None`` for an input means "none given": its tags and
file name are used.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Sequence
from typing import Any

from geoserve.errors import InputError

#: One explicit date: an ISO 8601 string, a date or a datetime (``None``: none given).
DateLike = str | dt.date | None

_NAME_STAMP = re.compile(r"(?<!\d)(\d{8}|\d{7})T\d{6}")
_MAX_NAME = 255  # characters of an untrusted file name looked at


def name_date(name: str) -> dt.date | None:
    """The date of a ``YYYYMMDDTHHMMSS`` / ``YYYYDDDTHHMMSS`` stamp in a file name, if any.

    Only the last path component is searched, and only as text: ``name`` may come from a
    client (an upload's part file name) and is never used as a path.
    """
    base = re.split(r"[/\\]", name[-_MAX_NAME:])[-1]
    stamp = _NAME_STAMP.search(base)
    if stamp is None:
        return None
    text = stamp.group(1)
    try:
        fmt = "%Y%m%d" if len(text) == 8 else "%Y%j"
        return dt.datetime.strptime(text, fmt).date()
    except ValueError:
        return None


def parse_date(value: Any, field: str) -> dt.date:
    """One explicit date as a :class:`datetime.date`.

    Raises:
        InputError: naming ``field`` and the value, if it is not a date.
    """
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, dt.date):
        return value
    if isinstance(value, str):
        text = value.strip()
        if text[-1:] in ("Z", "z"):  # UTC, which Python < 3.11 does not parse
            text = text[:-1] + "+00:00"
        try:
            return dt.datetime.fromisoformat(text).date()
        except ValueError:
            pass
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    raise InputError(f"{field}: {shown} is not a date (use ISO 8601, e.g. 2020-06-01)")


def request_dates(
    dates: DateLike | Sequence[DateLike] | None, count: int, field: str = "dates"
) -> list[dt.date | None] | None:
    """The explicit dates of one request of ``count`` inputs, one per input, checked.

    A single date (not in a list or tuple) stands for a request of one input.

    Raises:
        InputError: naming ``field``: the wrong number of dates, or one that is not a date.
    """
    if dates is None:
        return None
    values: list[Any] = [dates]
    if isinstance(dates, Iterable) and not isinstance(dates, str | bytes | dt.date | dict):
        values = list(dates)
    if len(values) != count:
        raise InputError(
            f"{field}: {len(values)} date(s) given for {count} input(s); give one per input"
        )
    return [None if v is None else parse_date(v, field) for v in values]


def dates_per_item(
    items: Sequence[Any], dates: Sequence[Any] | None, field: str = "dates"
) -> list[Any]:
    """Split the dates of several requests into one entry per request.

    ``items`` are the requests' inputs (a list or tuple is the dates of one place). ``dates``
    is either flat, one date per input raster in order (``[d1, d2, d3]`` for
    ``[[a, b], c]``), or nested like ``items`` (``[[d1, d2], d3]``).

    Raises:
        InputError: naming ``field``, if the number of dates does not match.
    """
    if dates is None:
        return [None] * len(items)
    if isinstance(dates, str | dt.date):
        dates = [dates]
    if not isinstance(dates, list | tuple):
        raise InputError(f"{field}: {type(dates).__name__} given; give a list of dates")
    sizes = [len(i) if isinstance(i, list | tuple) else 1 for i in items]
    if any(isinstance(d, list | tuple) for d in dates):  # nested like items
        if len(dates) != len(items):
            raise InputError(
                f"{field}: {len(dates)} entries given for {len(items)} request(s); give one "
                "per request (a list of dates for a request of several dates)"
            )
        return list(dates)
    if len(dates) != sum(sizes):
        raise InputError(
            f"{field}: {len(dates)} date(s) given for {sum(sizes)} input(s); give one per input"
        )
    out, start = [], 0
    for item, size in zip(items, sizes, strict=True):
        chunk = list(dates[start : start + size])
        out.append(chunk if isinstance(item, list | tuple) else chunk[0])
        start += size
    return out
