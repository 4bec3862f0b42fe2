"""Turning what a client sends into engine inputs, with the server's guards applied.

Paths and URLs are refused unless the operator allowed them. A path is resolved first (``..``
collapsed, symlinks followed) and must then lie under an allowed directory; the *resolved* path
is what gets opened. Percent-encoded and ``file://`` paths are refused outright. A URL must be
http(s) to an allowed host; redirects are not followed (each hop would need the same check) and
the download stops at the body limit.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from urllib.parse import unquote, urlsplit

import httpx

from geoserve.errors import ForbiddenInputError, InputError, PayloadTooLargeError


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


async def fetch_url(url: str, domains: Sequence[str], max_bytes: int) -> bytes:
    """Download an allowed URL, at most ``max_bytes``, without following redirects.

    Raises:
        ForbiddenInputError: see :func:`check_url`; InputError: HTTP or network failure;
        PayloadTooLargeError: the body exceeds ``max_bytes``.
    """
    check_url(url, domains)
    chunks: list[bytes] = []
    size = 0
    try:
        async with (
            httpx.AsyncClient(follow_redirects=False, timeout=30.0) as client,
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
                chunks.append(chunk)
    except httpx.HTTPError as exc:
        raise InputError(f"{url}: download failed ({type(exc).__name__}: {exc})") from exc
    return b"".join(chunks)
