"""The engine: admits requests, batches patches from all of them, and stitches results.

:class:`Engine` holds the public API and composes four parts, one job each:

- admission (:mod:`geoserve.engine.admission`, a base class of ``Engine``): a request's
  inputs opened and checked, its :class:`Request` built with a sink per output kind
  (:mod:`geoserve.engine.products`), size guards applied;
- the :class:`~geoserve.engine.scheduler.Scheduler`: the pending requests, and which of their
  patches go into the next batch (rows read ahead on the reader pool);
- the :class:`~geoserve.engine.runner.ModelRunner`: the forward pass over a batch;
- the :class:`~geoserve.engine.output.OutputStage`: outputs stitched into each request's
  canvas, bands of finished rows handed to the writer thread (streaming: memory follows the
  scene's width, not its area), outputs committed on a commit thread.

Each :meth:`Engine.step` fills one batch, runs it, stitches it, emits finished rows and returns
the requests whose outputs were committed (or that failed) meanwhile. Failures stay with their
request (:mod:`geoserve.engine.failures`): a bad input fails only that request; a forward pass
that raises fails only the requests whose own patches make it fail; the engine keeps serving.
"""

from __future__ import annotations

import logging
import uuid
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, cast, overload

import torch

from geoserve.config import EngineConfig
from geoserve.engine.admission import Admission, ImageInput
from geoserve.engine.batch import Patch
from geoserve.engine.cpu_inference import check_cpu_options, quantize_model
from geoserve.engine.limits import (
    MB,
    default_max_memory,
)
from geoserve.engine.model_loader import build_model, resolve_model
from geoserve.engine.output import OutputStage
from geoserve.engine.patch_cache import remember_all, split_cached
from geoserve.engine.runner import ModelRunner
from geoserve.engine.runner import resolve_dtype as _resolve_dtype
from geoserve.engine.scheduler import Scheduler
from geoserve.engine.tensor_request import TensorRequest, tensor_patcher
from geoserve.errors import (
    ConfigError,
    GeoServeError,
    NotGeoreferencedWarning,
)
from geoserve.processors.base import InputProcessor, OutputProcessor
from geoserve.processors.embeddings import check_token_tiling
from geoserve.raster.dates import DateLike, dates_per_item
from geoserve.raster.gdal_setup import default_read_workers, limit_gdal_cache
from geoserve.raster.grid import BlendMode, PatchGrid
from geoserve.raster.sinks import planned_paths
from geoserve.raster.source import DataFormat, RasterArray, RasterLike
from geoserve.registry import ModelSpec
from geoserve.schemas import (
    TOKEN_KINDS,
    VECTOR_KINDS,
    ImageRequestOutput,
    OutFormat,
    TensorRequestOutput,
)

logger = logging.getLogger(__name__)

ProgressCallback = Callable[[int, int], None]
#: How long a step with no batch to run waits for a commit to finish before returning.
COMMIT_WAIT_S = 0.05
RequestOutput = ImageRequestOutput | TensorRequestOutput


