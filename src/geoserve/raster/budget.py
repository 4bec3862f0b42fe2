"""What opening one request's inputs may spend: its time, remote requests and bytes, pixels.

A server request has one deadline, and its inputs are opened before any pixel is read: the
server's own checks of each URL (a ``HEAD`` and a 4 KB range ``GET``), downloads, a STAC
Item's JSON and the check of every file it names, and GDAL opening each ``/vsicurl/`` URL
(its own ``HEAD`` and first range ``GET``). An :class:`OpenBudget`, one per request, is
charged *before* each of those:

- past the request's deadline, or once the request was cancelled (it timed out, its client
  left), the next remote operation does not start (:class:`~geoserve.errors.RequestTimeoutError`);
- every request to a remote host counts against ``max_requests`` and every byte fetched against
  ``max_bytes`` (:class:`~geoserve.errors.PayloadTooLargeError`, naming the budget and its flag);
  a GDAL open counts as :data:`GDAL_OPEN_REQUESTS` requests and :data:`GDAL_OPEN_BYTES`;
- each file's pixels (the bands the request reads of it) count against ``max_pixels`` as soon
  as its header is read, so a request of many files is refused at the first file over, not
  after all of them were opened;
- GDAL's own HTTP timeouts for an open are capped to the time left (:meth:`OpenBudget.gdal_env`).

Code that opens inputs finds the request's budget with :func:`current` (set for the thread,
or the task, that opens them with :func:`using`); without one nothing is limited here.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from typing import Any

import rasterio

from geoserve.errors import PayloadTooLargeError, RequestTimeoutError
from geoserve.raster.trust import GDAL_HTTP_DEFAULTS

#: What one GDAL open of a ``/vsicurl/`` URL is counted as: its HEAD and its first range GET
#: (of at most GDAL's 16 KB chunk; a larger header takes more, uncounted).
GDAL_OPEN_REQUESTS = 2
GDAL_OPEN_BYTES = 16 * 1024

#: GDAL's HTTP timeouts that an open's are capped by the time its request has left.
_GDAL_TIMEOUTS = ("GDAL_HTTP_TIMEOUT", "GDAL_HTTP_CONNECTTIMEOUT")


class OpenBudget:
    """One request's allowance for opening its inputs (see the module docstring).

    Args:
        deadline: ``time.monotonic()`` by which the request must be done (None: no limit).
        max_requests: Most requests to remote hosts (None: no limit).
        max_bytes: Most bytes fetched from remote hosts (None: no limit).
        max_pixels: Most pixels of the files opened (None: no limit).
        timeout_s: The request's whole timeout, for messages.
    """

    def __init__(
        self,
        deadline: float | None = None,
        *,
        max_requests: int | None = None,
        max_bytes: int | None = None,
        max_pixels: int | None = None,
        timeout_s: float | None = None,
    ) -> None:
        self.deadline = deadline
        self.max_requests = max_requests
        self.max_bytes = max_bytes
        self.max_pixels = max_pixels
        self.timeout_s = timeout_s
        self.requests = 0
        self.bytes = 0
        self.pixels = 0
        self.files = 0
        self._cancelled = threading.Event()
        self._lock = threading.Lock()

    def cancel(self) -> None:
        """The request is over (timed out, its client left): no remote operation starts now."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        """Whether :meth:`cancel` was called."""
        return self._cancelled.is_set()

    def left(self) -> float | None:
        """Seconds to the deadline (None: no deadline; never below 0)."""
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def check(self, what: str) -> None:
        """Raise unless the request may still start an operation on ``what``.

        Raises:
            RequestTimeoutError: the request was cancelled, or its deadline passed.
        """
        if self.cancelled or (self.deadline is not None and time.monotonic() >= self.deadline):
            within = f" within {self.timeout_s:g} s" if self.timeout_s is not None else ""
            raise RequestTimeoutError(
                f"{what}: not opened: the request did not finish{within}; its work was dropped"
            )

    def charge(self, what: str, requests: int = 1, nbytes: int = 0) -> None:
        """Count ``requests`` to a remote host and ``nbytes`` from it, before they are made.

        Raises:
            RequestTimeoutError: see :meth:`check`; PayloadTooLargeError: over a budget.
        """
        self.check(what)
        with self._lock:
            self.requests += requests
            self.bytes += nbytes
            over_requests = self.max_requests is not None and self.requests > self.max_requests
            over_bytes = self.max_bytes is not None and self.bytes > self.max_bytes
        if over_requests:
            raise PayloadTooLargeError(
                f"{what}: this request's inputs take more than {self.max_requests} requests "
                "to remote hosts, over its remote budget (--max-remote-requests)"
            )
        if over_bytes:
            mb = (self.max_bytes or 0) / (1024 * 1024)
            raise PayloadTooLargeError(
                f"{what}: this request's inputs fetch more than {mb:g} MB from remote hosts, "
                "over its remote budget (--max-remote-mb, by default --max-body-mb)"
            )

    def add_bytes(self, what: str, nbytes: int) -> None:
        """Count ``nbytes`` received (a download, as it streams in); see :meth:`charge`."""
        self.charge(what, 0, nbytes)

    def add_pixels(self, what: str, pixels: int) -> None:
        """Count the pixels of one more file, as soon as its header is read.

        Raises:
            PayloadTooLargeError: the files opened so far hold more than ``max_pixels``.
        """
        with self._lock:
            self.pixels += pixels
            self.files += 1
            total, files = self.pixels, self.files
        if self.max_pixels is not None and total > self.max_pixels:
            raise PayloadTooLargeError(
                f"{what}: the {files} file(s) of the request opened so far hold {total} "
                f"pixels, over the limit of {self.max_pixels} (--max-pixels)"
            )

    def gdal_env(self, what: str) -> AbstractContextManager[Any]:
        """Charge one GDAL open of a remote file; the GDAL environment to open it in.

        GDAL's HTTP timeouts (the process's, :mod:`geoserve.raster.trust`) are capped to the
        whole seconds the request has left (at least 1).
        """
        self.charge(what, GDAL_OPEN_REQUESTS, GDAL_OPEN_BYTES)
        left = self.left()
        if left is None:
            return nullcontext()
        seconds = max(1, math.ceil(left))
        capped = {}
        for key in _GDAL_TIMEOUTS:
            try:
                now = float(os.environ.get(key) or GDAL_HTTP_DEFAULTS[key])
            except ValueError:
                now = float(GDAL_HTTP_DEFAULTS[key])
            capped[key] = str(min(seconds, max(1, math.ceil(now))))
        env: AbstractContextManager[Any] = rasterio.Env(**capped)
        return env

    def http_timeout(self, limit: float) -> float:
        """``limit`` seconds for one HTTP operation, capped to the time left (at least 1 ms)."""
        left = self.left()
        return limit if left is None else max(0.001, min(limit, left))


_CURRENT: ContextVar[OpenBudget | None] = ContextVar("geoserve_open_budget", default=None)


def current() -> OpenBudget | None:
    """The budget of the request whose inputs this thread (or task) is opening, if any."""
    return _CURRENT.get()


@contextmanager
def using(budget: OpenBudget | None) -> Iterator[OpenBudget | None]:
    """Make ``budget`` the :func:`current` one inside the block."""
    token = _CURRENT.set(budget)
    try:
        yield budget
    finally:
        _CURRENT.reset(token)


def remote_env(what: str) -> AbstractContextManager[Any]:
    """The GDAL environment for opening the remote file ``what`` (charged to :func:`current`)."""
    budget = current()
    return nullcontext() if budget is None else budget.gdal_env(what)


def add_pixels(what: str, pixels: int) -> None:
    """Count one opened file's ``pixels`` to :func:`current` (see :meth:`OpenBudget.add_pixels`)."""
    budget = current()
    if budget is not None:
        budget.add_pixels(what, pixels)
