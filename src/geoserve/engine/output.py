"""The output stage: model outputs into canvases, finished rows to the writer, outputs committed.

After each forward pass :meth:`OutputStage.stitch` places every output patch on its request's
:class:`~geoserve.engine.canvas.Canvas` (through the output processor's ``prepare_patch`` hook
on the host; as a tensor when the canvas is on the device). After each step
:meth:`OutputStage.emit` takes the rows no later patch can change and queues them on the
request's writer lane (:class:`~geoserve.engine.lanes.Lanes`, :data:`WRITE_WORKERS` threads
shared by all requests), which turns them into output values (:meth:`Request.to_raster`) and
hands them to the request's sink: one request's bands in order, several requests' at once, so
a slow or costly output (a noisy class map, many float bands) holds up no other request's. At
most :data:`MAX_PENDING_WRITES` bands wait per request before the model loop waits for its
writer (back-pressure). :meth:`OutputStage.finish` hands the
request's commit to a commit thread, which waits for its last writes, so a slow commit (tracing
polygons, converting to a COG) holds up neither the model loop nor other requests' writes;
:meth:`OutputStage.collect` hands out the requests whose commit is done. Anything that goes
wrong here fails its request alone.

Commits run on two pools. A request with a vector kind (``polygons``, ``patch-embeddings``)
commits on the vector pool, up to :data:`VECTOR_COMMIT_THREADS` at once; every other request
(GeoTIFFs renamed into place or converted to COGs, tensors) on the raster pool's
:data:`RASTER_COMMIT_THREADS`, so a plain request's commit never waits behind a polygon
request's. A vector commit's cost is bounded (the polygons' vertex budget,
:func:`~geoserve.raster.polygons.vertex_budget`), and a request aborted while committing
(:meth:`OutputStage.abandon`: timed out, its client gone) has its ``cancelled`` flag set: its
commit stops at its next check (the next polygon) and leaves no file.
"""

from __future__ import annotations

import os
import time
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from geoserve.engine.batch import BatchOutput
from geoserve.engine.canvas import RowBand
from geoserve.engine.failures import FINISH, STITCH, WRITE, Fail, isolate, request_error
from geoserve.engine.lanes import Lanes
from geoserve.engine.products import discard
from geoserve.engine.request import Request
from geoserve.errors import ModelOutputShapeError, RequestAbortedError
from geoserve.schemas import VECTOR_KINDS, ImageOutput, ImageRequestOutput, TensorRequestOutput

#: Output bands a request may have queued on the writer before the model loop waits for it.
MAX_PENDING_WRITES = 4
#: Writer threads shared by all requests (each request's bands in order on one of them at a
#: time; each also runs GDAL's compression threads, see :mod:`geoserve.raster.codecs`).
WRITE_WORKERS = max(1, min(4, os.cpu_count() or 1))
#: Commit threads of requests without a vector kind (a rename, a COG conversion).
RASTER_COMMIT_THREADS = 2
#: Commit threads of requests with a vector kind (tracing polygons), started as needed.
VECTOR_COMMIT_THREADS = 8


