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

from typing import Any

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
        """One request to the catalogue, under the rules in the module docstring."""
        if not href.startswith(_HTTP):
            raise InputError(
                f"{self._search.url}: the catalogue links to {href!r:.120}, not http(s)"
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
                method, href, headers=headers, timeout=timeout, allow_redirects=False,
                stream=True, **body,
            ) as resp:  # fmt: skip
                if resp.is_redirect or resp.is_permanent_redirect:
                    raise InputError(f"{href}: the catalogue redirects (HTTP {resp.status_code})")
                if not 200 <= resp.status_code < 300:
                    raise InputError(f"{href}: the catalogue answers HTTP {resp.status_code}")
                raw = resp.raw.read(MAX_RESPONSE_BYTES + 1, decode_content=True)
        except GeoServeError:
            raise
        except Exception as exc:  # (requests' and urllib3's own errors)
            raise InputError(f"{href}: cannot ask the catalogue ({type(exc).__name__})") from None
        if len(raw) > MAX_RESPONSE_BYTES:
            raise InputError(f"{href}: the catalogue's answer is over {MAX_RESPONSE_BYTES} bytes")
        if budget is not None:
            budget.add_bytes(href, len(raw))
        try:
            return bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            raise InputError(f"{href}: the catalogue's answer is not UTF-8 text") from None


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
        if item.collection_id is not None and item.collection_id not in search.collections:
            raise InputError(
                f"{search.name}: the catalogue answered Item {item.id!r:.80} of collection "
                f"{item.collection_id!r:.80}, which was not asked for"
            )
    return items