class Engine(Admission):
    """Serves one model: GeoTIFFs (or tensors) in, GeoTIFFs (or tensors) out.

    Args:
        model: A registered model name or a :class:`~geoserve.registry.ModelSpec`.
        config: How it runs: a :class:`~geoserve.config.EngineConfig` (every option, its
            default and meaning are declared there); default: all defaults.
        **overrides: Fields of ``config`` to change, e.g. ``Engine("demo-water",
            max_batch_patches=32, device="cuda")``; validated like the config itself.
            ``max_batch_patches="auto"`` measures the model's memory per patch at start-up
            and fills 80 % of the free device memory on CUDA (at most 256), and takes 8 on
            CPU; a batch that runs out of device memory is split in two and retried, and the
            limit halved. With ``compile`` batches are padded to ``max_batch_patches`` so one
            graph serves them all.

    Raises:
        UnknownModelError, ProcessorMismatchError, ConfigError, WeightsError: at start-up.
    """

    def __init__(
        self, model: str | ModelSpec, config: EngineConfig | None = None, **overrides: Any
    ) -> None:
        self.config = cfg = EngineConfig.build(config, **overrides)
        self.device = _check_device(cfg.device)
        if cfg.compile and cfg.compile_backend not in torch.compiler.list_backends(exclude_tags=()):
            known = ", ".join(torch.compiler.list_backends(exclude_tags=()))
            raise ConfigError(f"compile_backend: unknown {cfg.compile_backend!r}; known: {known}")
        self.max_request_bytes = (
            default_max_memory() if cfg.max_request_mb is None else int(cfg.max_request_mb * MB)
        )
        self.spec, in_proc, out_proc = resolve_model(model)
        if cfg.threads is not None:
            torch.set_num_threads(cfg.threads)
        auto_batch = cfg.max_batch_patches == "auto"
        try:
            self.in_proc = in_proc.replace(
                patch_size=cfg.patch_size,
                stride=cfg.stride,
                blend=cfg.blend,
                bands=tuple(cfg.bands) if cfg.bands is not None else None,
            )
        except ConfigError as exc:
            raise ConfigError(f"model {self.spec.name!r}: {exc}") from exc
        self.out_proc = self._model_out_proc = out_proc
        self.out_procs = (out_proc,)
        if cfg.output_kind:
            self.out_procs = self.output_processors(cfg.output_kind)
            self.out_proc = self.out_procs[0]
        self.dtype = _resolve_dtype(cfg.dtype)
        check_cpu_options(
            self.device,
            self.dtype,
            cfg.quantize,
            model=self.spec.name,
            validated=self.spec.validated,
        )
        self._output_dir = cfg.output_dir
        limit_gdal_cache()
        self.model = build_model(self.spec, cfg.weights, self.device)
        if cfg.quantize is not None:  # after the weights, before compiling and warm-up
            self.model = quantize_model(self.model, cfg.quantize, self.spec.name)
        self.output_processors([p.kind for p in self.out_procs])  # (the model checked too)
        if self.spec.token_size and any(p.kind in TOKEN_KINDS for p in self.out_procs):
            size, blend = self.in_proc.patch_size, cast(BlendMode, self.in_proc.blend)
            grid = PatchGrid(size, size, size, self.in_proc.stride, blend)
            check_token_tiling(grid, self.spec.token_size)
        self.compiled = cfg.compile
        eager = self.model
        if cfg.compile:  # static shapes: batches are padded to one size (runner.start_up)
            self.model = cast(
                torch.nn.Module,
                torch.compile(self.model, backend=cfg.compile_backend, dynamic=False),
            )
        self.runner = ModelRunner(
            self.model,
            self.spec.name,
            self.device,
            self.dtype,
            compiled=self.compiled,
            max_batch_patches=1 if auto_batch else cast(int, cfg.max_batch_patches),
            embedding_layer=cfg.embedding_layer,
            token_size=self.spec.token_size,
            eager=eager,
        )
        preprocess = cfg.preprocess
        if preprocess == "auto":
            preprocess = "device" if self.device.type == "cuda" else "host"
        self.preprocess = preprocess
        self.last_batch_size = 0
        self.read_workers = cfg.read_workers or default_read_workers()
        # a pool of reader threads reads every request's next grid rows during forward passes
        self._reader = (
            ThreadPoolExecutor(self.read_workers, thread_name_prefix="geoserve-read")
            if cfg.prefetch and cfg.prefetch_rows > 0
            else None
        )
        self.scheduler = Scheduler()
        self.output = OutputStage(fail=self.scheduler.fail)
        if cfg.warmup or auto_batch:
            probe = self._dummy_patch()
            self.runner.start_up(probe, self.in_proc, self.out_proc, auto_batch=auto_batch)

    # -- set-up ------------------------------------------------------------------------------

    @property
    def max_batch_patches(self) -> int:
        """Most patches per forward pass (the runner lowers it when the device runs out)."""
        return self.runner.max_batch_patches

    @max_batch_patches.setter
    def max_batch_patches(self, n: int) -> None:
        self.runner.max_batch_patches = n

    def _dummy_patch(self) -> Patch:
        """One patch of the input processor's dummy input (for warm-up)."""
        dummy = self.in_proc.dummy_request(seed=0)
        req = self._new_request(dummy, "warmup", "tensor", None, out_procs=self._tensor_procs())
        if any(p.kind in TOKEN_KINDS for p in self.out_procs):  # warm up the tokens too
            req.token_size = self.spec.token_size
        patch = req.pop_patch()
        req.close()
        assert patch is not None  # dummy inputs have no nodata
        return patch

    def _tensor_procs(self) -> list[OutputProcessor]:
        """The output processor of tensor requests (warm-up, :meth:`transform`).

        One kind, a raster one: its values are not used, only its hooks.
        """
        if getattr(self.out_proc, "kind", None) in (*VECTOR_KINDS, *TOKEN_KINDS):
            return [self._model_out_proc]
        return [self.out_proc]

    def close(self) -> None:
        """Drop pending requests, release their inputs and stop the reader and writer threads."""
        self.scheduler.close()
        if self._reader is not None:
            self._reader.shutdown(wait=True)
            self._reader = None
        self.output.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- pending requests --------------------------------------------------------------------

    def abort_request(self, request_id: str) -> bool:
        """Drop a pending request and its queued patches; True if it was pending.

        A request already being committed is not handed out, and its outputs are removed.
        """
        return self.scheduler.abort(request_id) or self.output.abandon(request_id)

    @property
    def oldest_arrival(self) -> float | None:
        """``time.monotonic()`` when the oldest pending request arrived (None: none pending)."""
        return self.scheduler.oldest_arrival

    def pending_ids(self) -> list[str]:
        """Ids of the requests still pending."""
        return self.scheduler.pending_ids()

    @property
    def queued_patches(self) -> int:
        """Patches of pending requests not yet through the model (skipped ones included)."""
        return self.scheduler.queued_patches

    @property
    def committing(self) -> int:
        """Requests whose outputs are being committed (on the commit threads)."""
        return self.output.finishing

    def has_unfinished(self) -> bool:
        """Whether any request is still pending (or being committed, or to be released)."""
        return self.scheduler.has_unfinished() or bool(self.output.finishing)

    # -- the loop ----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one batch; return the requests that finished (or failed) during it."""
        sched = self.scheduler
        sched.release_retired()
        batch = sched.fill_batch(self.max_batch_patches, self.config.cross_request_batching)
        if not batch and not sched.failed and sched.wait_for_reads():
            # a row arrived while we waited
            batch = sched.fill_batch(self.max_batch_patches, self.config.cross_request_batching)
        batch, cached, caches = split_cached(batch, self.runner.device)  # (map tiles)
        for part in cached:
            self.output.stitch(part)
        self.last_batch_size = len(batch)
        for part in self.runner.run(batch):  # in parts when a forward pass fails
            if part.error is not None:
                sched.fail_batch(part.patches, part.error)
            else:
                self.output.stitch(part)
                remember_all(caches, part)
        for req in sched.live():
            self.output.emit(req, self.config.streaming)
        for req in sched.take_complete():
            self.output.finish(req)  # committed on a commit thread; collected when done
        done = sched.take_failed()
        done.extend(self.output.collect(wait=0.0 if batch or cached else COMMIT_WAIT_S))
        return done

    # -- offline API -------------------------------------------------------------------------

    def run_until_done(self, progress: ProgressCallback | None = None) -> Iterator[RequestOutput]:
        """Step until no request is pending, yielding each finished request."""
        done = 0
        while self.has_unfinished():
            results = self.step()
            done += sum(r.num_patches for r in results)
            if progress is not None:  # (before the step's results: a caller reports them)
                active = self.scheduler.active
                total = sum(r.num_patches for r in active) + done
                stitched = done + sum(r.num_patches - len(r.queue) - r.in_flight for r in active)
                progress(stitched, total)
            yield from results

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

        With several output kinds (``output_kind=["classes", "confidence"]``) each request
        writes one file per kind: a single input's ``output_path`` is their stem
        (``out/scene`` gives ``out/scene_classes.tif``, ``out/scene_confidence.tif``) unless
        it is a directory (or ends with ``/``, created if missing), which like a list's holds
        ``<input stem>_<kind>.tif`` (polygons: ``.gpkg``, or ``polygon_format``'s suffix; patch
        embeddings: ``.parquet``); every kind's output is in
        the result's ``outputs_by_kind`` (docs/outputs.md).

        A dict is one request of several modalities, each on its own grid:
        ``{"s2": "s2.tif", "s1": "s1.tif"}`` (each value one input, a list of its dates, or
        a STAC Item). A multimodal model's forward gets one tensor per modality on its
        reference grid; any other model reads the modalities' bands stacked, in the dict's
        order, on the first modality's grid (bilinear). A list of dicts is several requests.

        ``dates`` are the inputs' acquisition dates (ISO strings, ``date`` or ``datetime``
        objects), for models that take dates: one per input raster, in order, or nested like
        the inputs (``[["2020-05-01", "2020-06-01"]]`` for ``[["a.tif", "b.tif"]]``); for a
        dict, a dict of modality name to its dates. They win over the inputs' date tags and
        file-name stamps.

        Raises:
            GeoServeError: for a single input that failed; InputError: ``dates`` does not
            match the inputs.
        """
        single = not isinstance(x_or_list, list)
        items = cast(list[ImageInput], [x_or_list] if single else list(x_or_list))  # type: ignore[arg-type]
        paths: list[Path | None] = (
            [None] * len(items)
            if out_format != "path" or output_path is None
            else list(self.output_paths(items, output_path, single=single))
        )
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

    def output_paths(
        self, items: Sequence[ImageInput], output_path: str | Path, *, single: bool
    ) -> list[Path]:
        """Where the outputs of ``items`` go (``out_format="path"``): see :func:`planned_paths`.

        Raises:
            ConfigError: a directory for them cannot be created (naming it).
        """
        kinds = [getattr(p, "kind", "raw") for p in self.out_procs]
        return planned_paths(items, output_path, kinds, self.config.polygon_format, single)

    def transform(self, tensors: Sequence[torch.Tensor]) -> list[TensorRequestOutput]:
        """Run already-normalised tensors through the model, batched like image requests.

        Each tensor is (C, H, W) or (C, T, H, W) of any size; it is tiled with this engine's
        patch grid and the blended raw model output (C_out, H, W) comes back in ``.tensors``.
        """
        proc = tensor_patcher(self.in_proc)
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
            self.scheduler.failed.append(TensorRequestOutput(rid, True, None, err))
            return rid
        flat = RasterArray(arr.reshape(-1, *arr.shape[-2:]), name=f"<tensor {i}>")
        kind = partial(TensorRequest, tensor_shape=tuple(arr.shape[:-2]))
        try:
            req = self._new_request(
                [flat], rid, "tensor", None, in_proc=proc, out_procs=self._tensor_procs(), kind=kind
            )
        except GeoServeError as exc:
            self.scheduler.failed.append(TensorRequestOutput(rid, True, None, exc))
            return rid
        self.admit(req)
        return rid


def _check_device(name: str) -> torch.device:
    """The torch device ``name``, refused at once when this machine does not have it."""
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError) as exc:
        raise ConfigError(f"device: {exc} (got {name!r})") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= count:
            have = f"{count} CUDA device(s)" if count else "no usable CUDA device"
            raise ConfigError(f"device: {name!r} requested, but this machine has {have}")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"device: {name!r} requested, but MPS is not available here")
    return device
