"""Reading a request's grid rows ahead of the model, in order, on a shared worker pool.

The model step must never wait for I/O while the readers keep up. Each request owns a
:class:`RowPrefetcher` that keeps up to ``depth`` rows read (or being read) ahead of the one the
engine is consuming. A request's rows are read one after another, never two at once: its
datasets are not thread-safe, and its source caches decoded blocks between neighbouring rows
(see :class:`~geoserve.raster.source.DatasetSource`). Different requests read in parallel on
the pool's threads; within one request, GDAL decodes the tiles of a row band on its own threads
(``NUM_THREADS``). Threads suffice: GDAL decoding and numpy's casts release the GIL.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Executor, Future
from typing import Generic, TypeVar

T = TypeVar("T")


class RowPrefetcher(Generic[T]):
    """Reads rows ``0 .. rows-1`` with ``read`` in order, up to ``depth`` ahead on ``pool``.

    Without a pool (or with ``depth`` 0) every row is read when asked for.
    """

    def __init__(
        self, read: Callable[[int], T], rows: int, pool: Executor | None, depth: int = 2
    ) -> None:
        self._read = read
        self._rows = rows
        self._pool = pool if depth > 0 else None
        self._depth = depth
        self._lock = threading.Lock()
        self._next = 0  # next row to read
        self._ahead: deque[tuple[Future[None], Future[T]]] = deque()  # (pool task, its row)
        self._running = False
        self._closed = False

    def start(self) -> None:
        """Begin reading ahead (the engine calls this when the request is admitted)."""
        with self._lock:
            self._pump()

    def _pump(self) -> None:
        """Submit the next row if none is being read and fewer than ``depth`` are waiting."""
        if self._pool is None or self._closed or self._running:
            return
        if self._next >= self._rows or len(self._ahead) >= self._depth:
            return
        row, out = self._next, Future[T]()
        self._next += 1
        self._running = True
        self._ahead.append((self._pool.submit(self._task, row, out), out))

    def _task(self, row: int, out: Future[T]) -> None:
        try:
            result = self._read(row)
        except BaseException as exc:  # handed to the consumer, who fails the request
            with self._lock:
                self._running = False
                self._closed = True  # read no further rows of a broken input
            out.set_exception(exc)
            return
        with self._lock:
            self._running = False
            self._pump()
        out.set_result(result)

    def next(self) -> T:
        """The next row, waiting for it if it is still being read.

        Raises:
            Whatever ``read`` raised for that row.
        """
        with self._lock:
            if self._ahead:
                _, out = self._ahead.popleft()
                row = None
            else:  # nothing read ahead, and so nothing being read: read it here
                row = self._next
                self._next += 1
        result = self._read(row) if row is not None else out.result()
        with self._lock:
            self._pump()
        return result

    def next_ready(self) -> bool:
        """Whether :meth:`next` would return without waiting for a read in progress.

        (With no pool, or nothing read ahead, :meth:`next` reads on the caller's thread.)
        """
        with self._lock:
            return not self._ahead or self._ahead[0][1].done()

    def waiting_on(self) -> Future[T] | None:
        """The read :meth:`next` would wait for, if it is still in progress."""
        with self._lock:
            if self._ahead and not self._ahead[0][1].done():
                return self._ahead[0][1]
            return None

    @property
    def reading(self) -> bool:
        """Whether one of this request's rows is being read right now."""
        with self._lock:
            return self._running

    def settle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for a read in progress to end; True if none is running."""
        with self._lock:
            running = self._ahead[-1][1] if self._running and self._ahead else None
        if running is not None:
            futures.wait([running], timeout=timeout)
        return not self.reading

    def stop(self) -> None:
        """Read no further rows and drop those not started; never waits (see :meth:`close`)."""
        with self._lock:
            self._closed = True
            for task, _ in self._ahead:
                if task.cancel():  # never started: it was the one counted as running
                    self._running = False

    @property
    def ready(self) -> int:
        """Rows read ahead and waiting to be consumed (for tests and metrics)."""
        with self._lock:
            return sum(1 for _, out in self._ahead if out.done())

    def close(self) -> None:
        """Stop reading ahead; returns once no read of this request is in progress."""
        with self._lock:
            self._closed = True
            ahead = list(self._ahead)
            self._ahead.clear()
        for task, out in ahead:
            if not task.cancel():
                out.exception()  # wait for the read (its error is the consumer's, not ours)
