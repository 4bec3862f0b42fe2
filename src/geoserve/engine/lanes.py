"""In-order lanes on a shared thread pool: one request's writes in order, requests side by side.

:class:`Lanes` runs callables on a small pool of threads, one lane per key (a request): the
tasks of a lane run one at a time, in the order they were submitted, and the lanes run beside
each other, so one request's slow or costly rows (a noisy class map, a large float output)
hold up neither the other requests' rows nor the order of its own. A lane's next task joins
the back of the pool's queue when its previous one is done, so busy lanes take turns.

:meth:`Lanes.submit` returns an ordinary :class:`~concurrent.futures.Future`: it can be
cancelled while it waits (its task is then skipped, the lane goes on), and its ``result()``
raises the task's exception. A task that fails does not stop its lane: what the lane's
later tasks do about it is theirs to say (a writer aborted by a failed write refuses them).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class Lanes:
    """Runs each key's tasks in order, the keys' side by side on ``workers`` threads.

    Args:
        workers: Threads of the pool (how many lanes run at once).
        name: The threads' name prefix.
    """

    def __init__(self, workers: int, name: str) -> None:
        self.workers = workers
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix=name)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        # key -> its tasks not finished yet, the running (or next) one first; a key is
        # present exactly while its lane has a task queued on the pool
        self._lanes: dict[Hashable, deque[tuple[Future[Any], Callable[[], Any]]]] = {}
        self._closed = False

    def submit(self, key: Hashable, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Run ``fn(*args)`` after every task submitted before it under ``key``.

        Raises:
            RuntimeError: the lanes are closed.
        """
        fut: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot submit to closed lanes")
            lane = self._lanes.get(key)
            if lane is None:
                self._lanes[key] = deque([(fut, lambda: fn(*args))])
                self._pool.submit(self._run_next, key)
            else:
                lane.append((fut, lambda: fn(*args)))
        return fut

    def _run_next(self, key: Hashable) -> None:
        """Run the lane's first task, then queue its next one (on a pool thread)."""
        with self._lock:
            fut, task = self._lanes[key][0]
        if fut.set_running_or_notify_cancel():  # (False: cancelled while it waited)
            try:
                result = task()
            except BaseException as exc:  # (as ThreadPoolExecutor: the future carries it)
                fut.set_exception(exc)
            else:
                fut.set_result(result)
        with self._lock:
            lane = self._lanes[key]
            lane.popleft()
            if lane:
                self._pool.submit(self._run_next, key)
            else:
                del self._lanes[key]
                self._idle.notify_all()

    def close(self) -> None:
        """Refuse new tasks, wait for every lane's queued ones, then stop the threads."""
        with self._lock:
            self._closed = True
            while self._lanes:
                self._idle.wait()
        self._pool.shutdown(wait=True)
