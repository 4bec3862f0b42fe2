"""The engine: admits requests, batches patches from all of them, and stitches results.

Each :meth:`Engine.step` fills one batch with up to ``max_batch_patches`` patches taken from the
pending requests in arrival order (a request's patches are read one grid row at a time, when
needed), runs one forward pass, and routes every output patch to its request's canvas. As soon as
a band of output rows is final, the output processor turns it into output values on the writer
thread and the request's sink writes it (streaming: memory follows the scene's width, not its
area). A request finishes when its last row is written and its output committed.

Failures stay with their request: a bad input fails only that request; a forward pass that
raises fails only the requests with patches in that batch; the engine keeps serving.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import datetime as dt
import logging
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast, overload

import numpy as np
import torch
from einops import rearrange
from numpy.typing import NDArray

from geoserve.engine.canvas import RowBand
from geoserve.engine.limits import (
    DEFAULT_MAX_PATCHES,
    MB,
    check_request,
    default_max_memory,
    warn_if_disk_short,
)
from geoserve.engine.model_loader import build_model, resolve_model
from geoserve.engine.request import Patch, Request
from geoserve.errors import (
    BandMismatchError,
    ConfigError,
    GeoServeError,
    ModelExecutionError,
    ModelOutputShapeError,
    NotGeoreferencedWarning,
    ProcessorMismatchError,
    count,
)
from geoserve.processors.base import InputProcessor, OutputProcessor, RasterContext
from geoserve.processors.patcher import GeoTiffPatcher
from geoserve.raster.dates import DateLike, dates_per_item, request_dates
from geoserve.raster.gdal_setup import default_read_workers, limit_gdal_cache
from geoserve.raster.sinks import ArraySink, OutputSink, make_sink, output_paths
from geoserve.raster.source import DataFormat, RasterArray, RasterLike, open_raster
from geoserve.raster.trust import DEFAULT_INPUT_FORMATS, check_formats
from geoserve.raster.write import OutputRaster
from geoserve.registry import ModelSpec
from geoserve.schemas import (
    OUT_FORMATS,
    ImageRequestOutput,
    OutFormat,
    TensorRequestOutput,
)

logger = logging.getLogger(__name__)

ImageInput = RasterLike | Sequence[RasterLike]

#: ``max_batch_patches="auto"`` on CPU, where larger batches stop paying off early.
AUTO_CPU_BATCH = 8
#: Most patches per batch ``"auto"`` picks on a GPU.
AUTO_MAX_BATCH = 256

#: Longest a step with nothing to run waits for a row still being read (then looks again).
READ_WAIT_S = 0.05
#: Longest the request first in line keeps its turn while one of its rows is read; after
#: that the requests behind it are served (so a stalled input costs them this once per row).
TURN_WAIT_S = 0.5

#: Output bands a request may have queued on the writer before the model loop waits for it.
MAX_PENDING_WRITES = 4
ProgressCallback = Callable[[int, int], None]


class Engine:
    """Serves one model: GeoTIFFs (or tensors) in, GeoTIFFs (or tensors) out.

    Args:
        model: A registered model name or a :class:`~geoserve.registry.ModelSpec`.
        weights: Local weights file loaded into the model (strict).
        device: Torch device for the forward passes.
        dtype: Autocast dtype (``torch.bfloat16``, ``"float16"`` ...); ``None`` runs float32.
        patch_size, stride, blend, bands: Override the input processor's configuration.
        output_kind: ``classes``, ``probabilities`` or ``raw``; default: the model's own.
        max_batch_patches: Most patches per forward pass, drawn from all pending requests;
            ``"auto"`` measures the model's memory per patch at start-up and fills 80 % of the
            free device memory on CUDA (at most 256), and takes 8 on CPU. A batch that runs
            out of device memory is split in two and retried, and the limit halved.
        compile: ``torch.compile`` the model (``True``, or a backend name such as ``"eager"``);
            batches are then padded to ``max_batch_patches`` so one graph serves them all.
        output_dir: Where ``out_format="path"`` outputs go when no path is given.
        warmup: Run one dummy patch at start-up to check the model against its processors.
        prefetch: Read each request's next rows of patches on a reader pool while the model
            runs (off: read them when the model needs them).
        read_workers: Reader threads shared by all requests (requests read in parallel);
            also the threads GDAL may use to decode one input's tiles. Default: the core
            count, at most 4.
        prefetch_rows: Grid rows each request keeps read ahead of the model (default 2).
        preprocess: Where the cast, normalisation and cutting into patches run, and where
            output patches are stitched: ``host`` (numpy; cutting in the reader pool) or
            ``device`` (torch on the model's device: raw uint16 rows go in, only finished
            output rows come back). Default ``auto``: ``device`` on CUDA, else ``host``.
        cross_request_batching: Fill batches from several requests (on by default); off, a
            batch holds one request's patches only (the baseline the server benchmark uses).
        streaming: Hand each band of finished output rows to the writer as soon as it is final
            (on by default). Off, a request's whole output is held until its last patch, as the
            peer tools do; the numbers are identical, only memory differs.
        cog: Write ``path`` and encoded outputs as Cloud-Optimized GeoTIFFs.
        allowed_formats: GDAL formats inputs may be in (default ``GTiff``, which covers COGs);
            any other content is refused without being parsed (see
            :mod:`geoserve.raster.trust`).
        max_patches: Most patches one request may have (``None``: no limit).
        max_request_mb: Most memory one request's estimate may take (default: 75 % of the
            machine's physical memory); see :mod:`geoserve.engine.limits`.

    Raises:
        UnknownModelError, ProcessorMismatchError, ConfigError, WeightsError: at start-up.
    """

    def __init__(
        self,
        model: str | ModelSpec,
        *,
        weights: str | Path | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | str | None = None,
        patch_size: int | None = None,
        stride: int | None = None,
        blend: str | None = None,
        bands: Sequence[int | str] | None = None,
        output_kind: str | None = None,
        max_batch_patches: int | str = 16,
        compile: bool | str = False,
        output_dir: str | Path | None = None,
        warmup: bool = True,
        prefetch: bool = True,
        cross_request_batching: bool = True,
        read_workers: int | None = None,
        prefetch_rows: int = 2,
        preprocess: str = "auto",
        streaming: bool = True,
        cog: bool = False,
        allowed_formats: Sequence[str] = DEFAULT_INPUT_FORMATS,
        max_patches: int | None = DEFAULT_MAX_PATCHES,
        max_request_mb: float | None = None,
    ) -> None:
        self.allowed_formats = check_formats(allowed_formats)
        self.max_patches = max_patches
        self.max_request_bytes = (
            default_max_memory() if max_request_mb is None else int(max_request_mb * MB)
        )
        self.spec, in_proc, out_proc = resolve_model(model)
        auto_batch = max_batch_patches == "auto"
        if not auto_batch and (not isinstance(max_batch_patches, int) or max_batch_patches < 1):
            raise ConfigError(
                f"invalid max_batch_patches: {max_batch_patches!r}; "
                "must be a positive integer or 'auto'"
            )
        for name, value, least in (
            ("read_workers", read_workers, 1),
            ("prefetch_rows", prefetch_rows, 0),
        ):
            if value is not None and (not isinstance(value, int) or value < least):
                raise ConfigError(f"invalid {name}: {value!r}; must be an integer >= {least}")
        if preprocess not in ("auto", "host", "device"):
            raise ConfigError(f"invalid preprocess {preprocess!r}; choose auto, host or device")
        self.max_batch_patches = 1 if auto_batch else cast(int, max_batch_patches)
        self.cross_request_batching = cross_request_batching
        self.streaming = streaming
        self.cog = cog
        try:
            self.in_proc = in_proc.replace(
                patch_size=patch_size,
                stride=stride,
                blend=blend,
                bands=tuple(bands) if bands is not None else None,
            )
        except ConfigError as exc:
            raise ConfigError(f"model {self.spec.name!r}: {exc}") from exc
        self.out_proc = out_proc.for_kind(output_kind) if output_kind else out_proc
        self.device = torch.device(device)
        self.dtype = _resolve_dtype(dtype)
        self._output_dir = Path(output_dir) if output_dir is not None else None
        limit_gdal_cache()
        self.model = build_model(self.spec, weights, self.device)
        self.compiled = bool(compile)
        if compile:
            backend = compile if isinstance(compile, str) else "inductor"
            self.model = cast(torch.nn.Module, torch.compile(self.model, backend=backend))
        if preprocess == "auto":
            preprocess = "device" if self.device.type == "cuda" else "host"
        self.preprocess = preprocess
        self._active: list[Request] = []
        self.last_batch_size = 0
        self.read_workers = read_workers or default_read_workers()
        self.prefetch_rows = prefetch_rows
        # a pool of reader threads reads every request's next grid rows during forward passes
        self._reader = (
            ThreadPoolExecutor(self.read_workers, thread_name_prefix="geoserve-read")
            if prefetch and prefetch_rows > 0
            else None
        )
        # one writer thread turns finished rows into output values and writes them, in order
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="geoserve-write")
        self._failed: list[ImageRequestOutput | TensorRequestOutput] = []
        self._releasing: list[Request] = []  # dropped, waiting for a read in progress to end
        if warmup or auto_batch:
            probe = self._warmup()
            if auto_batch:
                self.max_batch_patches = (
                    AUTO_CPU_BATCH if probe is None else self._auto_batch(probe)
                )

    # -- set-up ------------------------------------------------------------------------------

    def _warmup(self) -> Patch | None:
        """Run one dummy patch to check the model's output against the output processor.

        None when the model refuses the dummy but the input processor fixes no band count (the
        dummy's 3 bands need not be what the model takes): the first request checks it.
        """
        dummy = self.in_proc.dummy_input(seed=0)
        req = self._new_request([dummy] * self.in_proc.num_frames, "warmup", "tensor", None)
        patch = req.pop_patch()
        req.close()
        assert patch is not None  # dummy inputs have no nodata
        try:
            out = self._forward([patch])
        except ModelExecutionError as exc:
            if self.in_proc.in_channels is None:
                logger.warning(
                    "model %r: warm-up skipped; it refused a %d-band dummy input and its input "
                    "processor fixes no band count (set bands= on it to check at start-up)",
                    self.spec.name,
                    patch.data.shape[0],
                )
                return None
            raise ModelExecutionError(f"warm-up on a dummy input: {exc}") from exc
        want = self.out_proc.out_channels
        if want is not None and out.shape[1] != want:
            raise ProcessorMismatchError(
                f"model {self.spec.name!r} returns {out.shape[1]} channels but its output "
                f"processor expects {want}"
            )
        return patch

    def _auto_batch(self, probe: Patch) -> int:
        """The batch size for ``max_batch_patches="auto"``; see the class docstring."""
        if self.device.type != "cuda":
            return AUTO_CPU_BATCH
        n = 4
        torch.cuda.synchronize(self.device)
        base = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self._forward([probe] * n)
        per_patch = max(1.0, (torch.cuda.max_memory_allocated(self.device) - base) / n)
        free, _ = torch.cuda.mem_get_info(self.device)
        fit = int(0.8 * free / per_patch)
        batch = 1 << max(0, min(fit, AUTO_MAX_BATCH).bit_length() - 1)  # a power of two
        logger.info("auto batch: %.0f MB per patch, %d patches per batch", per_patch / 1e6, batch)
        return batch

    def close(self) -> None:
        """Drop pending requests, release their inputs and stop the reader thread."""
        for req in [*self._active, *self._releasing]:
            req.close()
        self._active.clear()
        self._releasing.clear()
        if self._reader is not None:
            self._reader.shutdown(wait=True)
            self._reader = None
        self._writer.shutdown(wait=True)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def output_dir(self) -> Path:
        """Directory for outputs without an explicit path (a temporary one by default)."""
        if self._output_dir is None:
            self._output_dir = Path(tempfile.mkdtemp(prefix="geoserve-"))
        return self._output_dir

    # -- admission ---------------------------------------------------------------------------

    def _new_request(
        self,
        inputs: Sequence[RasterLike],
        request_id: str,
        out_format: OutFormat,
        output_path: Path | None,
        data_format: DataFormat = "auto",
        in_proc: InputProcessor | None = None,
        out_proc: OutputProcessor | None = None,
        tensor_shape: tuple[int, ...] | None = None,
        priority: int = 0,
        dates: Sequence[dt.date | None] | None = None,
    ) -> Request:
        proc = in_proc or self.in_proc
        sources = []
        try:
            for i, item in enumerate(inputs):
                src = open_raster(
                    item, data_format, threads=self.read_workers, formats=self.allowed_formats
                )
                sources.append(src)
                if dates is not None and dates[i] is not None:  # given: wins over tags and name
                    src.info = dataclasses.replace(src.info, date=dates[i])
            ctx = proc.prepare(sources)
        except BaseException as exc:
            for src in sources:
                src.close()
            wanted = getattr(proc, "bands", None)
            if isinstance(exc, BandMismatchError) and wanted:
                raise BandMismatchError(
                    f"{exc}; model {self.spec.name!r} reads bands "
                    f"{', '.join(map(str, wanted))} (choose others with --bands on the command "
                    "line, bands= in Python or options.bands over HTTP)"
                ) from exc
            raise
        grid = ctx.grid
        try:
            sink: OutputSink
            if tensor_shape is not None:
                sink = ArraySink(grid.height, grid.width)
            else:
                path = None
                if out_format == "path":
                    path = output_path or self.output_dir / f"{request_id}.tif"
                sink = make_sink(
                    out_format, path, ctx.profile, grid.height, grid.width, cog=self.cog
                )
        except BaseException:
            for src in sources:
                src.close()
            raise
        req = Request(
            request_id,
            sources,
            ctx,
            proc,
            out_proc or self.out_proc,
            out_format,
            output_path,
            tensor_shape=tensor_shape,
            sink=sink,
            reader=self._reader,
            prefetch_rows=self.prefetch_rows,
            cut_on=self.device if self.preprocess == "device" else None,
            stitch_on=self._stitch_device(out_proc or self.out_proc),
            priority=priority,
        )
        try:
            check_request(req, self.max_patches, self.max_request_bytes)
            if out_format == "path" and req.sink is not None and tensor_shape is None:
                warn_if_disk_short(output_path or self.output_dir / f"{request_id}.tif", req)
        except BaseException:
            req.close()
            raise
        return req

    def _stitch_device(self, out_proc: OutputProcessor) -> torch.device | None:
        """Where a request's canvas lives: on the device with ``preprocess="device"``.

        Not when its output processor hooks into each patch (``prepare_patch`` takes numpy).
        """
        if self.preprocess != "device":
            return None
        if getattr(type(out_proc), "prepare_patch", None) is not OutputProcessor.prepare_patch:
            return None
        return self.device

    def prepare_request(
        self,
        inputs: ImageInput,
        *,
        request_id: str | None = None,
        output_path: str | Path | None = None,
        out_format: OutFormat = "path",
        data_format: DataFormat = "auto",
        bands: Sequence[int | str] | None = None,
        output_kind: str | None = None,
        priority: int = 0,
        dates: DateLike | Sequence[DateLike] | None = None,
    ) -> Request:
        """Open and check one request's inputs (headers only, no pixels) without admitting it.

        Safe to call from any thread: it reads the engine's configuration and nothing else.
        ``bands`` and ``output_kind`` override the model's defaults for this request only.
        ``dates`` gives the acquisition date of each input (ISO strings, ``date`` or
        ``datetime`` objects, one per input; ``None`` for one: from its tags or file name),
        for models that take dates; they win over the inputs' tags and file names.

        Raises:
            GeoServeError: a subclass naming the file, band or field at fault.
        """
        if out_format not in OUT_FORMATS:
            raise ConfigError(
                f"invalid out_format {out_format!r}; choose one of {', '.join(OUT_FORMATS)}"
            )
        items = cast(
            list[RasterLike], list(inputs) if isinstance(inputs, list | tuple) else [inputs]
        )
        in_proc = self.in_proc.replace(bands=tuple(bands)) if bands is not None else None
        out_proc = self.out_proc.for_kind(output_kind) if output_kind else None
        path = Path(output_path) if output_path is not None else None
        rid = request_id or uuid.uuid4().hex[:12]
        when = request_dates(dates, len(items))
        return self._new_request(
            items,
            rid,
            out_format,
            path,
            data_format,
            in_proc,
            out_proc,
            priority=priority,
            dates=when,
        )

    def admit(self, request: Request) -> None:
        """Queue a prepared request: lower ``priority`` first, then arrival order."""
        keys = [(r.priority, r.arrival) for r in self._active]
        self._active.insert(bisect.bisect_right(keys, (request.priority, request.arrival)), request)
        request.start_reading()

    def abort_request(self, request_id: str) -> bool:
        """Drop a pending request and its queued patches; True if it was pending."""
        for req in self._active:
            if req.request_id == request_id:
                self._active.remove(req)
                self._retire(req)
                return True
        return False

    def _retire(self, req: Request) -> None:
        """Release a dropped request, later if one of its rows is being read right now.

        Its inputs cannot be closed under a running read, and waiting here would let one slow
        input (a remote host trickling bytes) stall every other request.
        """
        if req.stop_reading(wait=READ_WAIT_S):  # a local read ends in well under that
            req.close()
        else:
            self._releasing.append(req)

    def _release_retired(self) -> None:
        for req in list(self._releasing):
            if not req.reading:
                self._releasing.remove(req)
                req.close()

    def add_request(
        self,
        inputs: ImageInput,
        *,
        request_id: str | None = None,
        output_path: str | Path | None = None,
        out_format: OutFormat = "path",
        data_format: DataFormat = "auto",
        priority: int = 0,
        dates: DateLike | Sequence[DateLike] | None = None,
    ) -> str:
        """Admit one request; its patches join the next batches. Returns the request id.

        ``inputs`` is one raster, or a list of rasters as the dates of one place; ``dates``
        their acquisition dates, as for :meth:`prepare_request`. A request whose input cannot
        be opened is not raised here: it comes back, failed, from the next :meth:`step`.
        """
        rid = request_id or uuid.uuid4().hex[:12]
        try:
            req = self.prepare_request(
                inputs,
                request_id=rid,
                output_path=output_path,
                out_format=out_format,
                data_format=data_format,
                priority=priority,
                dates=dates,
            )
        except GeoServeError as exc:
            self._failed.append(ImageRequestOutput(rid, finished=True, error=exc))
            return rid
        self.admit(req)
        return rid

    @property
    def oldest_arrival(self) -> float | None:
        """``time.monotonic()`` when the oldest pending request arrived (None: none pending)."""
        return min((r.arrival for r in self._active), default=None)

    def pending_ids(self) -> list[str]:
        """Ids of the requests still pending."""
        return [r.request_id for r in self._active]

    @property
    def queued_patches(self) -> int:
        """Patches of pending requests not yet through the model (skipped ones included)."""
        return sum(r.patches_left for r in self._active)

    def has_unfinished(self) -> bool:
        """Whether any request is still pending (or still to be released)."""
        return bool(self._active or self._failed or self._releasing)

    # -- the loop ----------------------------------------------------------------------------

    def _fill_batch(self) -> list[Patch]:
        batch: list[Patch] = []
        signature: tuple[Any, ...] | None = None
        if self._active:
            self._active[0].wait_for_row(TURN_WAIT_S)  # priority, then arrival order
        for req in list(self._active):
            if signature is not None and req.signature != signature:
                continue  # patches of another shape or other model arguments: a later batch
            while len(batch) < self.max_batch_patches:
                try:
                    patch = req.pop_patch(wait=False)  # a row still being read: a later batch
                except GeoServeError as exc:
                    self._fail(req, exc)
                    break
                except Exception as exc:  # unexpected: log it, fail this request alone
                    logger.exception("reading request %s failed", req.request_id)
                    self._fail(req, GeoServeError(f"{req.ctx.names[0]}: read failed: {exc!r}"))
                    break
                if patch is None:
                    break
                batch.append(patch)
                signature = req.signature
            if len(batch) >= self.max_batch_patches or (batch and not self.cross_request_batching):
                break
        return batch

    def _wait_for_reads(self) -> bool:
        """Nothing to run: wait (briefly) for the first row still being read; True if one came."""
        pending = [f for f in (r.pending_read() for r in self._active) if f is not None]
        if pending:
            done, _ = futures.wait(
                pending, timeout=READ_WAIT_S, return_when=futures.FIRST_COMPLETED
            )
            return bool(done)
        if self._releasing:
            time.sleep(READ_WAIT_S)
        return False

    def step(self) -> list[ImageRequestOutput | TensorRequestOutput]:
        """Run one batch; return the requests that finished (or failed) during it."""
        self._release_retired()
        batch = self._fill_batch()
        if not batch and not self._failed and self._wait_for_reads():
            batch = self._fill_batch()  # a row arrived while we waited
        self.last_batch_size = len(batch)
        if batch:
            self._run_batch(batch)
        for req in list(self._active):
            if req.error is None:
                self._emit(req)
        done: list[ImageRequestOutput | TensorRequestOutput] = self._failed
        self._failed = []
        for req in list(self._active):
            if req.error is None and req.is_complete:
                self._active.remove(req)
                done.append(self._finish(req))
        return done

    # -- output rows -------------------------------------------------------------------------

    def _emit(self, req: Request) -> None:
        """Queue the request's newly final output rows on the writer thread.

        Anything that goes wrong here (an output processor's bug, a failed write) fails this
        request alone.
        """
        try:
            fixed = req.out_proc.out_channels
            if req.out_channels or fixed or req.canvas.complete:
                # (rows that finished before any patch did, e.g. all nodata, wait until the
                # model has said how many channels it returns, unless the output processor
                # fixes it)
                min_rows = 1 if self.streaming else req.ctx.grid.height
                channels = req.out_channels or fixed or 1
                reduce = None
                if req.tensor_shape is None:  # duck-typed processors may not have it
                    reduce = getattr(req.out_proc, "reduce_rows", None)
                band = req.canvas.take_finished(channels, min_rows=min_rows, reduce=reduce)
                if band is not None:
                    req.writes.append(self._writer.submit(self._write_band, req, band))
            while req.writes and (req.writes[0].done() or len(req.writes) > MAX_PENDING_WRITES):
                req.writes.popleft().result()  # back-pressure, and the writer's errors
        except GeoServeError as exc:
            self._fail(req, exc)
        except Exception as exc:
            logger.exception("output of request %s failed", req.request_id)
            self._fail(req, _output_failed(req, exc))

    @staticmethod
    def _write_band(req: Request, band: RowBand) -> None:
        """Turn one band of blended rows into output values and write them (writer thread)."""
        assert req.sink is not None
        t0 = time.perf_counter()
        if req.tensor_shape is not None:
            raster = OutputRaster(band.data)
        else:
            raster = req.out_proc.finalize(band.data, band.valid, req.ctx)
        t1 = time.perf_counter()
        req.sink.write(band.row, raster)
        req.timings.stitch += t1 - t0
        req.timings.write += time.perf_counter() - t1

    def _run_batch(self, batch: list[Patch]) -> None:
        """One forward pass and the stitching of its outputs.

        A forward pass that raises is retried as two halves, down to single patches, so only
        the requests whose own patches make the model fail are failed (a batch of B patches
        with one poisoned patch costs about 2 log2(B) extra passes).
        """
        live = [p for p in batch if p.request.error is None]
        for patch in batch:
            if patch.request.error is not None:  # its request failed in an earlier half
                patch.request.in_flight -= 1
        if not live:
            return
        batch = live
        t0 = time.perf_counter()
        host: NDArray[np.float32] | None = None
        try:
            out = self._forward_fitting(batch)
            if any(p.request.canvas.device is None for p in batch):
                # one copy of the batch back to the host; on a GPU this is also where an
                # asynchronous error of the forward pass surfaces, so it is retried like one
                host = cast(NDArray[np.float32], out.cpu().numpy())
        except Exception as exc:
            if len(batch) > 1:
                logger.warning(
                    "forward pass of %d patches failed (%r); retrying each half", len(batch), exc
                )
                half = (len(batch) + 1) // 2
                self._run_batch(batch[:half])
                self._run_batch(batch[half:])
                return
            if isinstance(exc, ModelExecutionError):  # the model raised: name the input too
                logger.error("forward pass failed on a single patch: %s", exc)
                exc = ModelExecutionError(f"{batch[0].request.ctx.names[0]}: {exc}")
            elif not isinstance(exc, GeoServeError):
                logger.exception("forward pass failed on a single patch")
                exc = ModelExecutionError(
                    f"model {self.spec.name!r} failed on a patch of this request "
                    f"({batch[0].request.ctx.names[0]}): {exc!r}"
                )
            self._fail_batch(batch, exc)
            return
        self._stitch(batch, out, host, (time.perf_counter() - t0) / len(batch))

    def _stitch(
        self,
        batch: list[Patch],
        out: torch.Tensor,
        host: NDArray[np.float32] | None,
        share: float,
    ) -> None:
        """Each output patch to its request's canvas; a failure fails that request alone."""
        for i, patch in enumerate(batch):
            req = patch.request
            req.in_flight -= 1
            if req.error is not None:
                continue
            t1 = time.perf_counter()
            try:
                if req.canvas.device is not None:
                    result: Any = out[i]  # stays on the device
                else:
                    assert host is not None
                    result = req.out_proc.prepare_patch(host[i])
                req.out_channels = result.shape[0]
                req.canvas.add(patch.row, patch.col, result)
            except GeoServeError as exc:
                self._fail(req, exc)
                continue
            except Exception as exc:  # an output processor's bug: this request alone
                logger.exception("stitching a patch of request %s failed", req.request_id)
                self._fail(req, _output_failed(req, exc))
                continue
            req.stitched += 1
            req.timings.stitch += time.perf_counter() - t1
            req.timings.model += share

    def _forward_fitting(self, batch: list[Patch]) -> torch.Tensor:
        """:meth:`_forward`, splitting the batch in two while the device runs out of memory."""
        try:
            return self._forward(batch)
        except torch.OutOfMemoryError:
            if len(batch) == 1:
                raise
        half = (len(batch) + 1) // 2
        if self.max_batch_patches > half:
            logger.warning(
                "out of device memory at %d patches per batch; continuing with %d",
                len(batch),
                half,
            )
            self.max_batch_patches = half
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        parts = [self._forward_fitting(batch[:half]), self._forward_fitting(batch[half:])]
        return torch.cat(parts)

    def _forward(self, batch: list[Patch]) -> torch.Tensor:
        """One forward pass: (B, C_out, P, P) float32 on the model's device."""
        x = _stack([p.data for p in batch], self.device)
        kwargs: dict[str, Any] = {}
        for key in batch[0].request.ctx.model_kwargs:
            vals = np.stack([p.request.ctx.model_kwargs[key] for p in batch])
            kwargs[key] = torch.from_numpy(vals).to(self.device)
        n = x.shape[0]
        if self.compiled and n < self.max_batch_patches:  # one batch shape: no recompiles
            pad = self.max_batch_patches - n
            x = torch.cat([x, x[-1:].expand(pad, *x.shape[1:])])
            kwargs = {
                k: torch.cat([v, v[-1:].expand(pad, *v.shape[1:])]) for k, v in kwargs.items()
            }
        try:
            with torch.inference_mode(), self._autocast():
                y = self.model(x, **kwargs)
        except (torch.OutOfMemoryError, GeoServeError):
            raise
        except Exception as exc:
            raise self._model_failed(batch[0].request.ctx, x, exc) from exc
        if isinstance(y, tuple | list):
            y = y[0]
        if not isinstance(y, torch.Tensor):
            raise ModelOutputShapeError(
                f"model {self.spec.name!r} returned {type(y).__name__}, not a tensor"
            )
        if x.shape[0] != n and isinstance(y, torch.Tensor) and y.shape[0] == x.shape[0]:
            x, y = x[:n], y[:n]  # drop the padding
        if y.ndim == 5:  # (B, C, T, H, W): one band per (date, channel)
            y = rearrange(y, "b c t h w -> b (t c) h w")
        p = x.shape[-1]
        if y.ndim != 4 or y.shape[0] != x.shape[0] or tuple(y.shape[-2:]) != (p, p):
            raise ModelOutputShapeError(
                f"model {self.spec.name!r} returned shape {tuple(y.shape)} for input "
                f"{tuple(x.shape)}; expected (batch={x.shape[0]}, channels, {p}, {p})"
            )
        return y.float()

    def _model_failed(
        self, ctx: RasterContext, x: torch.Tensor, exc: Exception
    ) -> ModelExecutionError:
        """The model raised: say which model, what it was given and where that came from."""
        names = ", ".join(ctx.band_names)
        return ModelExecutionError(
            f"model {self.spec.name!r} failed on input of shape {tuple(x.shape)} "
            f"({count(len(ctx.bands), 'band')} from its input processor: {names}): "
            f"{type(exc).__name__}: {exc}"
        )

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def _fail(self, req: Request, exc: GeoServeError) -> None:
        if req.error is None:
            req.error = exc
            self._retire(req)
            if req in self._active:
                self._active.remove(req)
            out_cls = TensorRequestOutput if req.tensor_shape is not None else ImageRequestOutput
            self._failed.append(
                out_cls(
                    req.request_id,
                    finished=True,
                    error=exc,
                    num_patches=req.num_patches,
                    timings=req.timings,
                )
            )

    def _fail_batch(self, batch: list[Patch], exc: GeoServeError) -> None:
        for patch in batch:
            patch.request.in_flight -= 1
            self._fail(patch.request, exc)

    # -- finishing ---------------------------------------------------------------------------

    def _finish(self, req: Request) -> ImageRequestOutput | TensorRequestOutput:
        out_cls = TensorRequestOutput if req.tensor_shape is not None else ImageRequestOutput
        try:
            while req.writes:
                req.writes.popleft().result()
            assert req.sink is not None
            t0 = time.perf_counter()
            output = req.sink.commit(req.out_format)
            req.timings.write += time.perf_counter() - t0
            if req.tensor_shape is not None:
                return TensorRequestOutput(
                    req.request_id, True, output.tensor, None, req.num_patches, req.timings
                )
            return ImageRequestOutput(
                req.request_id, True, output, None, req.num_patches, req.timings
            )
        except GeoServeError as exc:
            return out_cls(req.request_id, True, None, exc, req.num_patches, req.timings)
        except Exception as exc:  # a bug in an output processor: fail this request, not the loop
            logger.exception("finishing request %s failed", req.request_id)
            err = _output_failed(req, exc)
            return out_cls(req.request_id, True, None, err, req.num_patches, req.timings)
        finally:
            req.close()

    # -- offline API -------------------------------------------------------------------------

    def run_until_done(
        self, progress: ProgressCallback | None = None
    ) -> Iterator[ImageRequestOutput | TensorRequestOutput]:
        """Step until no request is pending, yielding each finished request."""
        done = 0
        while self.has_unfinished():
            for result in self.step():
                done += result.num_patches
                yield result
            if progress is not None:
                total = sum(r.num_patches for r in self._active) + done
                stitched = done + sum(
                    r.num_patches - len(r.queue) - r.in_flight for r in self._active
                )
                progress(stitched, total)

    @overload
    def generate_image(
        self,
        x_or_list: list[ImageInput],
        *,
        output_path: str | Path | None = None,
        out_format: OutFormat = "path",
        data_format: DataFormat = "auto",
        progress: ProgressCallback | None = None,
        dates: Sequence[Any] | None = None,
    ) -> list[ImageRequestOutput]: ...

    @overload
    def generate_image(
        self,
        x_or_list: RasterLike,
        *,
        output_path: str | Path | None = None,
        out_format: OutFormat = "path",
        data_format: DataFormat = "auto",
        progress: ProgressCallback | None = None,
        dates: DateLike | Sequence[DateLike] | None = None,
    ) -> ImageRequestOutput: ...

    def generate_image(
        self,
        x_or_list: RasterLike | list[ImageInput],
        *,
        output_path: str | Path | None = None,
        out_format: OutFormat = "path",
        data_format: DataFormat = "auto",
        progress: ProgressCallback | None = None,
        dates: Any = None,
    ) -> ImageRequestOutput | list[ImageRequestOutput]:
        """Run one input, or a list of inputs, to completion.

        A single input returns its :class:`ImageRequestOutput` and raises its error if it
        failed. A list returns one output per item, in input order; failed items carry their
        ``error`` and do not affect the others. A list item that is itself a list holds the
        dates of one place. For a list, ``output_path`` is a directory.

        ``dates`` are the inputs' acquisition dates (ISO strings, ``date`` or ``datetime``
        objects), for models that take dates: one per input raster, in order, or nested like
        the inputs (``[["2020-05-01", "2020-06-01"]]`` for ``[["a.tif", "b.tif"]]``). They win
        over the inputs' date tags and file-name stamps.

        Raises:
            GeoServeError: for a single input that failed; InputError: ``dates`` does not
            match the inputs.
        """
        single = not isinstance(x_or_list, list)
        items = cast(list[ImageInput], [x_or_list] if single else list(x_or_list))  # type: ignore[arg-type]
        paths = self._output_paths(items, output_path, out_format, single)
        per_item = [dates] if single else dates_per_item(items, dates)
        ids = [
            self.add_request(
                item, output_path=path, out_format=out_format, data_format=data_format, dates=when
            )
            for item, path, when in zip(items, paths, per_item, strict=False)
        ]
        results = {r.request_id: r for r in self.run_until_done(progress)}
        outputs = [cast(ImageRequestOutput, results[i]) for i in ids]
        if single:
            return outputs[0].raise_for_error()
        return outputs

    def _output_paths(
        self,
        items: Sequence[ImageInput],
        output_path: str | Path | None,
        out_format: str,
        single: bool,
    ) -> list[Path | None]:
        if out_format != "path" or output_path is None:
            return [None] * len(items)
        if single:
            return [Path(output_path)]
        return list(output_paths(items, output_path))

    def transform(self, tensors: Sequence[torch.Tensor]) -> list[TensorRequestOutput]:
        """Run already-normalised tensors through the model, batched like image requests.

        Each tensor is (C, H, W) or (C, T, H, W) of any size; it is tiled with this engine's
        patch grid and the blended raw model output (C_out, H, W) comes back in ``.tensors``.
        """
        proc = GeoTiffPatcher(
            patch_size=self.in_proc.patch_size,
            stride=self.in_proc.stride,
            blend=self.in_proc.blend,  # type: ignore[arg-type]
        )
        ids = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NotGeoreferencedWarning)
            for i, t in enumerate(tensors):
                ids.append(self._add_tensor(i, t, proc))
        results = {r.request_id: r for r in self.run_until_done()}
        return [cast(TensorRequestOutput, results[i]) for i in ids]

    def _add_tensor(self, i: int, t: torch.Tensor, proc: InputProcessor) -> str:
        rid = uuid.uuid4().hex[:12]
        arr = t.detach().cpu().float().numpy()
        if arr.ndim not in (3, 4):
            shape = tuple(arr.shape)
            err = ConfigError(f"tensor {i} has shape {shape}; expected (C, H, W) or (C, T, H, W)")
            self._failed.append(TensorRequestOutput(rid, True, None, err))
            return rid
        flat = RasterArray(arr.reshape(-1, *arr.shape[-2:]), name=f"<tensor {i}>")
        try:
            req = self._new_request(
                [flat], rid, "tensor", None, in_proc=proc, tensor_shape=tuple(arr.shape[:-2])
            )
        except GeoServeError as exc:
            self._failed.append(TensorRequestOutput(rid, True, None, exc))
            return rid
        self.admit(req)
        return rid


def _stack(datas: list[NDArray[np.float32] | torch.Tensor], device: torch.device) -> torch.Tensor:
    """One batch tensor on ``device`` from host arrays or (already moved) device tensors."""
    if all(isinstance(d, np.ndarray) for d in datas):
        return torch.from_numpy(np.stack(datas)).to(device, non_blocking=True)  # type: ignore[arg-type]
    return torch.stack([torch.as_tensor(d).to(device) for d in datas])


def _output_failed(req: Request, exc: BaseException) -> GeoServeError:
    return GeoServeError(f"{req.ctx.names[0]}: output processing failed: {exc!r}")


def _resolve_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    names = {
        "float32": None,
        "fp32": None,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if dtype not in names:
        raise ConfigError(f"invalid dtype {dtype!r}; choose one of {', '.join(names)}")
    return names[dtype]
