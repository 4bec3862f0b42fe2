"""Reading a request's grid rows ahead of the model, in order, on a shared worker pool.

The model step must never wait for I/O while the readers keep up. Each request owns a
:class:`RowPrefetcher` that keeps up to ``depth`` rows read (or being read) ahead of the one the
engine is consuming.

Reading a row has two parts. ``fetch`` touches the request's sources: it decodes the row's
blocks into the sources' row buffers and copies the row out. A request's datasets are not
thread-safe and its sources keep decoded blocks between neighbouring rows (see
:class:`~geoserve.raster.dataset.DatasetSource`), so fetches of one request run one at a time,
in row order. ``cut`` (casting, normalising, masking, cutting into patches) works on that copy
alone, so the cuts of several rows of one request run at once, on different pool threads: with
``parallel`` > 1 a second thread cuts row ``r`` while the next fetches row ``r + 1``, and one
request keeps several cores busy. Both parts of a row run in one pool task, on one thread.
Different requests read in parallel on the pool's threads; within one fetch, GDAL decodes the
tiles of a row band on its own threads (``NUM_THREADS``). Threads suffice: GDAL decoding and
numpy's casts release the GIL.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Executor, Future
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class RowsStopped(Exception):
    """A row was not read: the prefetcher was stopped (or an earlier row failed) first."""


def _whole(row: int, fetched: Any) -> Any:
    return fetched


class RowPrefetcher(Generic[T]):
    """Reads rows ``0 .. rows-1`` in order, up to ``depth`` ahead on ``pool``.

    A row is ``cut(row, fetch(row))``; without ``cut``, ``fetch`` reads the whole row. Fetches
    run one at a time in row order; up to ``parallel`` rows are in progress at once (their
    cuts overlap each other and the next fetch). Without a pool (or with ``depth`` 0) every
    row is read when asked for.
    """

    def __init__(
        self,
        fetch: Callable[[int], Any],
        rows: int,
        pool: Executor | None,
        depth: int = 2,
        *,
        cut: Callable[[int, Any], T] = _whole,
        parallel: int = 1,
    ) -> None:
        self._fetch = fetch
        self._cut = cut
        self._rows = rows
        self._pool = pool if depth > 0 else None
        self._depth = depth
        self._parallel = max(1, min(parallel, depth)) if depth > 0 else 1
        self._lock = threading.Condition()
        self._next = 0  # next row to submit
        self._turn = 0  # next row whose fetch may start
        self._ahead: deque[tuple[Future[None], Future[T]]] = deque()  # (pool task, its row)
        self._running = 0  # rows submitted and not yet read (or cancelled)
        self._closed = False
        self._busy = 0.0  # seconds spent fetching and cutting, summed over threads

    def start(self) -> None:
        """Begin reading ahead (the engine calls this when the request is admitted)."""
        with self._lock:
            self._pump()

    def _pump(self) -> None:
        """Submit the next row once the rows before it are fetched (and within the bounds).

        The bounds: fewer than ``parallel`` rows running, fewer than ``depth`` ahead. Waiting
        for the fetch before means no task ever holds a pool thread waiting for its turn: a
        request whose input stalls occupies one reader thread, never all of them.
        """
        if (
            self._pool is not None
            and not self._closed
            and self._turn == self._next
            and self._running < self._parallel
            and self._next < self._rows
            and len(self._ahead) < self._depth
        ):
            row, out = self._next, Future[T]()
            self._next += 1
            self._running += 1
            self._ahead.append((self._pool.submit(self._task, row, out), out))

    def _read(self, row: int) -> T:
        """Fetch ``row`` when its turn comes (after row - 1's fetch), then cut it."""
        with self._lock:
            while self._turn != row and not self._closed:
                self._lock.wait()
            if self._closed:
                raise RowsStopped(f"row {row} was not read")
        t0 = time.perf_counter()
        try:
            fetched = self._fetch(row)
        except BaseException:
            with self._lock:
                self._closed = True  # read no further rows of a broken input
                self._busy += time.perf_counter() - t0
                self._lock.notify_all()
            raise
        with self._lock:
            self._turn = row + 1
            self._lock.notify_all()
            self._pump()  # the next row's fetch, while this one is cut
        try:
            return self._cut(row, fetched)
        finally:
            t2 = time.perf_counter()
            with self._lock:
                self._busy += t2 - t0

    @property
    def busy_seconds(self) -> float:
        """Seconds spent reading rows so far (fetching and cutting), summed over threads."""
        with self._lock:
            return self._busy

    def _task(self, row: int, out: Future[T]) -> None:
        try:
            result = self._read(row)
        except BaseException as exc:  # handed to the consumer, who fails the request
            with self._lock:
                self._running -= 1
                self._closed = True
                self._lock.notify_all()
            out.set_exception(exc)
            return
        with self._lock:
            self._running -= 1
            self._pump()
        out.set_result(result)

    def next(self) -> T:
        """The next row, waiting for it if it is still being read.

        Raises:
            Whatever ``fetch`` or ``cut`` raised for that row.
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
            return self._running > 0

    def settle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the reads in progress to end; True if none is running."""
        with self._lock:
            running = [out for task, out in self._ahead if not task.cancelled()]
        if running:
            futures.wait(running, timeout=timeout)
        return not self.reading

    def stop(self) -> None:
        """Read no further rows and drop those not started; never waits (see :meth:`close`)."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()  # rows waiting for their turn give up
            for task, _ in self._ahead:
                if not task.cancelled() and task.cancel():  # never started, counted running
                    self._running -= 1

    @property
    def ready(self) -> int:
        """Rows read ahead and waiting to be consumed (for tests and metrics)."""
        with self._lock:
            return sum(1 for _, out in self._ahead if out.done())

    def close(self) -> None:
        """Stop reading ahead; returns once no read of this request is in progress."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
            ahead = list(self._ahead)
            self._ahead.clear()
        for task, out in ahead:
            if task.cancelled():  # (by stop, and counted then)
                continue
            if task.cancel():
                with self._lock:
                    self._running -= 1
            else:
                out.exception()  # wait for the read (its error is the consumer's, not ours)