class OutputStage:
    """Stitches, writes and commits requests' outputs; see the module docstring.

    Args:
        fail: How a request is failed (the scheduler's :meth:`~Scheduler.fail`).
        writers: Writer threads shared by all requests.
    """

    def __init__(self, fail: Fail, writers: int = WRITE_WORKERS) -> None:
        self._fail = fail
        # writer threads turn finished rows into output values and write them: each request's
        # in order on its own lane, the lanes side by side
        self._writer = Lanes(writers, "geoserve-write")
        # commits (a file checked and renamed, polygons traced, a COG converted) run beside it,
        # each after its request's last write: a slow one holds up neither the model loop
        # nor the other requests' writes, and a vector one no raster one (module docstring)
        self._committer = ThreadPoolExecutor(
            RASTER_COMMIT_THREADS, thread_name_prefix="geoserve-commit"
        )
        self._vector_committer = ThreadPoolExecutor(
            VECTOR_COMMIT_THREADS, thread_name_prefix="geoserve-commit-vector"
        )
        self._finishing: list[tuple[Request, Future[dict[str, ImageOutput]]]] = []
        self._abandoned: set[str] = set()

    def stitch(self, part: BatchOutput) -> None:
        """Each output patch of ``part`` to its request's canvas."""
        assert part.out is not None
        for i, patch in enumerate(part.patches):
            req = patch.request
            req.in_flight -= 1
            if req.error is not None:
                continue
            t1 = time.perf_counter()
            with isolate(req, STITCH, self._fail):
                if req.canvas.device is not None:
                    result: Any = part.out[i]  # stays on the device
                    tokens: Any = part.tokens[i] if part.tokens is not None else None
                else:
                    assert part.host is not None
                    result = req.out_proc.prepare_patch(part.host[i])
                    tokens = part.host_tokens[i] if part.host_tokens is not None else None
                req.out_channels = result.shape[0]
                req.canvas.add(patch.row, patch.col, result)
                if req.wants_tokens:
                    if tokens is None:  # (a batch asks for tokens when one request does)
                        raise ModelOutputShapeError(
                            f"model returned no tokens for {req.request_id}"
                        )
                    req.add_tokens(patch.row, patch.col, tokens)
                req.stitched += 1
                req.timings.stitch += time.perf_counter() - t1
                req.timings.model += part.seconds
                req.timings.device_wait += part.wait_seconds
                if part.span is not None:
                    req.device_spans.append(part.span)

    def emit(self, req: Request, streaming: bool = True) -> None:
        """Queue the request's newly final output rows on its writer lane.

        Not ``streaming``, rows wait until the whole output is final. Also collects the
        writes done (and waits while more than :data:`MAX_PENDING_WRITES` are queued).
        """
        with isolate(req, WRITE, self._fail):
            fixed = req.out_proc.out_channels
            if req.out_channels or fixed or req.canvas.complete:
                # (rows that finished before any patch did, e.g. all nodata, wait until the
                # model has said how many channels it returns, unless the output processor
                # fixes it)
                min_rows = 1 if streaming else req.ctx.grid.height
                channels = req.out_channels or fixed or 1
                band = req.canvas.take_finished(
                    channels, min_rows=min_rows, reduce=req.row_reducer()
                )
                if band is not None:
                    req.writes.append(self._writer.submit(id(req), _write_band, req, band))
            tokens = req.token_canvas
            if tokens is not None and (req.token_channels or tokens.complete):
                min_rows = 1 if streaming else tokens.grid.height
                band = tokens.take_finished(req.token_channels or 1, min_rows=min_rows)
                if band is not None:
                    req.writes.append(self._writer.submit(id(req), _write_band, req, band, True))
            while req.writes and (req.writes[0].done() or len(req.writes) > MAX_PENDING_WRITES):
                req.writes.popleft().result()  # back-pressure, and the writer's errors

    def finish(self, req: Request) -> None:
        """Commit the request's outputs on a commit thread, after its last writes.

        Its outcome comes out of :meth:`collect` once the commit is done. A request with a
        vector kind commits on the vector pool, any other on the raster pool.
        """
        vector = any(p.kind in VECTOR_KINDS for p in req.products())
        pool = self._vector_committer if vector else self._committer
        self._finishing.append((req, pool.submit(_commit, req)))

    @property
    def finishing(self) -> int:
        """Requests whose outputs are being committed."""
        return len(self._finishing)

    def collect(self, wait: float = 0.0) -> list[ImageRequestOutput | TensorRequestOutput]:
        """The outcomes of the requests whose commit is done; each request released.

        ``wait``: seconds to wait for one when none is done yet (the loop has nothing else).
        """
        pending = [fut for _, fut in self._finishing]
        if wait and pending and not any(f.done() for f in pending):
            futures.wait(pending, timeout=wait, return_when=futures.FIRST_COMPLETED)
        done: list[ImageRequestOutput | TensorRequestOutput] = []
        for item in [x for x in self._finishing if x[1].done()]:
            self._finishing.remove(item)
            req, fut = item
            try:
                by_kind = fut.result()
                if req.request_id in self._abandoned:  # aborted while committing: undo
                    self._abandoned.discard(req.request_id)
                    discard(by_kind)
                    continue
                done.append(req.result(next(iter(by_kind.values())), by_kind=by_kind))
            except Exception as exc:  # fails this request alone, not the loop
                if req.request_id in self._abandoned:  # aborted: nobody waits for its outcome
                    self._abandoned.discard(req.request_id)
                    continue
                done.append(req.result(error=request_error(req, exc, FINISH)))
            finally:
                req.close()
        return done

    def abandon(self, request_id: str) -> bool:
        """A request being committed was aborted: its commit is told to stop.

        Its ``cancelled`` flag is set, so its commit stops at its next check; outputs it
        committed all the same are removed once it is done. True if it was being committed.
        """
        for req, _ in self._finishing:
            if req.request_id == request_id:
                req.cancelled.set()
                self._abandoned.add(request_id)
                return True
        return False

    def close(self) -> None:
        """Stop the writer threads once their queued writes and commits are done."""
        self._writer.close()
        self._committer.shutdown(wait=True)
        self._vector_committer.shutdown(wait=True)
        self.collect()  # (release the requests committed meanwhile; nobody waits for them)


def _commit(req: Request) -> dict[str, ImageOutput]:
    """Wait for the request's writes (on its writer lane), then commit its outputs."""
    while req.writes:
        req.writes.popleft().result()  # the writer's errors
    if req.cancelled.is_set():  # aborted while its commit waited for a thread
        raise RequestAbortedError(f"request {req.request_id} was aborted before its commit")
    t0 = time.perf_counter()
    by_kind = req.commit()
    req.timings.write += time.perf_counter() - t0
    return by_kind


def _write_band(req: Request, band: RowBand, tokens: bool = False) -> None:
    """Turn one band of blended rows into output values and write them (its writer lane).

    ``tokens``: a band of the token canvas (the embeddings kind's).
    """
    req.write_band(band, tokens)
