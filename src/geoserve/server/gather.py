"""A request's inputs as the engine takes them: uploads parsed, paths and URLs vetted.

A request's ``data`` is one input, a list (the dates of one place), or a dict of modalities
(``{"s2": ..., "s1": [...]}``), each value one input or a list of dates. Whatever the shape,
every path goes through :func:`~geoserve.server.inputs.resolve_input_path` and every URL through
the URL guards (:func:`~geoserve.server.inputs.remote_input`) before the engine sees it; base64
is decoded later, off the event loop.

A multipart upload carries its files as parts named ``file`` (one input, or the dates of one
place) or as one part per modality, named after it (``s2``, ``s1``; the same name twice gives
that modality's dates).
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from starlette.datastructures import FormData
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request

from geoserve.errors import ForbiddenInputError, InputError
from geoserve.raster.budget import OpenBudget
from geoserve.raster.source import DataFormat, NamedBytes, RasterLike
from geoserve.raster.stac_item import MAX_ITEM_BYTES, StacItem, is_stac_input
from geoserve.server.api_models import (
    MAX_MODALITIES,
    MODALITY_PATTERN,
    ImagesRequest,
    form_dates,
    form_json,
    validate,
)
from geoserve.server.inputs import (
    check_remote_file,
    check_url,
    fetch_url,
    remote_input,
    resolve_input_path,
)
from geoserve.server.settings import ServerSettings
from geoserve.stac_query import StacSearch

_MODALITY = re.compile(MODALITY_PATTERN)

#: Multipart text fields; any other part is an input.
FORM_FIELDS = frozenset({"out_data_format", "options", "priority", "dates", "model"})

#: One request's inputs: a list (dates) or a dict of modality name to its list of dates.
Items = list[Any] | dict[str, list[Any]]


def as_items(data: Any) -> Items:
    """A request's ``data`` as a list of inputs, or a dict of modality name to a list."""
    if isinstance(data, Mapping):
        return {k: list(v) if isinstance(v, list | tuple) else [v] for k, v in data.items()}
    return list(data) if isinstance(data, list | tuple) else [data]


def count_items(items: Items) -> int:
    """How many inputs (files, URLs, strings) a request names."""
    if isinstance(items, dict):
        return sum(len(v) for v in items.values())
    return len(items)


def open_budget(settings: ServerSettings, deadline: float) -> OpenBudget:
    """A request's allowance for opening its inputs (see :mod:`geoserve.raster.budget`)."""
    s = settings
    mb = s.max_remote_mb if s.max_remote_mb is not None else s.max_body_mb
    return OpenBudget(
        deadline,
        max_requests=s.max_remote_requests,
        max_bytes=int(mb * 1024 * 1024),
        max_pixels=s.max_pixels,
        timeout_s=s.request_timeout_s,
    )


async def gather(
    settings: ServerSettings,
    items: Items,
    data_format: str,
    deadline: float,
    budget: OpenBudget | None = None,
) -> tuple[list[RasterLike] | dict[str, list[RasterLike]], DataFormat]:
    """Apply the path/URL guards to every input, keeping the request's shape.

    Every URL of the request is checked before any is fetched: a request naming one host
    that is not allowed makes no connection at all. ``budget``: the request's remote budget
    (:mod:`geoserve.raster.budget`), charged each request made to a host and its bytes.
    """
    if isinstance(items, list) and any(isinstance(x, StacSearch) for x in items):
        searches: list[Any] = [search_guarded(settings, x) for x in items]  # (run on open)
        return searches, "auto"
    if data_format == "url":
        for values in items.values() if isinstance(items, dict) else [items]:
            for url in values:
                check_url(url, settings.allowed_url_domains)
    seen = _Items()
    if isinstance(items, dict):
        out: dict[str, list[RasterLike]] = {}
        fmt: DataFormat = "auto"
        for name, values in items.items():
            out[name], fmt = await _gather_list(
                settings, values, data_format, deadline, seen, budget
            )
        return out, fmt
    return await _gather_list(settings, items, data_format, deadline, seen, budget)


#: Most STAC Items one request may name (each is read whole, at most MAX_ITEM_BYTES).
MAX_STAC_ITEMS = 8


class _Items:
    """Counts the STAC Items of one request."""

    def __init__(self) -> None:
        self.n = 0

    def add(self, where: str) -> None:
        self.n += 1
        if self.n > MAX_STAC_ITEMS:
            raise InputError(f"{where}: more than {MAX_STAC_ITEMS} STAC Items in one request")


async def _gather_list(
    s: ServerSettings,
    items: list[Any],
    data_format: str,
    deadline: float,
    seen: _Items,
    budget: OpenBudget | None,
) -> tuple[list[RasterLike], DataFormat]:
    if data_format == "bytes":
        return list(items), "bytes"
    if data_format == "path":
        paths: list[Any] = []  # (files, or STAC Items)
        for p in items:
            path = resolve_input_path(p, s.allowed_input_dirs)
            if is_stac_input(path):  # an Item under an allowed directory: its files vetted too
                seen.add(p)
                paths.append(await asyncio.to_thread(StacItem.read, path, vet=stac_guard(s)))
            else:
                paths.append(path)
        return paths, "path"
    if data_format == "url":
        limit = int(s.max_body_mb * 1024 * 1024)
        data: list[Any] = []  # (/vsicurl/ URLs, downloaded bytes, STAC Items)
        for u in items:
            left = deadline - time.monotonic()
            if is_stac_input(u):  # an Item's JSON: fetched (no redirects, capped), then vetted
                seen.add(u)
                cap = min(limit, MAX_ITEM_BYTES)
                raw = await fetch_url(u, s.allowed_url_domains, cap, left, budget)
                item = await asyncio.to_thread(StacItem.parse, raw, u, stac_guard(s))
                data.append(item)
            elif s.url_reads == "range":
                fmts = s.engine.allowed_formats
                data.append(
                    await remote_input(u, s.allowed_url_domains, limit, left, fmts, budget=budget)
                )
            else:
                data.append(await fetch_url(u, s.allowed_url_domains, limit, left, budget))
        return data, "auto"  # /vsicurl/ paths and downloaded bytes
    return list(items), "b64"


