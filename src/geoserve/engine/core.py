"""The engine: admits requests, batches patches from all of them, and stitches results.

:class:`Engine` holds the public API and composes four parts, one job each:

- the :class:`~geoserve.engine.admission.Admission`: a request's
  :class:`~geoserve.engine.request_spec.RequestSpec` checked, its inputs opened, its
  :class:`Request` built with a sink per output kind (:mod:`geoserve.engine.products`), size
  guards applied;
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

import contextlib
import logging
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast, overload

import torch

from geoserve.config import EngineConfig
from geoserve.engine.admission import Admission
from geoserve.engine.output import OutputStage
from geoserve.engine.patch_cache import remember_all, split_cached
from geoserve.engine.products import kinds_offered, output_processors
from geoserve.engine.request import Request
from geoserve.engine.request_spec import ImageInput, RequestSpec
from geoserve.engine.scheduler import Scheduler
from geoserve.engine.startup import load_model, make_runner, start_up
from geoserve.engine.stepping import StepPool, StepStats
from geoserve.engine.tensor_request import tensor_procs
from geoserve.errors import GeoServeError, NotGeoreferencedWarning
from geoserve.models.steps import SteppedModel
from geoserve.processors.base import OutputProcessor
from geoserve.raster.dates import dates_per_item
from geoserve.raster.gdal_setup import default_read_workers
from geoserve.raster.sinks import planned_paths
from geoserve.raster.source import DataFormat, RasterLike
from geoserve.registry import ModelSpec
from geoserve.schemas import TOKEN_KINDS, ImageRequestOutput, OutFormat, TensorRequestOutput

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from geoserve.engine.request_spec import ImageOptions

logger = logging.getLogger(__name__)

ProgressCallback = Callable[[int, int], None]
#: How long a step with no batch to run waits for a commit to finish before returning.
COMMIT_WAIT_S = 0.05
RequestOutput = ImageRequestOutput | TensorRequestOutput


class Engine:
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
        loaded = load_model(model, cfg)
        self.spec, self.device, self.dtype = loaded.spec, loaded.device, loaded.dtype
        self.max_request_bytes = loaded.max_request_bytes
        #: The model's parts held once with another loaded model's (equal weights).
        self.shared_parts = loaded.shared
        #: Held while a batch runs through the model and is stitched (engines sharing one
        #: device take turns through it: :class:`~geoserve.engine.turns.Turns`).
        self.device_turn: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext
        self.in_proc, self._model_out_proc = loaded.in_proc, loaded.model_out_proc
        self.out_procs = loaded.out_procs
        self.out_proc = self.out_procs[0]
        self.runner = make_runner(loaded, cfg)
        self.model, self.compiled = self.runner.model, cfg.compile
        auto_batch = cfg.max_batch_patches == "auto"
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
        plan = self.runner.plan
        stepped = loaded.module if isinstance(loaded.module, SteppedModel) else None
        self.scheduler = Scheduler(StepPool(plan) if plan is not None else None)
        self.admission = Admission(
            spec=self.spec,
            config=cfg,
            in_proc=self.in_proc,
            out_procs=self.out_procs,
            tensor_procs=tensor_procs(self.out_proc, self._model_out_proc),
            output_processors=self.output_processors,
            device=self.device,
            preprocess=preprocess,
            read_workers=self.read_workers,
            max_request_bytes=self.max_request_bytes,
            reader=self._reader,
            output_dir=cfg.output_dir,
            request_kwargs=stepped.request_kwargs if stepped is not None else None,
        )
        self.output = OutputStage(fail=self.scheduler.fail)
        if cfg.warmup or auto_batch:
            tokens = any(p.kind in TOKEN_KINDS for p in self.out_procs)  # warm them up too
            probe = self.admission.warmup_patch(tokens)
            start_up(self.runner, probe, self.in_proc, self.out_proc, auto_batch=auto_batch)

    # -- set-up ------------------------------------------------------------------------------

    @property
    def max_batch_patches(self) -> int:
        """Most patches per forward pass (the runner lowers it when the device runs out)."""
        return self.runner.max_batch_patches

    @max_batch_patches.setter
    def max_batch_patches(self, n: int) -> None:
        self.runner.max_batch_patches = n

    @property
    def step_stats(self) -> StepStats | None:
        """A stepped model's steps run so far, per kind (None: a one-pass model)."""
        return self.runner.step_stats

    @property
    def output_dir(self) -> Path:
        """Directory for outputs without an explicit path (a temporary one by default)."""
        return self.admission.default_dir()

    @property
    def model_out_proc(self) -> OutputProcessor:
        """The model's own output processor (its classes and colours), whatever kinds are run."""
        return self._model_out_proc

    def kinds_offered(self) -> tuple[str, ...]:
        """Every output kind this model can produce (see :mod:`geoserve.engine.products`)."""
        return kinds_offered(self.spec, self._model_out_proc)

    def output_processors(self, kinds: str | Sequence[str]) -> tuple[OutputProcessor, ...]:
        """The model's output processor for each of ``kinds`` (text: comma-separated).

        Raises:
            ConfigError: an unknown kind, a kind this model cannot produce (naming the ones it
                can), a kind asked twice, or no kind.
        """
        model = getattr(self, "model", None)
        return output_processors(self.spec, self._model_out_proc, kinds, self.config, model)

    def close(self) -> None:
        """Drop pending requests, release their inputs and stop the reader and writer threads."""
        self.scheduler.close()
        self.admission.close()
        if self._reader is not None:
            self._reader.shutdown(wait=True)
            self._reader = None
        self.output.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- admission ---------------------------------------------------------------------------

    def prepare_request(self, spec: RequestSpec) -> Request:
        """Check ``spec`` and open its inputs (headers only, no pixels) without admitting it.

        Safe to call from any thread: it reads the engine's configuration and nothing else.
        The spec's ``bands`` and ``output_kind`` override the engine's for this request only
        (several kinds come from the same model pass, see :meth:`output_processors`); its
        ``dates`` win over the inputs' tags and file names.

        Raises:
            GeoServeError: a subclass naming the file, band or field at fault.
        """
        return self.admission.prepare(spec)

    def admit(self, request: Request) -> None:
        """Queue a prepared request: lower ``priority`` first, then arrival order."""
        self.scheduler.admit(request)

    def add_request(self, request: ImageInput | RequestSpec, **fields: Any) -> str:
        """Admit one request; its patches join the next batches. Returns the request id.

        ``request`` is a :class:`RequestSpec`, or its inputs (one raster, a list of rasters as
        the dates of one place, or a dict of modalities); ``fields`` are the spec's other
        fields (``output_path=``, ``dates=``, ``bands=``, ``output_kind=``, ``priority=``...).
        A request that cannot be admitted is not raised here: it comes back, failed, from the
        next :meth:`step`.
        """
        spec = RequestSpec.of(request, **fields)
        rid = spec.request_id or uuid.uuid4().hex[:12]
        spec = RequestSpec.of(spec, request_id=rid)
        try:
            req = self.prepare_request(spec)
        except GeoServeError as exc:
            self.scheduler.failed.append(ImageRequestOutput(rid, finished=True, error=exc))
            return rid
        self.admit(req)
        return rid

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
        with self.device_turn() if batch else contextlib.nullcontext():
            for part in self.runner.run(batch):  # in parts when a forward pass fails
                if part.error is not None:
                    sched.fail_batch(part.patches, part.error)
                elif part.more_steps:  # (a stepped model: they wait for their next step)
                    sched.await_step(part.patches)
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
                progress(*self.scheduler.progress(done))
            yield from results

    @overload
    def generate_image(
        self,
        x_or_list: list[ImageInput],
        *,
        progress: ProgressCallback | None = None,
        **options: Unpack[ImageOptions],
    ) -> list[ImageRequestOutput]: ...

    @overload
    def generate_image(
        self,
        x_or_list: RasterLike | Mapping[str, Any],
        *,
        progress: ProgressCallback | None = None,
        **options: Unpack[ImageOptions],
    ) -> ImageRequestOutput: ...

    def generate_image(
        self,
        x_or_list: ImageInput | list[ImageInput],
        *,
        output_path: str | Path | None = None,
        out_format: OutFormat = "path",
        data_format: DataFormat = "auto",
        progress: ProgressCallback | None = None,
        dates: Any = None,
        bands: Sequence[int | str] | None = None,
        output_kind: str | Sequence[str] | None = None,
        priority: int = 0,
        seed: int = 0,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
    ) -> ImageRequestOutput | list[ImageRequestOutput]:
        """Run one input, or a list of inputs, to completion.

        A single input returns its :class:`ImageRequestOutput` and raises its error if it
        failed. A list returns one output per item, in input order; failed items carry their
        ``error`` and do not affect the others. A list item that is itself a list holds the
        dates of one place. For a list, ``output_path`` is a directory.

        ``bands``, ``output_kind``, ``priority`` and ``seed`` are every request's (the
        :class:`RequestSpec` fields): bands and kinds instead of the engine's; the seed of a
        generative model's draws; ``temperature``, ``top_p``, ``top_k`` a generative model's
        sampling for these requests (None: the engine's). With several
        output kinds each request writes one file per kind (``out/scene`` gives
        ``out/scene_classes.tif``, ...; a directory holds ``<input stem>_<kind>.tif``: see
        :meth:`output_paths` and docs/outputs.md), each in the result's ``outputs_by_kind``.

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
        asked = RequestSpec(  # each item's request: its inputs, output path and dates
            (),
            out_format=out_format,
            data_format=data_format,
            bands=bands,
            output_kind=output_kind,
            priority=priority,
            seed=seed,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
        )
        paths: list[Path | None] = [None] * len(items)
        if out_format == "path" and output_path is not None:
            kinds = asked.kinds
            paths = list(self.output_paths(items, output_path, single=single, kinds=kinds))
        per_item = [dates] if single else dates_per_item(items, dates)
        ids = [
            self.add_request(RequestSpec.of(asked, inputs=item, output_path=path, dates=when))
            for item, path, when in zip(items, paths, per_item, strict=False)
        ]
        results = {r.request_id: r for r in self.run_until_done(progress)}
        outputs = [cast(ImageRequestOutput, results[i]) for i in ids]
        if single:
            return outputs[0].raise_for_error()
        return outputs

    def output_paths(
        self,
        items: Sequence[ImageInput],
        output_path: str | Path,
        *,
        single: bool,
        kinds: Sequence[str] | None = None,
    ) -> list[Path]:
        """Where the outputs of ``items`` go (``out_format="path"``): see :func:`planned_paths`.

        ``kinds``: the output kinds the requests make (default: the engine's).

        Raises:
            ConfigError: a directory for them cannot be created (naming it).
        """
        kinds = kinds or [getattr(p, "kind", "raw") for p in self.out_procs]
        return planned_paths(items, output_path, kinds, self.config.polygon_format, single)

    def transform(self, tensors: Sequence[torch.Tensor]) -> list[TensorRequestOutput]:
        """Run already-normalised tensors through the model, batched like image requests.

        Each tensor is (C, H, W) or (C, T, H, W) of any size; it is tiled with this engine's
        patch grid and the blended raw model output (C_out, H, W) comes back in ``.tensors``.
        """
        ids = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NotGeoreferencedWarning)
            for i, t in enumerate(tensors):
                rid = uuid.uuid4().hex[:12]
                try:
                    self.admit(self.admission.tensor_request(i, t, rid))
                except GeoServeError as exc:
                    self.scheduler.failed.append(TensorRequestOutput(rid, True, None, exc))
                ids.append(rid)
        results = {r.request_id: r for r in self.run_until_done()}
        return [cast(TensorRequestOutput, results[i]) for i in ids]
