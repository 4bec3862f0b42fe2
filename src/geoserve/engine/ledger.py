"""What a server holds in memory, by key, against its one memory bound (``--max-memory-mb``).

:class:`~geoserve.engine.async_engine.AsyncEngine` counts each admitted request's estimate
(:attr:`~geoserve.engine.request.Request.memory_bytes`) here, and the server what it holds
outside the engine: a request body as it streams in, an answer while its client takes it. A
new holding that does not fit beside the others is refused as busy (retry later); one alone
over the bound, as too large.
"""

from __future__ import annotations

import threading

from geoserve.errors import PayloadTooLargeError, QueueFullError

_MB = 1024 * 1024


class MemoryLedger:
    """Bytes held by key, against ``limit`` bytes in all."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    @property
    def total(self) -> int:
        """Bytes held now, all keys together."""
        with self._lock:
            return sum(self._held.values())

    def hold(
        self,
        key: str,
        nbytes: int,
        what: str,
        *,
        force: bool = False,
        replaces: str | None = None,
    ) -> None:
        """Count ``nbytes`` for ``key`` until :meth:`release` (again: the count is replaced).

        ``force``: count it whatever the bound (it is held already). ``replaces``: another
        key whose holding this one takes over (a request's body, once the request's own
        estimate, which counts its upload, is admitted): not counted against it, and dropped.

        Raises:
            PayloadTooLargeError: ``nbytes`` alone is over the bound.
            QueueFullError: it does not fit beside what is held now (retry later).
        """
        if not force and nbytes > self.limit:
            raise PayloadTooLargeError(
                f"{what} needs about {nbytes // _MB} MB, over the memory limit of "
                f"{self.limit // _MB} MB (--max-memory-mb)"
            )
        with self._lock:
            others = sum(self._held.values()) - self._held.get(key, 0)
            others -= self._held.get(replaces or key, 0) if replaces else 0
            if not force and others + nbytes > self.limit:
                raise QueueFullError(
                    f"server busy: it holds about {others // _MB} MB for admitted requests, "
                    f"{what} needs {nbytes // _MB} MB more, limit {self.limit // _MB} MB; "
                    "retry later"
                )
            self._held[key] = nbytes
            if replaces:
                self._held.pop(replaces, None)

    def release(self, key: str) -> None:
        """Stop counting ``key``."""
        with self._lock:
            self._held.pop(key, None)
