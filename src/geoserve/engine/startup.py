"""An engine's start-up: the model resolved and loaded, and the runner that drives it.

The model is resolved, its processors fitted to the config and its weights loaded (its parts
whose weights equal another loaded model's shared with it: :func:`share_weights`);
:func:`load_model` does everything that can fail on a bad configuration or bad weights (and
so raises before any thread is started); :func:`make_runner` wraps the loaded module, compiled
when asked, in a :class:`~geoserve.engine.runner.ModelRunner`. :class:`~geoserve.engine.core.
Engine` composes the rest (scheduler, admission, output stage) around them; then
:func:`start_up` runs the warm-up (:func:`warm_up` checks the model against its processors on
a dummy patch) and sizes ``"auto"`` batches (:func:`choose_batch`): both on the uncompiled
module while the batch size is still to be found, then a compiled model runs once at the final
batch size, so one graph serves every batch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch

from geoserve.config import EngineConfig
from geoserve.engine.heap import trim_heap
from geoserve.engine.limits import MB, default_max_memory
from geoserve.engine.model_loader import (
    check_compile_backend,
    check_device,
    compiled,
    load_module,
    resolve_dtype,
    resolve_model,
)
from geoserve.engine.products import output_processors
from geoserve.engine.runner import ModelRunner, input_shape
from geoserve.engine.shared_weights import SharedPart, share_identical
from geoserve.errors import ConfigError, ModelExecutionError, ProcessorMismatchError
from geoserve.models.steps import SteppedModel
from geoserve.processors.base import InputProcessor, OutputProcessor
from geoserve.processors.embeddings import check_token_tiling
from geoserve.raster.gdal_setup import limit_gdal_cache
from geoserve.raster.grid import BlendMode, PatchGrid
from geoserve.registry import ModelSpec
from geoserve.schemas import TOKEN_KINDS

if TYPE_CHECKING:
    from geoserve.engine.batch import Patch

logger = logging.getLogger(__name__)

#: The engine options only a generative (stepped) model takes.
GENERATION_OPTIONS = ("steps", "temperature", "top_p", "top_k", "batch_invariant")


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to run: its spec, fitted processors, weights on the device.

    Attributes:
        spec: The registered model.
        in_proc: Its input processor with the config's patch size, stride, blend and bands.
        model_out_proc: Its own output processor (its classes and colours).
        out_procs: The output processor of each output kind the config asks for (the first is
            the engine's default).
        module: The loaded, uncompiled module.
        device: Where it runs.
        dtype: Autocast dtype (None: float32).
        max_request_bytes: The memory bound of one request (None: none).
        shared: The module's parts held once with another loaded model's (equal weights).
    """

    spec: ModelSpec
    in_proc: InputProcessor
    model_out_proc: OutputProcessor
    out_procs: tuple[OutputProcessor, ...]
    module: torch.nn.Module
    device: torch.device
    dtype: torch.dtype | None
    max_request_bytes: int | None
    shared: tuple[SharedPart, ...] = ()


def load_model(model: str | ModelSpec, cfg: EngineConfig) -> LoadedModel:
    """Resolve ``model``, fit its processors to ``cfg`` and load its weights.

    Raises:
        UnknownModelError, ProcessorMismatchError, ConfigError, WeightsError: naming the
        model, option or file at fault.
    """
    device = check_device(cfg.device)
    if cfg.compile:
        check_compile_backend(cfg.compile_backend)
    max_bytes = default_max_memory() if cfg.max_request_mb is None else int(cfg.max_request_mb * MB)
    spec, in_proc, out_proc = resolve_model(model)
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    try:
        in_proc = in_proc.replace(
            patch_size=cfg.patch_size,
            stride=cfg.stride,
            blend=cfg.blend,
            bands=tuple(cfg.bands) if cfg.bands is not None else None,
        )
    except ConfigError as exc:
        raise ConfigError(f"model {spec.name!r}: {exc}") from exc
    out_procs: tuple[OutputProcessor, ...] = (out_proc,)
    if cfg.output_kind:
        out_procs = output_processors(spec, out_proc, cfg.output_kind, cfg)
    dtype = resolve_dtype(cfg.dtype)
    limit_gdal_cache()
    options = {k: getattr(cfg, k) for k in GENERATION_OPTIONS if getattr(cfg, k) is not None}

    def fit(module: torch.nn.Module) -> None:
        if not isinstance(module, SteppedModel):
            if options:
                raise ConfigError(
                    f"model {spec.name!r} does not generate: {', '.join(options)} "
                    "(generation options) are for generative models only"
                )
            return
        try:
            module.configure(
                kinds=[p.kind for p in out_procs],
                options=options,
                patch_size=in_proc.patch_size,
                stride=in_proc.stride,
            )
        except ConfigError as exc:
            raise ConfigError(f"model {spec.name!r}: {exc}") from None

    module = load_module(spec, cfg, device, dtype, fit)
    shared = share_weights(spec.name, module, cfg)
    out_proc = out_proc.fitted(module)
    out_procs = tuple(p.fitted(module) for p in out_procs)
    output_processors(spec, out_proc, [p.kind for p in out_procs], cfg, module)  # (+ the model)
    if spec.token_size and any(p.kind in TOKEN_KINDS for p in out_procs):
        size, blend = in_proc.patch_size, cast(BlendMode, in_proc.blend)
        check_token_tiling(PatchGrid(size, size, size, in_proc.stride, blend), spec.token_size)
    if isinstance(module, SteppedModel):
        _check_stepped(spec.name, module, cfg)
    return LoadedModel(spec, in_proc, out_proc, out_procs, module, device, dtype, max_bytes, shared)


