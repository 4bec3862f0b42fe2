"""Who may talk to the server from a browser: the Host rule and the same-origin rule.

Two attacks reach a server on a LAN or on loopback through its user's own browser, and both
are decided here, from the request's headers alone, before any route runs:

- **DNS rebinding** (a page of ``attacker.example`` whose name then resolves to the server's
  address, so the browser treats the server as that page's own origin and lets it read the
  answers): the ``Host`` header must name the server. :class:`HostRule` allows
  ``localhost``, ``127.0.0.1`` and ``::1``, the bound address, the names given with
  ``--allowed-host``, and, when bound to every interface (``0.0.0.0`` / ``::``), any IP
  address and this machine's own name; ``--allowed-host '*'`` allows any.
- **Cross-site requests** (another site's page making its visitor's browser send a form, or a
  ``no-cors`` fetch, here; the browser attaches a remembered Basic key by itself): a request
  that changes state (anything but ``GET``, ``HEAD`` and ``OPTIONS``) is refused when the
  browser says it comes from elsewhere (``Sec-Fetch-Site`` cross-site or same-site, or an
  ``Origin`` / ``Referer`` that is not the server's own). A browser sends ``Sec-Fetch-Site``
  only to trustworthy origins (https, localhost), so over plain http by another name the
  ``Origin`` header is the evidence; a request with browser credentials (HTTP Basic) that
  changes state must prove it is same-origin and carry :data:`PAGE_HEADER`, which no form can
  send and no other origin may send without a CORS preflight the server never grants. Clients
  that are not browsers (curl, Python) send none of these headers and use a Bearer key.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

#: The header the map page sends with every request that changes state.
PAGE_HEADER = "x-geoserve-page"
#: Methods that only read (a browser may send them cross-site with a remembered key).
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: Names the server always answers to: its loopback names.
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_EVERY_INTERFACE = frozenset({"0.0.0.0", "::", ""})
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}

Evidence = Literal["same", "cross", "unknown"]


def host_name(host: str) -> str | None:
    """The name of a ``Host`` header (``name[:port]``, ``[v6]:port``), lowercased; None: bad."""
    host = host.strip()
    if not host or len(host) > 255 or any(c in host for c in "/\\@?#% \t"):
        return None
    try:
        name = urlsplit("//" + host).hostname
    except ValueError:
        return None
    return name.rstrip(".") if name else None


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class HostRule:
    """Which ``Host`` names the server answers to (see the module docstring)."""

    names: frozenset[str]
    any_ip: bool = False
    any_name: bool = False

    @classmethod
    def for_server(cls, bind: str, allowed: Iterable[str]) -> HostRule:
        """The rule for a server bound to ``bind`` with ``--allowed-host`` names ``allowed``."""
        given = {a.strip().lower().rstrip(".") for a in allowed}
        if "*" in given:
            return cls(frozenset(), any_ip=True, any_name=True)
        names = set(LOOPBACK_NAMES) | {g.strip("[]") for g in given if g}
        every = bind.strip("[]") in _EVERY_INTERFACE
        if every:  # reached by whatever address the machine has, and by its own name
            names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
        else:
            names.add(bind.strip("[]").lower())
        return cls(frozenset(names), any_ip=every)

    def allows(self, host: str | None) -> bool:
        """Whether a request with this ``Host`` header is answered (no header: yes)."""
        if host is None or self.any_name:
            return True
        name = host_name(host)
        if name is None:
            return False
        return name in self.names or (self.any_ip and _is_ip(name))


def _origin_key(url: str, default_scheme: str) -> tuple[str, int] | None:
    """``(name, port)`` of an origin or URL (the port filled in from its scheme)."""
    try:
        parts = urlsplit(url if "//" in url else f"{default_scheme}://{url}")
        name, port = parts.hostname, parts.port
    except ValueError:
        return None
    if not name:
        return None
    scheme = parts.scheme or default_scheme
    return name.rstrip("."), port or _DEFAULT_PORTS.get(scheme, 0)


def same_origin(headers: Mapping[str, str], scheme: str) -> Evidence:
    """What the browser's headers say of where a request comes from.

    ``headers`` are lowercased names. ``same``: ``Sec-Fetch-Site`` same-origin (or ``none``,
    the user's own navigation), or an ``Origin`` (else a ``Referer``) naming this server, as
    the request's ``Host`` does. ``cross``: the browser says otherwise (``Origin: null``
    included). ``unknown``: no such header (not a browser, or an old one).

    The server's own name and port are taken from ``Host`` (checked by :class:`HostRule`
    first); a default port is filled in from each side's scheme, so a TLS proxy in front
    (``Origin: https://geo.example``, ``Host: geo.example``) still matches.
    """
    site = headers.get("sec-fetch-site")
    if site in ("cross-site", "same-site"):
        return "cross"
    claimed = headers.get("origin") or headers.get("referer")
    if claimed is not None:
        host = headers.get("host")
        own = _origin_key(host, scheme) if host else None
        theirs = None if claimed.strip() == "null" else _origin_key(claimed.strip(), scheme)
        if host is None or own is None or theirs is None:
            return "cross"
        # a proxy may end TLS in front: then Host carries no port and the Origin's is 443
        no_port = ":" not in host.rsplit("]", 1)[-1]
        if theirs[0] == own[0] and (theirs[1] == own[1] or (no_port and theirs[1] in (80, 443))):
            return "same"
        return "cross"
    if site in ("same-origin", "none"):
        return "same"
    return "unknown"


def refusal(method: str, headers: Mapping[str, str], scheme: str, *, basic: bool) -> str | None:
    """Why a request must be refused as cross-site (None: it may go on).

    Args:
        method: The HTTP method.
        headers: The request's headers, names lowercased.
        scheme: ``http`` or ``https``, as the server was reached.
        basic: The request carries HTTP Basic credentials (a browser's remembered key).
    """
    evidence = same_origin(headers, scheme)
    if method.upper() in SAFE_METHODS:
        if basic and evidence == "cross":  # a key remembered by the browser, for elsewhere
            return "a browser's remembered key is not accepted for another site's page"
        return None
    if evidence == "cross":
        return (
            "cross-site request refused: the browser says it comes from another site's page "
            "(Origin or Sec-Fetch-Site); send it from this server's own page, or without "
            "browser headers and with a Bearer key"
        )
    if basic and (evidence != "same" or PAGE_HEADER not in headers):
        return (
            "HTTP Basic credentials are accepted for requests that change state only from this "
            "server's own map page (same Origin and its X-Geoserve-Page header); other clients "
            "send the key as 'Authorization: Bearer KEY' or 'X-API-Key: KEY'"
        )
    return None
