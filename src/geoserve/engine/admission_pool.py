"""Where a server request's inputs are opened: the engine's own threads, under its deadline.

Opening inputs blocks (GDAL opens a URL over HTTP; a STAC Item's files are checked and opened
one by one), so :class:`~geoserve.engine.async_engine.AsyncEngine` runs it in threads. They are
its own, not asyncio's default executor that the rest of the process shares, in two lanes of
``threads`` each:

- requests that reach other hosts (a URL, a STAC Item naming URLs) take one thread each and
  open their inputs one at a time in it: one request never holds more than one thread, however
  many files it names;
- requests that need no network (uploads, base64, local files) have a lane of their own, so
  they never wait behind slow remote hosts.

The wait is bounded by the request's deadline (:class:`~geoserve.errors.RequestTimeoutError`
at it). A request that timed out, or whose caller was cancelled (its client left), has its
:class:`~geoserve.raster.budget.OpenBudget` cancelled: its remaining remote operations do not
start, one still queued for a thread never starts, and what an abandoned open still returns
is closed.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from geoserve.errors import RequestTimeoutError
from geoserve.raster.budget import OpenBudget, using
from geoserve.raster.stac_item import StacItem, is_stac_input
from geoserve.stac_query import StacSearch

_REMOTE = ("/vsicurl/", "http://", "https://")
T = TypeVar("T")


def reaches_network(inputs: Any) -> bool:
    """Whether opening ``inputs`` (one request's) may reach another host.

    A URL (or a window of one), or a STAC Item that names one (a ``pystac.Item``, or an Item
    file not yet read: assumed to).
    """
    values = list(inputs.values()) if isinstance(inputs, Mapping) else [inputs]
    flat = [x for v in values for x in (v if isinstance(v, list | tuple) else [v])]
    for item in flat:
        if isinstance(item, StacSearch):  # (a catalogue, then the files it names)
            return True
        if isinstance(item, StacItem):
            hrefs = (str(a.get("href", "")) for a in item.data["assets"].values())
            if item.remote or any(h.strip().lower().startswith(_REMOTE[1:]) for h in hrefs):
                return True
        elif is_stac_input(item, sniff=False):
            return True
        elif isinstance(item, str | os.PathLike):
            text = os.fspath(item)
            if isinstance(text, str) and text.startswith(_REMOTE):
                return True
        elif str(getattr(item, "path", "")).startswith(_REMOTE):  # a window of a URL (tiles)
            return True
    return False


class AdmissionPool:
    """The two lanes of admission threads (see the module docstring).

    Args:
        threads: Threads of each lane (None: cores + 4, at most 32).
    """

    def __init__(self, threads: int | None = None) -> None:
        threads = threads or min(32, (os.cpu_count() or 1) + 4)
        self.threads = threads
        self._remote = ThreadPoolExecutor(threads, thread_name_prefix="geoserve-open-remote")
        self._local = ThreadPoolExecutor(threads, thread_name_prefix="geoserve-open")

    async def run(
        self,
        prepare: Callable[[], T],
        *,
        remote: bool,
        budget: OpenBudget,
        timeout: float | None,
        late: str,
    ) -> T:
        """``prepare()`` in a thread of the ``remote`` lane or the local one, with ``budget``.

        Raises:
            RequestTimeoutError: not done within ``timeout`` s (None: no limit; ``late``: the
            message); and whatever ``prepare`` raises.
        """
        lane = self._remote if remote else self._local
        work = lane.submit(_within, budget, prepare)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(work), timeout)
        except RequestTimeoutError:  # the budget's own: the deadline passed in the thread
            raise
        except TimeoutError:
            _abandon(work, budget)
            raise RequestTimeoutError(late) from None
        except asyncio.CancelledError:
            _abandon(work, budget)
            raise

    def close(self) -> None:
        """Stop both lanes; opens still queued never start."""
        for lane in (self._remote, self._local):
            lane.shutdown(wait=False, cancel_futures=True)


def _within(budget: OpenBudget, prepare: Callable[[], T]) -> T:
    with using(budget):
        budget.check("the request's inputs")  # it waited for a thread past its deadline
        return prepare()


def _abandon(work: Future[Any], budget: OpenBudget) -> None:
    """Nobody waits for ``work`` now: stop what it has left, close what it still returns."""
    budget.cancel()
    work.cancel()  # (if it has not started)

    def close(done: Future[Any]) -> None:
        if not done.cancelled() and done.exception() is None:
            getattr(done.result(), "close", lambda: None)()

    work.add_done_callback(close)
