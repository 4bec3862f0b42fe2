"""One request's state inside the engine: its inputs, plan, queued patches, canvases and sinks.

Everything per request lives here (and in its frozen :class:`RasterContext`), never on a
processor, so one processor instance serves any number of concurrent requests.

A :class:`Request` is a raster in and its output kinds out (:mod:`geoserve.engine.products`):
the model's output stitched on its canvas feeds every pixel kind, the encoder's tokens stitched
on a token canvas the ``embeddings`` kind. The other kind of request,
:class:`~geoserve.engine.tensor_request.TensorRequest` (:meth:`Engine.transform`), subclasses
it; the engine treats both alike, and what differs is asked of the request.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from geoserve.engine import transfer
from geoserve.engine.batch import Patch
from geoserve.engine.canvas import Canvas, RowBand
from geoserve.engine.prefetch import RowPrefetcher
from geoserve.engine.products import Product, commit_all
from geoserve.engine.transfer import DeviceSpan
from geoserve.errors import GeoServeError
from geoserve.processors.base import (
    InputProcessor,
    ModelInput,
    OutputProcessor,
    PatchRow,
    RasterContext,
)
from geoserve.processors.embeddings import token_grid, token_valid
from geoserve.raster.patch_embeddings import PatchEmbeddingSink
from geoserve.raster.sinks import OutputSink
from geoserve.raster.source import RasterSource
from geoserve.raster.write import OutputRaster
from geoserve.schemas import (
    ImageOutput,
    ImageRequestOutput,
    OutFormat,
    StageTimings,
    TensorRequestOutput,
)

if TYPE_CHECKING:
    from geoserve.engine.batch import PatchKeys

logger = logging.getLogger(__name__)


@dataclass
class Request:
    """A raster request admitted into the engine (see the module docstring).

    ``out_proc`` and ``sink`` are its first (or only) output kind's; ``more_outputs`` the
    further kinds of a request that asked for several, each fed the same blended rows.
    """

    request_id: str
    sources: Sequence[RasterSource]
    ctx: RasterContext
    in_proc: InputProcessor
    out_proc: OutputProcessor
    out_format: OutFormat = "path"
    output_path: Path | None = None
    canvas: Canvas = field(init=False)
    sink: OutputSink | None = None
    writes: deque[Future[None]] = field(default_factory=deque)
    timings: StageTimings = field(default_factory=StageTimings)
    queue: deque[Patch] = field(default_factory=deque)
    next_row: int = 0
    in_flight: int = 0
    num_patches: int = 0
    out_channels: int | None = None
    error: GeoServeError | None = None
    reader: Executor | None = None
    prefetch_rows: int = 2
    parallel_rows: int = 1  # rows of this request read at once (their cuts overlap)
    cut_on: torch.device | None = None
    stitch_on: torch.device | None = None
    priority: int = 0
    seed: int = 0  # of a generative model's draws (see geoserve.models.steps)
    arrival: float = field(default_factory=time.monotonic)
    stitched: int = 0
    skipped: int = 0
    #: Pixels of its class maps the model returned NaN or inf for (each pixel once).
    nonfinite_pixels: int = 0
    more_outputs: tuple[Product, ...] = ()
    token_size: int | None = None
    token_canvas: Canvas | None = field(init=False, default=None)
    token_channels: int | None = None
    patch_keys: PatchKeys | None = None  # its patches' keys in a shared cache (map tiles)
    #: Set when the request is aborted (timed out, its client gone): its commit stops.
    cancelled: threading.Event = field(default_factory=threading.Event)
    #: The forward passes of its patches (one entry per patch), for ``timings.device``.
    device_spans: list[DeviceSpan] = field(default_factory=list, repr=False)
    _rows: RowPrefetcher[PatchRow] = field(init=False)
    _waited_on: Future[PatchRow] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        for sink in (self.sink, *(p.sink for p in self.more_outputs)):
            if sink is not None:
                sink.cancelled = self.cancelled  # (its commit checks the request's flag)
        self.canvas = Canvas(self.ctx.grid, self.stitch_on)
        if self.token_size and any(p.kind == "embeddings" for p in self.products()):
            self.token_canvas = Canvas(token_grid(self.ctx.grid, self.token_size), self.stitch_on)
        self._rows = RowPrefetcher(
            self._fetch_row,
            self.ctx.grid.rows,
            self.reader,
            self.prefetch_rows,
            cut=self._cut_row,
            parallel=self.parallel_rows,
        )

    def _fetch_row(self, row: int) -> Any:
        return self.in_proc.fetch_row(self.sources, self.ctx, row, self.cut_on)

    def _cut_row(self, row: int, fetched: Any) -> PatchRow:
        return self.in_proc.cut_row(fetched, self.ctx, row, self.cut_on)

    def start_reading(self) -> None:
        """Start reading rows ahead on the engine's reader pool (called on admission)."""
        self._rows.start()

    def pending_read(self) -> Future[PatchRow] | None:
        """The read this request waits for, if it is still in progress."""
        return None if self.queue else self._rows.waiting_on()

    def wait_for_row(self, patience: float) -> None:
        """Wait up to ``patience`` s for the row being read, once per row.

        The engine calls this for the request first in line, so a prompt read keeps its turn
        while an input that stalls delays the others by at most ``patience`` per row.
        """
        pending = self.pending_read()
        if pending is not None and pending is not self._waited_on:
            self._waited_on = pending
            futures.wait([pending], timeout=patience)

    @property
    def reading(self) -> bool:
        """Whether one of its rows is being read right now (its sources are in use)."""
        return self._rows.reading

    def stop_reading(self, wait: float = 0.0) -> bool:
        """Read no further rows; wait up to ``wait`` s for a read in progress to end.

        Returns True when no read is running any more (the request can be closed at once).
        """
        self._rows.stop()
        return self._rows.settle(wait)

    @property
    def rows_left(self) -> bool:
        """Whether grid rows remain to be read."""
        return self.next_row < self.ctx.grid.rows

    @property
    def patches_left(self) -> int:
        """Upper bound of patches still to go through the model (nodata skips lower it)."""
        return len(self.ctx.grid) - self.stitched - self.skipped

    @property
    def memory_bytes(self) -> int:
        """Estimated peak memory of this request while it streams (:func:`memory_estimate`)."""
        from geoserve.engine.limits import memory_estimate  # (it builds on this module)

        return memory_estimate(self)

    def reads(self) -> list[tuple[RasterSource, tuple[int, ...]]]:
        """Each source of the request with the bands read from it."""
        if not self.ctx.modalities:
            return [(src, self.ctx.bands) for src in self.sources]
        return [
            (src, plan.ctx.bands)
            for plan in self.ctx.modalities
            for src in self.sources[plan.start : plan.stop]
        ]

    @property
    def input_pixels(self) -> int:
        """Pixels decoded over the whole request, every band of every input it reads.

        Each input counts at its own size (a warped input's, not the grid's).
        """
        return sum(src.read_cost(bands) for src, bands in self.reads())

    @property
    def is_complete(self) -> bool:
        """All rows read, nothing queued or in the model."""
        return not self.rows_left and not self.queue and self.in_flight == 0

    @property
    def signature(self) -> tuple[Any, ...]:
        """What must match for patches to share a batch: patch shape and model arguments."""
        return self.patch_shape(self.ctx.grid.patch_size), tuple(sorted(self.ctx.model_kwargs))

    def patch_shape(self, p: int) -> Any:
        """The shape of one model input patch (see :meth:`RasterContext.patch_shape`)."""
        return self.ctx.patch_shape(p, self.in_proc.num_frames)

    def _model_layout(self, patches: ModelInput) -> Sequence[ModelInput]:
        """A row's patches as the model takes them, one per patch column."""
        if isinstance(patches, Mapping):  # one dict of modalities per patch
            n = len(next(iter(patches.values()))) if patches else 0
            return [{k: v[i] for k, v in patches.items()} for i in range(n)]
        return patches  # type: ignore[return-value]  # (indexed along its first axis)

    def pop_patch(self, wait: bool = True) -> Patch | None:
        """The next patch, reading grid rows as needed; None when no patches remain.

        With ``wait=False`` it also returns None rather than wait for a row still being read
        (so one slow input never holds up the batches of the others).

        Raises:
            GeoServeError: if reading fails (the caller fails this request alone).
        """
        while not self.queue and self.rows_left:
            if not wait and not self._rows.next_ready():
                return None
            t0 = time.perf_counter()
            row = self._rows.next()  # read ahead on the reader pool while the model runs
            self.canvas.expect(row.row, len(row.cols), row.core_valid)
            if self.token_canvas is not None:
                assert self.token_size is not None
                valid = token_valid(row.core_valid, self.token_size)
                self.token_canvas.expect(row.row, len(row.cols), valid)
            self.next_row += 1
            for col, data in zip(row.cols, self._model_layout(row.patches), strict=False):
                self.queue.append(Patch(self, row.row, col, data))
            self.num_patches += len(row.cols)
            self.skipped += self.ctx.grid.cols - len(row.cols)
            self.timings.read += time.perf_counter() - t0
        if not self.queue:
            return None
        self.in_flight += 1
        return self.queue.popleft()

    # -- what its output is ----------------------------------------------------------------

    def products(self) -> list[Product]:
        """Every output kind of the request, in the order asked: processor and sink."""
        assert self.sink is not None
        first = Product(getattr(self.out_proc, "kind", "raw"), self.out_proc, self.sink)
        return [first, *self.more_outputs]

    @property
    def wants_tokens(self) -> bool:
        """Whether a kind of this request is made of the encoder's tokens."""
        return self.token_size is not None

    def add_tokens(self, row: int, col: int, tokens: Any) -> None:
        """One patch's tokens (D, P / t, P / t), on the stitching thread.

        Onto the token canvas (``embeddings``), and pooled into the patch embeddings.
        """
        self.token_channels = tokens.shape[0]
        if self.token_canvas is not None:
            self.token_canvas.add(row, col, tokens)
        for product in self.products():
            if isinstance(product.sink, PatchEmbeddingSink):
                pooled = (
                    tokens.mean(axis=(1, 2))
                    if isinstance(tokens, np.ndarray)
                    else transfer.to_host(tokens.mean(dim=(1, 2))).wait()
                )
                product.sink.add_patch(row, col, self.ctx.grid.core_window(row, col), pooled)

    def row_reducer(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """What runs on finished rows stitched on the device before they are copied back.

        Nothing when several kinds read the rows: each needs the blended values.
        """
        if self.more_outputs:
            return None
        return getattr(self.out_proc, "reduce_rows", None)  # duck-typed processors may lack it

    def to_raster(self, band: RowBand) -> OutputRaster:
        """One band of finished rows as output values (on the writer thread)."""
        return self.out_proc.finalize(band.data, band.valid, self.ctx)

    def write_band(self, band: RowBand, tokens: bool = False) -> None:
        """One band of finished rows into the sinks it feeds (on the writer thread).

        ``tokens``: rows of the token canvas, for the ``embeddings`` kind; else the model's
        output rows, for every pixel kind.
        """
        targets = []
        for i, p in enumerate(self.products()):
            if (p.kind == "embeddings") != tokens or p.kind == "patch-embeddings":
                continue
            targets.append((self.to_raster if i == 0 else partial(self._finalize, p.proc), p.sink))
        nonfinite = 0
        for make, sink in targets:
            t0 = time.perf_counter()
            raster = make(band)
            t1 = time.perf_counter()
            sink.write(band.row, raster)
            self.timings.finalize += t1 - t0
            self.timings.write += time.perf_counter() - t1
            nonfinite = max(nonfinite, raster.nonfinite)  # (classes and polygons: one map)
        self.nonfinite_pixels += nonfinite

    def _finalize(self, proc: OutputProcessor, band: RowBand) -> OutputRaster:
        return proc.finalize(band.data, band.valid, self.ctx)

    def commit(self) -> dict[str, ImageOutput]:
        """Finish every output kind, all or nothing (:func:`~geoserve.engine.products.commit_all`).

        Raises:
            OutputWriteError: naming the output that could not be finished.
        """
        return commit_all(self.products(), self.out_format)

    def result(
        self,
        output: ImageOutput | None = None,
        error: GeoServeError | None = None,
        by_kind: dict[str, ImageOutput] | None = None,
    ) -> ImageRequestOutput | TensorRequestOutput:
        """The request's finished outcome: its committed ``output``, or the ``error``.

        ``by_kind``: every output kind's (default: ``output``'s alone).
        """
        if by_kind is None:
            by_kind = {output.kind or "": output} if output is not None else {}
        self.timings.read_busy = self._rows.busy_seconds
        # each patch's share of its forward pass on the device (done by now: it was written)
        shares: dict[int, tuple[DeviceSpan, int]] = {}
        for span in self.device_spans:
            shares[id(span)] = (span, shares.get(id(span), (span, 0))[1] + 1)
        self.timings.device = sum(span.seconds() * k / span.patches for span, k in shares.values())
        return ImageRequestOutput(
            self.request_id,
            True,
            output,
            error,
            self.num_patches,
            self.timings,
            by_kind,
            self.nonfinite_pixels,
        )

    def close(self) -> None:
        """Release inputs, queued patches and any unfinished output.

        Waits for a read or write in progress to stop first; a committed output stays. Raises
        nothing but an interrupt (after finishing): it runs on every failure path, and whatever
        it cannot release (a temporary file in a directory that turned read-only) is logged,
        not allowed to stop the engine.
        """
        steps: list[Callable[[], object]] = [self._rows.close]
        while self.writes:
            fut = self.writes.popleft()
            fut.cancel()
            steps.append(partial(_settle, fut))
        if self.sink is not None:
            steps.append(self.sink.abort)
        steps.extend(product.sink.abort for product in self.more_outputs)
        steps.extend(src.close for src in self.sources)
        interrupted: BaseException | None = None
        for step in steps:
            try:
                step()
            except Exception:
                logger.exception("request %s: releasing it failed", self.request_id)
            except BaseException as exc:  # Ctrl-C / SIGTERM: finish releasing, then stop
                interrupted = exc
        self.queue.clear()
        if interrupted is not None:
            raise interrupted


def _settle(fut: Future[None]) -> None:
    """Wait for a cancelled or running write to stop; its own error was already handled."""
    with contextlib.suppress(Exception):  # a failed write already failed the request
        fut.result()
