"""Turns on one device for several engines: a weighted fair share of their batches.

A server that serves several models runs one engine per model (each its own loop thread and
batching), all on one accelerator. Left alone, their forward passes are launched at once and
queue on the device however it schedules them, and a model flooded with requests takes what it
can. :class:`Turns` makes the share explicit: an engine's batch (the forward pass and the
stitching of its outputs, :attr:`geoserve.engine.Engine.device_turn`) runs only while it holds
the turn, one engine at a time, and the turn goes to the waiting engine that has used the
least device time for its share (virtual time: seconds held divided by the share, as
start-time fair queuing counts it). An engine that was idle re-enters at the virtual time of
the batch last granted, so idling banks no credit. Reading, waiting for rows and committing
outputs happen outside the turn.

So a model with a few requests waits for at most the batch in progress of another model
before its own runs, however many requests the others have queued; two models that are both
always busy get device time in the ratio of their shares. (On the CPU, where each engine's
torch threads can take cores of their own, the server lets them run side by side instead.)
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager


class Turns:
    """Weighted fair turns among named engines (one holds the turn at a time).

    Args:
        shares: Each engine's name and share (> 0): busy engines get device time in
            proportion to their shares.
    """

    def __init__(self, shares: Mapping[str, float]) -> None:
        bad = [n for n, s in shares.items() if not s > 0]
        if bad:
            raise ValueError(f"shares must be > 0: {', '.join(bad)}")
        self.shares = dict(shares)
        self._cond = threading.Condition()
        self._vtime = dict.fromkeys(self.shares, 0.0)
        self._held = dict.fromkeys(self.shares, 0.0)
        self._waiting: dict[str, int] = {}  # name -> arrival order
        self._holder: str | None = None
        self._now = 0.0  # virtual time: that of the batch last granted
        self._arrivals = itertools.count()

    @contextmanager
    def turn(self, name: str) -> Iterator[None]:
        """Hold the turn for one batch of engine ``name`` (waits for its fair turn)."""
        self._acquire(name)
        start = time.perf_counter()
        try:
            yield
        finally:
            self._release(name, time.perf_counter() - start)

    def held_seconds(self) -> dict[str, float]:
        """Seconds each engine has held the turn in all."""
        with self._cond:
            return dict(self._held)

    def _acquire(self, name: str) -> None:
        with self._cond:
            # (an engine back from idle starts level with the batch last granted; one that
            # asks again straight after its batch is already at or beyond it)
            self._vtime[name] = max(self._vtime[name], self._now)
            self._waiting[name] = next(self._arrivals)
            while self._holder is not None or self._next() != name:
                self._cond.wait()
            del self._waiting[name]
            self._holder = name
            self._now = self._vtime[name]

    def _next(self) -> str:
        """The waiting engine whose turn is next: least virtual time, then first to ask."""
        return min(self._waiting, key=lambda n: (self._vtime[n], self._waiting[n]))

    def _release(self, name: str, seconds: float) -> None:
        with self._cond:
            self._holder = None
            self._vtime[name] += seconds / self.shares[name]
            self._held[name] += seconds
            self._cond.notify_all()
