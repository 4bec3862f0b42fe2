"""One request's state inside the engine: its inputs, plan, queued patches, canvas and sink.

Everything per request lives here (and in its frozen :class:`RasterContext`), never on a
processor, so one processor instance serves any number of concurrent requests.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from geoserve.engine.delivery import OutputSink
from geoserve.errors import GeoServeError
from geoserve.processors.base import InputProcessor, OutputProcessor, PatchRow, RasterContext
from geoserve.processors.canvas import Canvas
from geoserve.raster.source import RasterSource
from geoserve.schemas import OutFormat, StageTimings


@dataclass
class Patch:
    """One queued model input and where its output goes."""

    request: Request
    row: int
    col: int
    data: NDArray[np.float32]


@dataclass
class Request:
    """A request admitted into the engine (see the module docstring).

    ``tensor_shape`` is set for :meth:`Engine.transform` requests: the (C, T) shape patches are
    unfolded to before the model, and the result stays a tensor instead of becoming a raster.
    """

    request_id: str
    sources: Sequence[RasterSource]
    ctx: RasterContext
    in_proc: InputProcessor
    out_proc: OutputProcessor
    out_format: OutFormat = "path"
    output_path: Path | None = None
    tensor_shape: tuple[int, ...] | None = None
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
    priority: int = 0
    arrival: float = field(default_factory=time.monotonic)
    stitched: int = 0
    skipped: int = 0
    _prefetch: Future[PatchRow] | None = None

    def __post_init__(self) -> None:
        self.canvas = Canvas(self.ctx.grid)

    @property
    def rows_left(self) -> bool:
        """Whether grid rows remain to be read."""
        return self.next_row < self.ctx.grid.rows

    @property
    def patches_left(self) -> int:
        """Upper bound of patches still to go through the model (nodata skips lower it)."""
        return len(self.ctx.grid) - self.stitched - self.skipped

    @property
    def is_complete(self) -> bool:
        """All rows read, nothing queued or in the model."""
        return not self.rows_left and not self.queue and self.in_flight == 0

    @property
    def signature(self) -> tuple[Any, ...]:
        """What must match for patches to share a batch: patch shape and model arguments."""
        p = self.ctx.grid.patch_size
        if self.tensor_shape is not None:
            shape: tuple[int, ...] = (*self.tensor_shape, p, p)
        elif self.in_proc.num_frames > 1:
            shape = (len(self.ctx.bands), self.in_proc.num_frames, p, p)
        else:
            shape = (len(self.ctx.bands), p, p)
        return shape, tuple(sorted(self.ctx.model_kwargs))

    def pop_patch(self) -> Patch | None:
        """The next patch, reading grid rows as needed; None when no patches remain.

        Raises:
            GeoServeError: if reading fails (the caller fails this request alone).
        """
        while not self.queue and self.rows_left:
            t0 = time.perf_counter()
            if self._prefetch is not None:
                row = self._prefetch.result()
                self._prefetch = None
            else:
                row = self.in_proc.read_row(self.sources, self.ctx, self.next_row)
            self.canvas.expect(row.row, len(row.cols), row.core_valid)
            self.next_row += 1
            if self.reader is not None and self.rows_left:
                # read the next row while the model works on this one (GDAL drops the GIL);
                # only that thread touches this request's datasets until its result is taken
                self._prefetch = self.reader.submit(
                    self.in_proc.read_row, self.sources, self.ctx, self.next_row
                )
            patches = row.patches
            if self.tensor_shape is not None and len(patches):
                patches = patches.reshape(len(patches), *self.tensor_shape, *patches.shape[-2:])
            for col, data in zip(row.cols, patches, strict=False):
                self.queue.append(Patch(self, row.row, col, data))
            self.num_patches += len(row.cols)
            self.skipped += self.ctx.grid.cols - len(row.cols)
            self.timings.read += time.perf_counter() - t0
        if not self.queue:
            return None
        self.in_flight += 1
        return self.queue.popleft()

    def close(self) -> None:
        """Release inputs, queued patches and any unfinished output.

        Waits for a read or write in progress to stop first; a committed output stays.
        """
        if self._prefetch is not None:
            self._prefetch.cancel()
            with contextlib.suppress(Exception):
                self._prefetch.result()
            self._prefetch = None
        while self.writes:
            fut = self.writes.popleft()
            fut.cancel()
            with contextlib.suppress(Exception):
                fut.result()
        if self.sink is not None:
            self.sink.abort()
        for src in self.sources:
            src.close()
        self.queue.clear()
