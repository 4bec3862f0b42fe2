"""An asyncio front over :class:`Engine` for servers: one engine loop in a background thread.

Callers ``await submit(spec)`` with a :class:`~geoserve.engine.request_spec.RequestSpec`.
Opening a request's inputs (header parsing, band checks) runs in the engine's own admission
threads, under the request's deadline
(:mod:`geoserve.engine.admission_pool`); reading, normalising, the forward passes, stitching
and encoding run in the engine thread. The event loop only moves requests and results, so it
stays responsive under load.

Admission is bounded in patches: a request is refused with :class:`QueueFullError` when the
queue is already full (before anything is decoded) or when its own patches would overflow it
(checked on the header alone, before any pixel is read). Each step fills one batch from every
pending request; with ``max_wait_ms`` > 0 the loop waits, at most that long after the oldest
pending request arrived, for enough patches to fill a batch.

This module has no web imports; the HTTP layer maps its errors to status codes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from geoserve.engine.admission_pool import AdmissionPool, reaches_network
from geoserve.engine.core import Engine
from geoserve.engine.heap import trim_heap
from geoserve.engine.ledger import MemoryLedger
from geoserve.engine.limits import check_request
from geoserve.engine.request import Request
from geoserve.engine.request_spec import RequestSpec
from geoserve.engine.turns import Turns
from geoserve.errors import (
    GeoServeError,
    PayloadTooLargeError,
    QueueFullError,
    RequestTimeoutError,
    ShuttingDownError,
)
from geoserve.raster.budget import OpenBudget
from geoserve.schemas import ImageRequestOutput, TensorRequestOutput

logger = logging.getLogger(__name__)

#: Shortest time between two heap trims under load, and when the engine goes idle.
TRIM_INTERVAL_S = 5.0
IDLE_TRIM_INTERVAL_S = 1.0


class AsyncEngine:
    """Runs an :class:`Engine` in a background thread and serves ``await submit(spec)``.

    Args:
        engine: The engine to drive (owned by this object from now on).
        max_queued_patches: Bound on patches admitted but not yet through the model.
        max_pixels: Bound on a request's decoded size (width x height x bands x dates).
        max_memory_mb: Bound on the estimated memory of all admitted requests together
            (:attr:`Request.memory_bytes`); a request alone over it is refused as too large,
            one that does not fit beside the admitted ones as queue-full (retry later).
        max_wait_ms: How long a batch may wait for more patches, counted from the oldest
            pending request; 0 runs whatever is queued at once.
        on_batch: Called in the engine thread with each batch's size (for metrics).
        admission_threads: Threads opening requests' inputs, in each of two lanes: requests
            that reach other hosts, and the rest (see :mod:`geoserve.engine.admission_pool`);
            None: cores + 4, at most 32 (as asyncio's default executor).
        turns: Shared with the other engines on the same device: each batch runs through
            the model (and is stitched) only while this engine holds the turn
            (:class:`~geoserve.engine.turns.Turns`), as ``name``; reading, waiting for rows
            and committing outputs need no turn.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        max_queued_patches: int = 4096,
        max_pixels: int = 400_000_000,
        max_memory_mb: float = 1024.0,
        max_wait_ms: float = 0.0,
        on_batch: Callable[[int], None] | None = None,
        admission_threads: int | None = None,
        turns: Turns | None = None,
        name: str = "",
    ) -> None:
        self.engine = engine
        if turns is not None:
            engine.device_turn = functools.partial(turns.turn, name)
        self._admission = AdmissionPool(admission_threads)
        self.max_queued_patches = max_queued_patches
        self.max_pixels = max_pixels
        self.max_memory = int(max_memory_mb * 1024 * 1024)
        #: What the admitted requests hold, and what the server holds beside them (bodies,
        #: answers: :meth:`MemoryLedger.hold`), against ``max_memory_mb``.
        self.memory = MemoryLedger(self.max_memory)
        self._remaining = 0  # patches still to run, as the engine thread last counted
        self._last_trim = 0.0
        self.max_wait_s = max_wait_ms / 1000
        self.on_batch = on_batch
        self._inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._futures: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Future[Any]]] = {}
        self._reserved: dict[str, int] = {}
        #: (patches done, patches in all) of each admitted request, as the engine thread counts
        self._progress: dict[str, tuple[int, int]] = {}
        self._lock = threading.Lock()
        self._closing = False
        #: Set if the engine loop itself died (never expected); the server then reports 503.
        self.crashed: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="geoserve-engine", daemon=True)
        self._thread.start()

    # -- client side (event loop) -----------------------------------------------------------

    @property
    def queued_patches(self) -> int:
        """Patches admitted and not yet through the model (reserved at admission)."""
        with self._lock:
            return sum(self._reserved.values())

    @property
    def remaining_patches(self) -> int:
        """Patches of admitted requests still to go through the model (for metrics)."""
        return self._remaining

    @property
    def in_flight(self) -> int:
        """Requests admitted and not yet finished."""
        with self._lock:
            return len(self._reserved)

    def progress(self, request_id: str) -> tuple[int, int] | None:
        """(patches done, patches in all) of an admitted request; ``None`` when it is not.

        Done counts the patches stitched and those skipped (all nodata); a request whose
        patches are all through the model but whose outputs are still being committed counts
        as all done. ``None`` before admission (its inputs still opening) and after its
        result was handed out.
        """
        with self._lock:
            return self._progress.get(request_id)

    async def submit(
        self,
        spec: RequestSpec,
        *,
        timeout: float | None = None,
        deadline: float | None = None,
        budget: OpenBudget | None = None,
        held: str | None = None,
    ) -> ImageRequestOutput:
        """Run one request and return its output (a failure in the engine is in ``.error``).

        ``spec`` is the request (a spec without ``request_id`` is given one); its
        ``patch_keys`` name its patches in a
        :class:`~geoserve.engine.patch_cache.PatchCache` (patches found there do not run).
        Admission errors are raised: :class:`QueueFullError`, :class:`PayloadTooLargeError`,
        and the input errors of :meth:`Engine.prepare_request`.

        Cancelling the awaiting task (a client that disconnected) drops the request's queued
        patches. A request past ``timeout`` seconds is dropped and raises
        :class:`RequestTimeoutError`; ``deadline`` (``time.monotonic()``) is the same for a
        request that already spent part of its ``timeout`` (fetching its inputs).

        The one deadline covers opening the inputs too (in the engine's admission threads);
        ``budget`` is the request's :class:`~geoserve.raster.budget.OpenBudget` (remote
        requests and bytes, as the server counted them so far), else one is made here; its
        ``max_pixels`` is this engine's unless set. ``held``: the key under which the server
        holds this request's body (:attr:`memory`); once admitted, its estimate replaces it.
        """
        if not isinstance(spec, RequestSpec):
            raise TypeError(f"submit takes a RequestSpec, not {type(spec).__name__}")
        request_id = spec.request_id or uuid.uuid4().hex[:12]
        spec = dataclasses.replace(spec, request_id=request_id)
        start = time.monotonic()
        if deadline is not None:
            deadline = min(deadline, start + timeout) if timeout is not None else deadline
        elif timeout is not None:
            deadline = start + timeout
        shown = timeout if timeout is not None else (deadline or start) - start
        late = f"request {request_id} did not finish within {shown:g} s; its work was dropped"
        if budget is None:
            budget = OpenBudget(deadline, timeout_s=shown)
        if budget.max_pixels is None:
            budget.max_pixels = self.max_pixels
        if self.crashed is not None:
            raise _crash_error(self.crashed)
        if self._closing:
            raise ShuttingDownError("the engine is shutting down; retry on another replica")
        if self.queued_patches >= self.max_queued_patches:
            raise QueueFullError(
                f"queue full ({self.max_queued_patches} patches pending); retry later"
            )
        req = await self._admission.run(
            functools.partial(self.engine.prepare_request, spec),
            remote=reaches_network(spec.inputs),
            budget=budget,
            timeout=_left(deadline),
            late=late,
        )
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        try:
            self._reserve(req, held)
        except BaseException:
            req.close()
            raise
        self._futures[request_id] = (loop, fut)
        self._inbox.put(("add", req))
        try:
            return await asyncio.wait_for(asyncio.shield(fut), _left(deadline))
        except TimeoutError:
            self.abort(request_id)
            raise RequestTimeoutError(late) from None
        except asyncio.CancelledError:
            self.abort(request_id)
            raise

    async def opening(
        self, open_: Callable[[], Any], *, remote: bool, budget: OpenBudget, what: str
    ) -> Any:
        """``open_()`` in the admission threads, under ``budget``, as a request's inputs are.

        For opens that are not a request (a map tile's scene header): ``budget``'s deadline
        and remote allowance apply.

        Raises:
            RequestTimeoutError: not done by the deadline; and whatever ``open_`` raises.
        """
        late = f"{what}: not opened within {budget.timeout_s:g} s"
        return await self._admission.run(
            open_, remote=remote, budget=budget, timeout=_left(budget.deadline), late=late
        )

    def _reserve(self, req: Request, held_key: str | None = None) -> None:
        """Admit ``req`` against the bounds.

        ``held_key``: what :meth:`hold` counted for it (its body), which its own estimate
        (with its upload) replaces once it is admitted.
        """
        info = req.sources[0].info
        pixels = req.input_pixels
        if pixels > self.max_pixels:
            if (
                len(req.sources) == 1
                and not req.ctx.modalities
                and pixels == (info.width * info.height * len(req.ctx.bands))
            ):
                what = f"{info.name}: {info.width}x{info.height} x {len(req.ctx.bands)} band(s)"
            else:  # several dates, modalities or files, each at its own size
                what = f"{', '.join(req.ctx.names)}: {len(req.reads())} input(s) together"
            raise PayloadTooLargeError(
                f"{what} = {pixels} pixels, over the limit of {self.max_pixels}"
            )
        n = len(req.ctx.grid)
        check_request(req, None, self.max_memory)
        with self._lock:
            queued = sum(self._reserved.values())
            if queued + n > self.max_queued_patches:
                raise QueueFullError(
                    f"queue full: {queued} patches pending, this request needs {n}, "
                    f"limit {self.max_queued_patches}; retry later"
                )
            self._reserved[req.request_id] = n
        try:
            self.memory.hold(req.request_id, req.memory_bytes, "this one", replaces=held_key)
        except BaseException:
            with self._lock:
                self._reserved.pop(req.request_id, None)
            raise

    def abort(self, request_id: str) -> None:
        """Drop a request (from any thread); its future is cancelled."""
        self._inbox.put(("abort", request_id))

    async def drain(self, timeout: float) -> bool:
        """Refuse new requests and wait up to ``timeout`` s for pending ones; True if done."""
        self._closing = True
        deadline = time.monotonic() + timeout
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return self.in_flight == 0

    def close(self) -> None:
        """Stop the engine thread; pending requests are dropped."""
        self._closing = True
        self._inbox.put(("stop", None))
        self._admission.close()
        self._thread.join(timeout=30)
        self.engine.close()

    # -- engine thread ------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while self._turn():
                pass
        except BaseException as exc:  # the loop itself broke: say so, and fail every waiter
            self.crashed = exc
            logger.critical("engine loop crashed; the server is no longer ready", exc_info=True)
            for rid in list(self._futures):
                self._resolve(ImageRequestOutput(rid, True, error=_crash_error(exc)))

    def _turn(self) -> bool:
        """One pass of the loop: take new work, run a step, hand out results; False to stop.

        Any exception of a step fails the pending requests and the loop goes on, so one bad
        request (or an engine bug it triggers) never stops the service.
        """
        block = not self.engine.has_unfinished()
        if not self._take_inbox(block=block, timeout=None if block else 0.0):
            return False
        if not self._wait_for_fill():
            return False
        try:
            results = self.engine.step()
        except Exception as exc:  # the engine isolates request errors; this guards bugs
            logger.exception("engine step failed")
            self._fail_all(GeoServeError(f"internal engine error: {exc!r}"))
            return True
        batch = self.engine.last_batch_size
        if batch and self.on_batch is not None:
            try:
                self.on_batch(batch)
            except Exception:
                logger.exception("batch callback failed")
        self._count_progress()
        for result in results:
            self._resolve(result)
        self._remaining = self.engine.queued_patches
        if results:
            self._trim(idle=not self.engine.has_unfinished())
        return True

    def _count_progress(self) -> None:
        """Record each admitted request's patches done (engine thread, after a step)."""
        active = {r.request_id: r for r in self.engine.scheduler.active}
        with self._lock:
            for rid, (_, total) in list(self._progress.items()):
                req = active.get(rid)
                done = total if req is None else min(total, req.stitched + req.skipped)
                self._progress[rid] = (done, total)

    def _trim(self, idle: bool) -> None:
        """Requests finished: hand freed heap back to the OS.

        At once when the engine went idle, else at most every :data:`TRIM_INTERVAL_S`.
        """
        now = time.monotonic()
        if now - self._last_trim >= (IDLE_TRIM_INTERVAL_S if idle else TRIM_INTERVAL_S):
            self._last_trim = now
            trim_heap()

    def _take_inbox(self, *, block: bool, timeout: float | None) -> bool:
        """Apply queued adds/aborts; False when asked to stop."""
        try:
            item = self._inbox.get(block=block, timeout=timeout)
        except queue.Empty:
            return True
        while True:
            kind, payload = item
            if kind == "stop":
                return False
            if kind == "add":
                with self._lock:
                    self._progress[payload.request_id] = (0, len(payload.ctx.grid))
                try:
                    self.engine.admit(payload)
                except Exception as exc:
                    logger.exception("admitting request %s failed", payload.request_id)
                    payload.close()
                    err = GeoServeError(f"admitting the request failed: {exc!r}")
                    self._resolve(ImageRequestOutput(payload.request_id, True, error=err))
            elif kind == "abort":
                self.engine.abort_request(payload)
                self._release(payload)
                entry = self._futures.pop(payload, None)
                if entry is not None:
                    _call_soon(entry[0], entry[1].cancel)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return True

    def _wait_for_fill(self) -> bool:
        """With max_wait_ms, hold the batch until it can be filled or the oldest waited enough."""
        if self.max_wait_s <= 0:
            return True
        while self.engine.queued_patches < self.engine.max_batch_patches:
            oldest = self.engine.oldest_arrival
            if oldest is None:
                return True
            remaining = oldest + self.max_wait_s - time.monotonic()
            if remaining <= 0:
                return True
            if not self._take_inbox(block=True, timeout=remaining):
                return False
        return True

    def _fail_all(self, error: GeoServeError) -> None:
        """Fail every pending request, so no caller waits forever after an engine bug."""
        for rid in self.engine.pending_ids():
            try:
                self.engine.abort_request(rid)
            except Exception:
                logger.exception("dropping request %s failed", rid)
        for rid in list(self._futures):
            self._resolve(ImageRequestOutput(rid, finished=True, error=error))

    def _release(self, request_id: str) -> None:
        with self._lock:
            self._reserved.pop(request_id, None)
            self._progress.pop(request_id, None)
        self.memory.release(request_id)

    def _resolve(self, result: ImageRequestOutput | TensorRequestOutput) -> None:
        self._release(result.request_id)
        entry = self._futures.pop(result.request_id, None)
        if entry is None:
            return
        loop, fut = entry

        def settle() -> None:
            if not fut.done():
                fut.set_result(result)

        _call_soon(loop, settle)


def _left(deadline: float | None) -> float | None:
    """Seconds to ``deadline`` (at least 1 ms; None: no deadline)."""
    return None if deadline is None else max(0.001, deadline - time.monotonic())


def _crash_error(exc: BaseException) -> ShuttingDownError:
    return ShuttingDownError(f"the engine loop stopped ({exc!r}); retry on another replica")


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[], object]) -> None:
    """Hand ``callback`` to a caller's event loop; a loop that has closed has no one waiting."""
    try:
        loop.call_soon_threadsafe(callback)
    except RuntimeError:  # "Event loop is closed": its caller is gone (asyncio.run ended)
        logger.debug("a result arrived for a closed event loop; dropped")