def share_weights(name: str, module: torch.nn.Module, cfg: EngineConfig) -> tuple[SharedPart, ...]:
    """``module``'s parts equal to those of models loaded before, shared with them.

    Only for the torch backend without ``quantize`` (int8 layers are rebuilt per model), and
    when ``share_weights`` is on (:func:`~geoserve.engine.shared_weights.share_identical`).
    """
    if not cfg.share_weights or cfg.quantize is not None or cfg.backend != "torch":
        return ()
    shared = tuple(share_identical(module))
    if shared:
        mb = sum(p.bytes for p in shared) / 2**20
        parts = ", ".join(p.path for p in shared)
        logger.info("model %s: %s shared with a model loaded before (%.1f MB)", name, parts, mb)
        trim_heap()
    return shared


def _check_stepped(name: str, module: SteppedModel, cfg: EngineConfig) -> None:
    """What a stepped model cannot take: an empty plan, quantizing, compiling."""
    if not module.plan():
        raise ProcessorMismatchError(f"model {name!r} takes steps but its plan() names none")
    if cfg.quantize:
        raise ConfigError(
            f"model {name!r} takes several steps per patch; --quantize {cfg.quantize} is "
            "not supported for such models (run it without)"
        )
    if cfg.compile:
        raise ConfigError(
            f"model {name!r} takes several steps per patch; --compile is not supported "
            "for such models yet (run it without)"
        )


def make_runner(loaded: LoadedModel, cfg: EngineConfig) -> ModelRunner:
    """The runner of ``loaded``'s module.

    Compiled when ``cfg.compile``: batches padded to one size, one graph (see
    :meth:`ModelRunner.start_up`). ``backend: openvino``: an
    :class:`~geoserve.engine.openvino_backend.OpenVinoRunner`, its model converted now.
    """
    if cfg.backend == "openvino":
        from geoserve.engine.openvino_backend import openvino_runner

        return openvino_runner(loaded, cfg)
    auto_batch = cfg.max_batch_patches == "auto"
    module = loaded.module
    if cfg.compile:
        module = compiled(module, cfg.compile_backend)
    return ModelRunner(
        module,
        loaded.spec.name,
        loaded.device,
        loaded.dtype,
        compiled=cfg.compile,
        max_batch_patches=1 if auto_batch else cast(int, cfg.max_batch_patches),
        embedding_layer=cfg.embedding_layer,
        token_size=loaded.spec.token_size,
        eager=loaded.module,
    )


#: ``max_batch_patches="auto"`` on CPU, where larger batches stop paying off early.
AUTO_CPU_BATCH = 8
#: Most patches per batch ``"auto"`` picks on a GPU.
AUTO_MAX_BATCH = 256


def start_up(
    runner: ModelRunner,
    patch: Patch,
    in_proc: InputProcessor,
    out_proc: OutputProcessor,
    *,
    auto_batch: bool,
) -> None:
    """Warm-up on ``patch``, and with ``auto_batch`` the batch size found first.

    A compiled model compiles one graph: while the batch size is still to be found the check
    and the memory probe run on the uncompiled module, then the compiled one runs once at the
    final batch size (every later batch is padded to it).

    Raises:
        ModelExecutionError, ProcessorMismatchError: the model does not fit its processors.
    """
    fits = warm_up(runner, patch, in_proc, out_proc, eager=auto_batch)
    if not auto_batch:
        return
    # (a dummy the model refused tells nothing: the CPU default)
    runner.max_batch_patches = choose_batch(runner, patch if fits else None)
    if fits and runner.compiled:
        warm_up(runner, patch, in_proc, out_proc)  # the one graph, at the final batch size


def warm_up(
    runner: ModelRunner,
    patch: Patch,
    in_proc: InputProcessor,
    out_proc: OutputProcessor,
    *,
    eager: bool = False,
) -> bool:
    """Run one dummy patch; check the model's output against the output processor.

    A stepped model runs all its steps on it. ``eager``: on the uncompiled module (compiles
    nothing). False when the model refuses the dummy but the input processor fixes no band
    count (the dummy's 3 bands need not be what the model takes): the first request checks it.

    Raises:
        ModelExecutionError, ProcessorMismatchError: the model does not fit its processors.
    """
    try:
        out, _ = runner.forward([patch], eager=eager)
    except ModelExecutionError as exc:
        if in_proc.in_channels is None:
            logger.warning(
                "model %r: warm-up skipped; it refused a dummy input of shape %s and its "
                "input processor fixes no band count (set bands= on it to check at start-up)",
                runner.name,
                input_shape(patch.data),
            )
            return False
        raise ModelExecutionError(f"warm-up on a dummy input: {exc}") from exc
    want = out_proc.out_channels
    if want is not None and out.shape[1] != want:
        raise ProcessorMismatchError(
            f"model {runner.name!r} returns {out.shape[1]} channels but its output "
            f"processor expects {want}"
        )
    return True


def choose_batch(runner: ModelRunner, probe: Patch | None) -> int:
    """The batch size for ``max_batch_patches="auto"`` (see :class:`~geoserve.Engine`).

    ``probe`` is a patch the model takes (None: none known, the CPU default). The probe runs
    on the uncompiled module: no graph is compiled for its batch size.
    """
    device = runner.device
    if probe is None or device.type != "cuda":
        return AUTO_CPU_BATCH
    n = 4
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    runner.forward([probe] * n, eager=True)
    per_patch = max(1.0, (torch.cuda.max_memory_allocated(device) - base) / n)
    free, _ = torch.cuda.mem_get_info(device)
    fit = int(0.8 * free / per_patch)
    batch = 1 << max(0, min(fit, AUTO_MAX_BATCH).bit_length() - 1)  # a power of two
    logger.info("auto batch: %.0f MB per patch, %d patches per batch", per_patch / 1e6, batch)
    return batch
