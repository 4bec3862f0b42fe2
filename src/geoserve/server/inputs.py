"""Turning what a client sends into engine inputs, with the server's guards applied.

Paths and URLs are refused unless the operator allowed them. A path is resolved first (``..``
collapsed, symlinks followed) and must then lie under an allowed directory; the *resolved* path
is what gets opened. Percent-encoded and ``file://`` paths are refused outright. A URL must be
http(s) to an allowed host; redirects are not followed (each hop would need the same check) and
the download stops at the body limit.

A URL whose server answers a redirect-free ``HEAD`` with ``Accept-Ranges: bytes`` is not
downloaded: it is read in place through GDAL's ``/vsicurl/``, one window of rows at a time, so a
large Cloud-Optimized GeoTIFF never has to fit in the server's memory (``--url-reads download``
turns this off). GDAL itself would follow a redirect if the host started sending one after the
check; the host is on the operator's allow-list, so it is trusted not to.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import unquote, urlsplit

import httpx

from geoserve.errors import (
    ForbiddenInputError,
    InputError,
    PayloadTooLargeError,
    RequestTimeoutError,
)
from geoserve.raster.budget import OpenBudget, current
from geoserve.raster.trust import DEFAULT_INPUT_FORMATS, refuse_other_formats


def resolve_input_path(text: str, roots: Sequence[Path]) -> str:
    """The resolved path of a client-named input, if it lies under an allowed root.

    Raises:
        ForbiddenInputError: path inputs are off, or the path escapes every allowed root.
    """
    if not roots:
        raise ForbiddenInputError(
            "path inputs are disabled on this server (start it with --allowed-input-dir DIR)"
        )
    if "\x00" in text or not text.strip():
        raise ForbiddenInputError(f"invalid path {text!r}")
    if "://" in text or text.lower().startswith("file:"):
        raise ForbiddenInputError(f"{text}: path inputs take a file path, not a URL")
    if unquote(text) != text:
        raise ForbiddenInputError(f"{text}: percent-encoded paths are not accepted")
    candidate = Path(text)
    if not candidate.is_absolute():
        candidate = roots[0] / candidate
    resolved = candidate.resolve()
    for root in roots:
        if resolved.is_relative_to(root.resolve()):
            return str(resolved)
    raise ForbiddenInputError(f"{text}: outside the allowed input directories")


def check_url(url: str, domains: Sequence[str]) -> None:
    """Refuse URLs that are not http(s) to an allowed host.

    Raises:
        ForbiddenInputError: URL inputs are off, or the scheme or host is not allowed.
    """
    if not domains:
        raise ForbiddenInputError(
            "url inputs are disabled on this server (start it with --allowed-url-domain HOST)"
        )
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ForbiddenInputError(f"{url}: only http and https URLs are accepted")
    host = (parts.hostname or "").lower()
    if host not in {d.lower() for d in domains}:
        raise ForbiddenInputError(f"{url}: host {host!r} is not an allowed URL domain")
    if parts.username or parts.password:
        raise ForbiddenInputError(f"{url}: credentials in URLs are not accepted")


#: Per-operation limits of the server's own HTTP client (connect, and each read or write);
#: the whole transfer is bounded by the request's deadline on top of these.
HTTP_TIMEOUT = httpx.Timeout(10.0, connect=5.0)


async def fetch_url(
    url: str,
    domains: Sequence[str],
    max_bytes: int,
    deadline_s: float = 60.0,
    budget: OpenBudget | None = None,
) -> bytes:
    """Download an allowed URL, at most ``max_bytes``, without following redirects.

    The whole download must finish within ``deadline_s`` (a source that trickles bytes does
    not keep the request alive); cancelling the awaiting task (the client left, the server
    drains) stops it at once. ``budget``: the request's, charged the GET and every byte.

    Raises:
        ForbiddenInputError: see :func:`check_url`; InputError: HTTP or network failure;
        PayloadTooLargeError: the body exceeds ``max_bytes``; RequestTimeoutError: too slow.
    """
    check_url(url, domains)
    if budget is not None:
        budget.charge(url)
    try:
        return await asyncio.wait_for(_download(url, max_bytes, budget), max(deadline_s, 0.001))
    except TimeoutError:
        raise RequestTimeoutError(
            f"{url}: the download did not finish within {deadline_s:.0f} s"
        ) from None


async def _download(url: str, max_bytes: int, budget: OpenBudget | None) -> bytes:
    chunks: list[bytes] = []
    size = 0
    try:
        async with (
            httpx.AsyncClient(follow_redirects=False, timeout=HTTP_TIMEOUT) as client,
            client.stream("GET", url) as resp,
        ):
            if resp.is_redirect:
                raise ForbiddenInputError(f"{url}: redirects are not followed")
            if resp.status_code != 200:
                raise InputError(f"{url}: HTTP {resp.status_code}")
            async for chunk in resp.aiter_bytes():
                size += len(chunk)
                if size > max_bytes:
                    raise PayloadTooLargeError(f"{url}: larger than {max_bytes} bytes")
                if budget is not None:
                    budget.add_bytes(url, len(chunk))
                chunks.append(chunk)
    except httpx.HTTPError as exc:
        raise InputError(f"{url}: download failed ({type(exc).__name__}: {exc})") from exc
    return b"".join(chunks)


async def remote_input(
    url: str,
    domains: Sequence[str],
    max_bytes: int,
    deadline_s: float = 60.0,
    formats: Sequence[str] = DEFAULT_INPUT_FORMATS,
    headers: dict[str, str] | None = None,
    budget: OpenBudget | None = None,
    download: bool = True,
) -> str | bytes:
    """``/vsicurl/<url>`` if the server supports range reads, else the downloaded bytes.

    ``download=False``: a host that does not answer range requests is refused with
    :class:`~geoserve.errors.InputError` before anything is downloaded (map tiles).

    Before GDAL is given the URL, its first bytes are fetched (one range request, no
    redirects) and content in a format outside ``formats`` is refused unparsed. ``headers``,
    when given, receives the host's answer to the ``HEAD`` (its ETag, say). ``budget``: the
    request's, charged each request and its bytes before it is made.

    Raises:
        As :func:`fetch_url`; InputFormatError: the content is another format (a VRT, say).
    """
    check_url(url, domains)
    t0 = time.monotonic()
    try:
        async with httpx.AsyncClient(follow_redirects=False, timeout=HTTP_TIMEOUT) as client:
            if budget is not None:
                budget.charge(url)
            head = await asyncio.wait_for(client.head(url), max(deadline_s, 0.001))
            if headers is not None:
                headers.update({k.lower(): v for k, v in head.headers.items()})
            ranged = (
                head.status_code == 200 and head.headers.get("accept-ranges", "").lower() == "bytes"
            )
            if ranged:
                if budget is not None:
                    budget.charge(url, 1, SNIFF_BYTES)
                first, head_bytes = await asyncio.wait_for(
                    _first_bytes(client, url), max(deadline_s - (time.monotonic() - t0), 0.001)
                )
    except TimeoutError:
        raise RequestTimeoutError(f"{url}: no answer within {deadline_s:.0f} s") from None
    except httpx.HTTPError as exc:
        raise InputError(f"{url}: request failed ({type(exc).__name__}: {exc})") from exc
    if head.is_redirect or (ranged and first.is_redirect):
        raise ForbiddenInputError(f"{url}: redirects are not followed")
    if ranged and first.status_code in (200, 206):
        refuse_other_formats(url, head_bytes, formats)
        return VSICURL + url
    if not download:
        raise InputError(f"{url}: this needs a server that answers HTTP range requests")
    left = deadline_s - (time.monotonic() - t0)
    return await fetch_url(url, domains, max_bytes, left, budget)


#: Bytes fetched to tell an in-place URL input's format before GDAL opens it.
SNIFF_BYTES = 4096


async def _first_bytes(client: httpx.AsyncClient, url: str) -> tuple[httpx.Response, bytes]:
    """At most :data:`SNIFF_BYTES` of ``url`` (a host that ignores Range is not read on)."""
    got = b""
    async with client.stream("GET", url, headers={"Range": f"bytes=0-{SNIFF_BYTES - 1}"}) as r:
        if not r.is_redirect:
            async for chunk in r.aiter_bytes():
                got += chunk
                if len(got) >= SNIFF_BYTES:
                    break
    return r, got[:SNIFF_BYTES]


#: GDAL's prefix for reading a file over HTTP with range requests.
VSICURL = "/vsicurl/"


def check_remote_file(url: str, domains: Sequence[str], formats: Sequence[str]) -> str:
    """A URL a STAC Item names, checked like a URL input before GDAL reads it in place.

    Synchronous (admission runs in a worker thread): the host must be allowed, answer a
    ``HEAD`` and a first range request without redirecting, serve byte ranges, and the
    content must not be a format outside ``formats``. Each request is charged to the
    request's budget (:func:`geoserve.raster.budget.current`) first, and its timeouts capped
    to the time the request has left.

    Raises:
        ForbiddenInputError: a host not allowed, or a redirect; InputError: no range
        requests, or the host cannot be reached; InputFormatError: another format;
        RequestTimeoutError: past the deadline; PayloadTooLargeError: over the budget.
    """
    check_url(url, domains)
    budget = current()
    timeout = HTTP_TIMEOUT
    if budget is not None:
        budget.charge(url)
        timeout = httpx.Timeout(budget.http_timeout(10.0), connect=budget.http_timeout(5.0))
    try:
        with httpx.Client(follow_redirects=False, timeout=timeout) as client:
            head = client.head(url)
            if head.is_redirect:
                raise ForbiddenInputError(f"{url}: redirects are not followed")
            if head.status_code != 200:
                raise InputError(f"{url}: HTTP {head.status_code}")
            if head.headers.get("accept-ranges", "").lower() != "bytes":
                raise InputError(f"{url}: the host does not serve byte ranges")
            got = b""
            if budget is not None:
                budget.charge(url, 1, SNIFF_BYTES)
            with client.stream("GET", url, headers={"Range": f"bytes=0-{SNIFF_BYTES - 1}"}) as r:
                if r.is_redirect:
                    raise ForbiddenInputError(f"{url}: redirects are not followed")
                for chunk in r.iter_bytes():
                    if budget is not None:  # a host trickling its bytes: not past the deadline
                        budget.check(url)
                    got += chunk
                    if len(got) >= SNIFF_BYTES:
                        break
    except httpx.HTTPError as exc:
        raise InputError(f"{url}: request failed ({type(exc).__name__}: {exc})") from exc
    refuse_other_formats(url, got[:SNIFF_BYTES], formats)
    return url
