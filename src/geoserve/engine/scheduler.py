"""The scheduler: which patches go into the next batch, and the pending requests they come from.

Pending requests wait in priority order (lower first), then arrival order. A batch takes
patches from the first request on, across request boundaries (unless cross-request batching is
off), as long as they share a patch shape and model arguments (the request's ``signature``),
up to the batch cap. A request whose next row is still being read is passed over rather than
waited for, except the one first in line, which keeps its turn for up to :data:`TURN_WAIT_S`
per row: a stalled input costs the others at most that, once per row.

For a model whose patches take several steps the scheduler also holds the patches between
steps (:class:`~geoserve.engine.stepping.StepPool`): a batch then holds either new patches
(their first step, while the pool has room) or waiting ones due a step of one kind.

The scheduler also drops requests: aborted ones, and failed ones (:meth:`Scheduler.fail`, the
one place a request is failed; their failed outputs wait here for the next step). A dropped
request whose row is being read is released once that read returns, never waited for.

No torch here: it moves requests and patches, never their data.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterator, Sequence
from concurrent import futures
from typing import TYPE_CHECKING, Any

from geoserve.engine.failures import READ, Stage, isolate
from geoserve.errors import GeoServeError

if TYPE_CHECKING:
    import contextlib

    from geoserve.engine.batch import Patch
    from geoserve.engine.request import Request
    from geoserve.engine.stepping import StepPool
    from geoserve.schemas import ImageRequestOutput, TensorRequestOutput

#: Longest a step with nothing to run waits for a row still being read (then looks again).
READ_WAIT_S = 0.05
#: Longest the request first in line keeps its turn while one of its rows is read; after
#: that the requests behind it are served (so a stalled input costs them this once per row).
TURN_WAIT_S = 0.5


class Scheduler:
    """The engine's pending requests and the batches drawn from them; see the module docstring.

    Attributes:
        active: Pending requests, in the order batches draw from them.
        releasing: Dropped requests waiting for a read in progress to end before closing.
        failed: Outcomes of failed requests, until the next step hands them out.
        steps: A stepped model's patches between steps (None: one-pass model).
    """

    def __init__(self, steps: StepPool | None = None) -> None:
        self.steps = steps
        self.active: list[Request] = []
        self.releasing: list[Request] = []
        self.failed: list[ImageRequestOutput | TensorRequestOutput] = []

    # -- admission and dropping --------------------------------------------------------------

    def admit(self, request: Request) -> None:
        """Queue a request: lower ``priority`` first, then arrival order; start its reads."""
        keys = [(r.priority, r.arrival) for r in self.active]
        self.active.insert(bisect.bisect_right(keys, (request.priority, request.arrival)), request)
        request.start_reading()

    def abort(self, request_id: str) -> bool:
        """Drop a pending request and its queued patches; True if it was pending."""
        for req in self.active:
            if req.request_id == request_id:
                self.active.remove(req)
                if self.steps is not None:
                    self.steps.drop(req)
                self._retire(req)
                return True
        return False

    def fail(self, req: Request, exc: GeoServeError) -> None:
        """Fail ``req`` alone: drop it and queue its failed outcome (once; later calls no-op)."""
        if req.error is None:
            req.error = exc
            if self.steps is not None:
                self.steps.drop(req)
            self._retire(req)
            if req in self.active:
                self.active.remove(req)
            self.failed.append(req.result(error=exc))

    def fail_batch(self, batch: Sequence[Patch], exc: GeoServeError) -> None:
        """Fail the requests of ``batch``'s patches, which are out of the model now."""
        for patch in batch:
            patch.request.in_flight -= 1
            self.fail(patch.request, exc)

    def isolate(self, req: Request, stage: Stage) -> contextlib.AbstractContextManager[None]:
        """A block whose exceptions fail ``req`` alone (see :func:`failures.isolate`)."""
        return isolate(req, stage, self.fail)

    def _retire(self, req: Request) -> None:
        """Release a dropped request, later if one of its rows is being read right now.

        Its inputs cannot be closed under a running read, and waiting here would let one slow
        input (a remote host trickling bytes) stall every other request.
        """
        if req.stop_reading(wait=READ_WAIT_S):  # a local read ends in well under that
            req.close()
        else:
            self.releasing.append(req)

    def release_retired(self) -> None:
        """Close the dropped requests whose read has ended."""
        for req in list(self.releasing):
            if not req.reading:
                self.releasing.remove(req)
                req.close()

    def take_failed(self) -> list[ImageRequestOutput | TensorRequestOutput]:
        """The failed outcomes queued since the last call."""
        failed, self.failed = self.failed, []
        return failed

    def take_complete(self) -> Iterator[Request]:
        """Remove and yield each live request whose patches are all through the model."""
        for req in list(self.active):
            if req.error is None and req.is_complete:
                self.active.remove(req)
                yield req

    def live(self) -> list[Request]:
        """The pending requests not failed (a copy: they may fail while the caller iterates)."""
        return [r for r in self.active if r.error is None]

    def close(self) -> None:
        """Drop every request, pending or being released, and release its inputs."""
        for req in [*self.active, *self.releasing]:
            req.close()
        self.active.clear()
        self.releasing.clear()

    # -- batches -----------------------------------------------------------------------------

    def fill_batch(self, cap: int, cross_request: bool = True) -> list[Patch]:
        """Up to ``cap`` patches for one forward pass (see the module docstring).

        A request whose read fails is failed here, alone; with ``cross_request`` off a batch
        holds one request's patches only.
        """
        steps = self.steps
        if steps is None:
            return self._fill_new(cap, cross_request, wait=True)
        room = steps.room(cap)
        batch = self._fill_new(min(cap, room), cross_request, wait=len(steps) == 0) if room else []
        return batch or steps.take(cap, cross_request)

    def _fill_new(self, cap: int, cross_request: bool, *, wait: bool) -> list[Patch]:
        """Up to ``cap`` patches from the requests' rows.

        ``wait``: the request first in line keeps its turn while its row is read (not while
        stepped patches wait to run).
        """
        batch: list[Patch] = []
        signature: tuple[Any, ...] | None = None
        if self.active and wait:
            self.active[0].wait_for_row(TURN_WAIT_S)  # priority, then arrival order
        for req in list(self.active):
            if signature is not None and req.signature != signature:
                continue  # patches of another shape or other model arguments: a later batch
            with self.isolate(req, READ):
                while len(batch) < cap:
                    patch = req.pop_patch(wait=False)  # a row still being read: a later batch
                    if patch is None:
                        break
                    batch.append(patch)
                    signature = req.signature
            if len(batch) >= cap or (batch and not cross_request):
                break
        return batch

    def await_step(self, patches: Sequence[Patch]) -> None:
        """Patches of a stepped model that took a step: into the pool, for their next one."""
        if self.steps is None:
            raise TypeError("a one-pass model's patches take no further step")
        self.steps.add(patches)

    def wait_for_reads(self) -> bool:
        """Nothing to run: wait (briefly) for the first row still being read; True if one came."""
        pending = [f for f in (r.pending_read() for r in self.active) if f is not None]
        if pending:
            done, _ = futures.wait(
                pending, timeout=READ_WAIT_S, return_when=futures.FIRST_COMPLETED
            )
            return bool(done)
        if self.releasing:
            time.sleep(READ_WAIT_S)
        return False

    # -- what is pending ---------------------------------------------------------------------

    @property
    def oldest_arrival(self) -> float | None:
        """``time.monotonic()`` when the oldest pending request arrived (None: none pending)."""
        return min((r.arrival for r in self.active), default=None)

    def pending_ids(self) -> list[str]:
        """Ids of the requests still pending."""
        return [r.request_id for r in self.active]

    @property
    def queued_patches(self) -> int:
        """Patches of pending requests not yet through the model (skipped ones included)."""
        return sum(r.patches_left for r in self.active)

    def has_unfinished(self) -> bool:
        """Whether any request is pending, failed but not yet handed out, or being released."""
        return bool(self.active or self.failed or self.releasing)

    def progress(self, finished: int) -> tuple[int, int]:
        """(patches stitched, patches in all), counting ``finished`` patches already done.

        The pending requests' patches and those of requests finished before (``finished``).
        """
        active = self.active
        total = sum(r.num_patches for r in active) + finished
        stitched = sum(r.num_patches - len(r.queue) - r.in_flight for r in active)
        return finished + stitched, total
