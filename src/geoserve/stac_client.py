"""Asking a STAC API for Items with pystac-client, under geoserve's rules for remote reads.

pystac-client drives the search (the landing page, conformance, ``/search`` and its pages);
:class:`GuardedStacIO` is the transport it is given. Against its default one it: asks only
http(s) URLs (a link to a local path is refused, never opened), passes each URL to the
search's ``vet_api`` first, follows no redirect, does not retry, reads at most
:data:`~geoserve.stac_query.MAX_RESPONSE_BYTES` per response, and charges each request and its
bytes to the request's remote budget where one is open (the HTTP server's
``--max-remote-requests`` / ``--max-remote-mb``, its deadline bounding each timeout).
"""

from __future__ import annotations

import re
import time
from typing import Any
from urllib.parse import urlsplit

import pystac
from pystac_client import Client
from pystac_client.conformance import ConformanceClasses
from pystac_client.exceptions import APIError
from pystac_client.stac_api_io import StacApiIO

from geoserve.errors import GeoServeError, InputError
from geoserve.raster.budget import current
from geoserve.stac_query import (
    MAX_RESPONSE_BYTES,
    SEARCH_TIMEOUT_S,
    StacSearch,
    describe_where,
    item_cloud,
)

_HTTP = ("http://", "https://")
#: An Item id this client takes: printable, no spaces or commas (outputs list them in tags).
_ITEM_ID = re.compile(r"[^\s,\x00-\x1f\x7f]{1,200}")
_BODY_METHODS = ("POST", "PUT", "PATCH")


class GuardedStacIO(StacApiIO):
    """pystac-client's transport, held to the rules in the module docstring."""

    def __init__(self, search: StacSearch) -> None:
        super().__init__(timeout=SEARCH_TIMEOUT_S, max_retries=None)
        self._search = search

    def read_text(self, source: Any, *args: Any, **kwargs: Any) -> str:
        """A document of the catalogue, by URL only (never a local file)."""
        href = source.href if isinstance(source, pystac.Link) else str(source)
        if not href.startswith(_HTTP):
            raise InputError(
                f"{self._search.url}: the catalogue links to {href!r:.120}, not http(s)"
            )
        return super().read_text(source, *args, **kwargs)

    def request(
        self,
        href: str,
        method: str | None = None,
        headers: dict[str, str] | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> str:
        """One request to the catalogue, under the rules in the module docstring.

        ``headers`` (a link's own, as pystac-client passes them) are never sent: a catalogue
        does not choose what this client says (a ``Host``, credentials, cookies).
        """
        if not href.startswith(_HTTP):
            raise InputError(
                f"{self._search.url}: the catalogue links to {href!r:.120}, not http(s)"
            )
        if _origin(href) != _origin(self._search.url):
            raise InputError(
                f"{self._search.url}: the catalogue links to {href!r:.120}, off its own host "
                "(its pages are read from where the search was sent only)"
            )
        if self._search.vet_api is not None:
            self._search.vet_api(href)  # (raises to refuse)
        method = (method or "GET").upper()
        budget = current()
        timeout = SEARCH_TIMEOUT_S
        if budget is not None:
            budget.charge(href)
            timeout = budget.http_timeout(SEARCH_TIMEOUT_S)
        body = {"json": parameters} if method in _BODY_METHODS else {"params": parameters or {}}
        try:
            with self.session.request(
                method, href, timeout=timeout, allow_redirects=False, stream=True, **body
            ) as resp:
                if resp.is_redirect or resp.is_permanent_redirect:
                    raise InputError(f"{href}: the catalogue redirects (HTTP {resp.status_code})")
                if not 200 <= resp.status_code < 300:
                    raise InputError(f"{href}: the catalogue answers HTTP {resp.status_code}")
                raw = _read_capped(resp, href, time.monotonic() + timeout, budget)
        except GeoServeError:
            raise
        except Exception as exc:  # (requests' and urllib3's own errors)
            raise InputError(f"{href}: cannot ask the catalogue ({type(exc).__name__})") from None
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError(f"{href}: the catalogue's answer is not UTF-8 text") from None


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), port


def _read_capped(resp: Any, href: str, deadline: float, budget: Any) -> bytes:
    """The answer's body, at most :data:`MAX_RESPONSE_BYTES`, the whole of it by ``deadline``.

    Read as the bytes arrive (``read1``: a socket read each, so an answer that trickles in
    stops at the deadline, not only a silent one), each piece charged to ``budget`` (which
    stops it once its request is cancelled or past its own deadline).
    """
    chunks: list[bytes] = []
    size = 0
    while True:
        if time.monotonic() > deadline:
            raise InputError(
                f"{href}: the catalogue's answer did not arrive within {SEARCH_TIMEOUT_S:g} s"
            )
        chunk = resp.raw.read1(64 * 1024, decode_content=True)
        if not chunk:
            if resp.raw.closed or resp.raw.length_remaining in (0, None):
                break
            continue  # (a compressed piece that decoded to nothing yet)
        size += len(chunk)
        if size > MAX_RESPONSE_BYTES:
            raise InputError(f"{href}: the catalogue's answer is over {MAX_RESPONSE_BYTES} bytes")
        if budget is not None:
            budget.add_bytes(href, len(chunk))
        chunks.append(chunk)
    return b"".join(chunks)


def search_items(search: StacSearch) -> list[pystac.Item]:
    """The Items ``search`` matches (at most its ``max_items``; more is an error).

    Raises:
        InputError: naming the catalogue: unreachable, not a STAC API with item search, a
            malformed answer, or too many Items.
        ForbiddenInputError: the search's ``vet_api`` refused a URL.
    """
    try:
        client = Client.open(search.url, stac_io=GuardedStacIO(search))
        if not client.conforms_to(ConformanceClasses.ITEM_SEARCH):
            raise InputError(f"{search.url}: not a STAC API with item search")
        query = None
        if search.max_cloud is not None and client.conforms_to(ConformanceClasses.QUERY):
            query = {"eo:cloud_cover": {"lte": search.max_cloud}}
        found = client.search(
            collections=list(search.collections),
            bbox=list(search.bbox),
            datetime=search.datetime,
            query=query,
            max_items=search.max_items + 1,
            limit=min(100, search.max_items + 1),
        )
        items = list(found.items())
    except GeoServeError:
        raise
    except (
        APIError,
        pystac.STACError,
        NotImplementedError,
        ValueError,
        KeyError,
        TypeError,
    ) as exc:
        text = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise InputError(f"{search.name}: {text}") from None
    if len(items) > search.max_items:
        raise InputError(
            f"{search.name}: more than {search.max_items} Items in {describe_where(search)}; "
            "narrow the bbox or the dates, or lower max_cloud"
        )
    if search.max_cloud is not None:
        items = [i for i in items if item_cloud(i) <= search.max_cloud]
    for item in items:
        if not isinstance(item.id, str) or not _ITEM_ID.fullmatch(item.id):
            raise InputError(f"{search.name}: the catalogue answered an Item id {item.id!r:.80}")
        if item.collection_id not in search.collections:
            raise InputError(
                f"{search.name}: the catalogue answered Item {item.id!r:.80} of collection "
                f"{item.collection_id!r:.80}, which was not asked for"
            )
    return items