def search_guarded(s: ServerSettings, search: Any) -> StacSearch:
    """A client's STAC search under the server's rules, or refused now, before any connection.

    The catalogue must be at an ``--allowed-url-domain`` (every page of results too), and each
    file its Items name passes :func:`stac_guard` before it is opened.

    Raises:
        ForbiddenInputError: the catalogue's host is not allowed (or URL inputs are off).
        InputError: a search among other inputs.
    """
    if not isinstance(search, StacSearch):
        raise InputError("stac: a STAC search is the request's only input")
    check_url(search.url, s.allowed_url_domains)

    def vet_api(url: str) -> None:
        check_url(url, s.allowed_url_domains)

    return search.with_guards(vet_api, stac_guard(s))


def stac_guard(s: ServerSettings) -> Callable[[str], str]:
    """The check every file a client's STAC Item names must pass before it is opened.

    A local file must lie under an ``--allowed-input-dir`` (resolved, like a path input); a
    URL must be to an ``--allowed-url-domain`` and pass the checks of a URL input (no
    redirect, byte ranges, an allowed format) before GDAL reads it in place (a server that
    downloads its URL inputs, ``--url-reads download``, refuses Item URLs: GDAL would reach
    the network itself).
    """

    def vet(href: str) -> str:
        if href.startswith(("http://", "https://")):
            check_url(href, s.allowed_url_domains)
            if s.url_reads != "range":
                raise ForbiddenInputError(
                    f"{href}: a STAC Item's files are read in place, and this server takes "
                    "URL inputs only by downloading them (--url-reads download)"
                )
            # as a URL input: no redirect, byte ranges, not another format
            return check_remote_file(href, s.allowed_url_domains, s.engine.allowed_formats)
        return resolve_input_path(href, s.allowed_input_dirs)

    return vet


async def read_form(request: Request) -> FormData:
    """A multipart body's parts, its files held in memory: nothing is written to disk.

    (Starlette's ``request.form()`` moves a file part over 1 MB into a temporary file. The
    body is already bounded by ``--max-body-mb`` and counted against the memory bound as it
    streams in, and every upload is read into memory next: the temporary file would only add
    a write and a read, each from a thread, and a write outside ``--output-dir``.)
    """
    parser = MultiPartParser(request.headers, request.stream())
    parser.spool_max_size = sys.maxsize  # (a part never rolls over to a file)
    try:
        return await parser.parse()
    except MultiPartException as exc:
        raise InputError(f"malformed multipart upload: {exc.message}") from None


async def parse_multipart(request: Request) -> tuple[ImagesRequest, Items]:
    """The upload's options and its files, named by their parts' file names.

    Files come as ``file`` parts, or as one part per modality (the part's name). A part's file
    name is client text: it names the upload in messages, never a path. Form field ``dates``
    is for ``file`` parts only (modality parts: an :class:`InputError`).
    """
    form = await read_form(request)
    plain: list[NamedBytes] = []
    modal: dict[str, list[NamedBytes]] = {}
    for field, part in form.multi_items():
        if field in FORM_FIELDS:
            continue
        if isinstance(part, str):
            raise InputError(f"{field!r} must be a file part, not a text field")
        n = len(plain) if field == "file" else len(modal.get(field, ()))
        upload = NamedBytes(await part.read(), part.filename or f"{field} part {n}")
        await part.close()  # (its buffer let go now: the bytes are the one copy kept)
        if not upload.data:
            raise InputError(f"{field!r} part {n} ({upload.shown}) is empty")
        if field == "file":
            plain.append(upload)
        elif not _MODALITY.fullmatch(field):
            raise InputError(f"part name {field[:40]!r} is not a modality name")
        else:
            modal.setdefault(field, []).append(upload)
            if len(modal) > MAX_MODALITIES:
                raise InputError(f"more than {MAX_MODALITIES} modalities in one upload")
    if plain and modal:
        raise InputError(
            "multipart upload mixes 'file' parts with modality parts "
            f"({', '.join(modal)}); send one or the other"
        )
    if not plain and not modal:
        raise InputError(
            "multipart upload needs one or more 'file' parts, or one part per modality"
        )
    dates = form_dates(form.getlist("dates"))
    if modal and dates is not None:
        raise InputError(
            "form field 'dates' applies to 'file' parts; with modality parts the dates "
            "come from each file's tags or name (or send JSON with a dict of dates)"
        )
    body = validate(
        ImagesRequest,
        {
            "data": "<upload>",
            "out_data_format": form.get("out_data_format") or "geotiff",
            "options": form_json(form.get("options")),
            "priority": form.get("priority") or 0,
            "dates": dates,
            "model": form.get("model") or None,
        },
    )
    return body, (modal if modal else list(plain))
