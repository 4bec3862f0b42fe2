"""Keeping a long-running server's resident memory from creeping up (glibc's heap).

Serving many requests from several threads makes glibc's allocator keep freed pages in its
per-thread arenas: resident memory grows request after request while Python's own heap stays
flat. :func:`trim_heap` (``malloc_trim(0)``) returns them to the operating system; the async
engine calls it when requests finish (at once when it goes idle, every few seconds under
load). Capping the arenas (:func:`limit_arenas`, what ``MALLOC_ARENA_MAX`` does) also bounds
the growth, but cost about 20 % of throughput on the server benchmark (2 arenas), so it is not
applied by default. Both are no-ops where glibc is absent.

docs/benchmarks.md has the resident memory of a server over 2,000 requests.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

logger = logging.getLogger(__name__)

#: Arenas glibc may use (its default is 8 per core).
MAX_ARENAS = 2
_M_ARENA_MAX = -8


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") else None


_LIBC = _libc()


def limit_arenas(arenas: int = MAX_ARENAS) -> bool:
    """Cap glibc's malloc arenas (unless MALLOC_ARENA_MAX is set); True if applied."""
    if _LIBC is None or "MALLOC_ARENA_MAX" in os.environ:
        return False
    return bool(_LIBC.mallopt(_M_ARENA_MAX, arenas))


def trim_heap() -> bool:
    """Return freed heap memory to the operating system; True if glibc released some."""
    if _LIBC is None:
        return False
    return bool(_LIBC.malloc_trim(0))
