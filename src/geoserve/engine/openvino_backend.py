"""``backend: openvino``: the engine's forward passes run by OpenVINO on the CPU.

:class:`OpenVinoRunner` is a :class:`~geoserve.engine.runner.ModelRunner` whose model call
runs the compiled OpenVINO form of the loaded module (:mod:`geoserve.engine.ov_convert`)
instead of the module: batching, staging, the checks of the output, the retry of failing
halves and the error messages are the torch runner's. One conversion per input shape (the
engine's patch shape; another band count converts again, in fp32 only), with a dynamic batch,
so every batch size runs the same graph.

:func:`openvino_runner` refuses what this backend does not run (a stepped model, the token
kinds, several dates per patch) and precisions the CPU lacks
the instructions for (bf16: AMX or AVX512-BF16; int8: AVX512-VNNI, AVX-VNNI or AMX) unless
``force_precision``; for int8 and bf16 it reads the calibration patches from the
``calibrate`` scenes through the model's own input processor (:func:`calibration_patches`).
A model's per-request arguments besides the pixels (a Prithvi TL model's ``temporal_coords``
and ``location_coords``) are inputs of its converted model, calibrated with each patch's own;
so is each modality of a multimodal model (converted for the modalities a batch gives).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from geoserve.config import EngineConfig
from geoserve.engine.converted_cache import default_cache_dir
from geoserve.engine.cpu_inference import cpu_flags, cpu_name, native_reduced_precision
from geoserve.engine.runner import ModelRunner
from geoserve.errors import ConfigError, GeoServeError, ModelExecutionError, prefixed
from geoserve.models.steps import SteppedModel
from geoserve.processors.base import InputProcessor
from geoserve.schemas import TOKEN_KINDS

if TYPE_CHECKING:
    from geoserve.engine.batch import Patch
    from geoserve.engine.ov_convert import Converted, Extra, Pixels, PixelShape
    from geoserve.engine.startup import LoadedModel

logger = logging.getLogger(__name__)

#: Patches read from the calibration scenes (all scenes together).
CALIBRATION_PATCHES = 32
#: CPU flags that make int8 matrix products pay (x86).
INT8_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


class OpenVinoRunner(ModelRunner):
    """A :class:`ModelRunner` whose forward pass is OpenVINO's (see the module docstring).

    Args:
        loaded: The loaded model (its module stays the torch reference, for messages and the
            gate; it is not run).
        cfg: The engine's configuration (precision, cache folder, threads, gate).
        patches: Calibration patches (C, P, P), or by modality, for int8 and bf16 (and the
            example input).
        extras: Each calibration patch's model arguments besides its pixels.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        cfg: EngineConfig,
        patches: Sequence[Pixels],
        extras: Sequence[Extra] = (),
    ) -> None:
        max_batch = 1 if cfg.max_batch_patches == "auto" else int(cfg.max_batch_patches)
        super().__init__(
            loaded.module,
            loaded.spec.name,
            loaded.device,
            None,
            compiled=False,
            max_batch_patches=max_batch,
            embedding_layer=cfg.embedding_layer,
            token_size=loaded.spec.token_size,
        )
        self.precision = cfg.precision or "fp32"
        self.cache_dir = cfg.backend_cache_dir or default_cache_dir()
        self.threads = cfg.threads
        self.gate = cfg.accuracy_gate
        self.patches = list(patches)
        #: Each calibration patch's model arguments besides its pixels (empty: none).
        self.extras = list(extras) or [{} for _ in self.patches]
        self.classes = bool(getattr(loaded.model_out_proc, "classes", ()))
        #: The converted model of each input shape: the pixels' (C, P, P), then each other
        #: model argument's (name, shape), if any.
        self.converted: dict[tuple[Any, ...], Converted] = {}

    def convert(self, shape: PixelShape, example: Extra | None = None) -> Converted:
        """The converted model for inputs (B, *shape) (and ``example``'s other arguments).

        ``shape``: the pixels' (C, P, P), or a multimodal model's by modality.
        """
        example = example or {}
        key = (*_pixel_key(shape), *_shapes(example))
        found = self.converted.get(key)
        if found is not None:
            return found
        from geoserve.engine.ov_convert import load_or_convert, shape_of

        fits = [
            i
            for i, p in enumerate(self.patches)
            if shape_of(p) == shape and _shapes(self.extras[i]) == _shapes(example)
        ]
        precision = self.precision
        if precision != "fp32" and not fits:  # (never int8 on scales made for other inputs)
            calibrated = ", ".join(_said(k) for k in self.converted) or "none"
            logger.warning(
                "model %r: openvino %s was calibrated for inputs %s, not %s (other bands or "
                "modalities): these run in fp32; calibrate on scenes like them for %s",
                self.name,
                precision,
                calibrated,
                _said(key),
                precision,
            )
            precision = "fp32"
        found = load_or_convert(
            self.eager,
            model=self.name,
            shape=shape,
            precision=precision,
            patches=[self.patches[i] for i in fits],
            cache_dir=self.cache_dir,
            threads=self.threads,
            classes=self.classes,
            gate=self.gate,
            extras=[self.extras[i] for i in fits] if example else (),
            example_extra=example or None,
        )
        self.converted[key] = found
        return found

    @property
    def runtime(self) -> dict[str, Any]:
        """How it runs, for model listings: backend, precision, each converted model's figures."""
        return {
            "backend": "openvino",
            "precision": self.precision,
            "converted": [{**c.meta, "path": str(c.folder)} for c in self.converted.values()],
        }

    def _call(
        self,
        module: torch.nn.Module,
        batch: list[Patch],
        x: Any,
        kwargs: dict[str, Any],
        want_tokens: bool,
    ) -> tuple[Any, torch.Tensor | None]:
        """The OpenVINO model on ``x`` (``module`` is not run); no tokens."""
        if want_tokens:  # (refused at start-up; a guard)
            raise ModelExecutionError(f"model {self.name!r}: openvino returns no tokens")
        shape: PixelShape
        if isinstance(x, torch.Tensor):
            pixels: Any = x.numpy()
            shape = tuple(x.shape[1:])
        else:  # (a multimodal model: each modality its own input)
            pixels = {n: t.numpy() for n, t in x.items()}
            shape = {n: tuple(t.shape[1:]) for n, t in sorted(x.items())}
        names = sorted(kwargs)
        extra = [kwargs[n].numpy() for n in names]
        example = {n: a[0] for n, a in zip(names, extra, strict=True)}
        converted = self.convert(shape, example)
        from geoserve.engine.ov_convert import run_compiled

        try:
            y = run_compiled(converted.compiled, pixels, extra)
        except GeoServeError:
            raise
        except Exception as exc:
            raise self.model_failed(batch[0].request.ctx, x, exc) from exc
        return torch.from_numpy(y), None


def openvino_runner(loaded: LoadedModel, cfg: EngineConfig) -> OpenVinoRunner:
    """The OpenVINO runner of ``loaded``, converted for its patch shape (cached on disk).

    Raises:
        ConfigError: naming what this backend or this CPU does not take, a calibration scene
            that cannot be read, a conversion that fails or the accuracy gate.
    """
    name = loaded.spec.name
    try:
        import nncf  # noqa: F401  # (int8 needs it; checked with openvino)
        import openvino  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            f"backend: openvino needs the openvino and nncf packages ({exc}); install "
            "geoserve's cpu extra: pip install 'geoserve[cpu]'"
        ) from None
    if isinstance(loaded.module, SteppedModel):
        raise ConfigError(
            f"backend: model {name!r} takes several steps per patch (a generative model); "
            "openvino runs one-pass models only (use --backend torch)"
        )
    tokens = [p.kind for p in loaded.out_procs if p.kind in TOKEN_KINDS]
    if tokens:
        raise ConfigError(
            f"output_kind: {', '.join(tokens)} need the encoder's tokens, which the openvino "
            "backend does not return (use --backend torch for them)"
        )
    in_proc = loaded.in_proc
    if in_proc.num_frames > 1 or any(
        getattr(m, "num_frames", 1) > 1 for m in getattr(in_proc, "modalities", None) or ()
    ):
        raise ConfigError(
            f"backend: model {name!r} takes several dates per patch; openvino runs one date "
            "per input in this version (use --backend torch)"
        )
    check_cpu_precision(cfg.precision or "fp32", cfg.force_precision)
    patches, extras = calibration_patches(in_proc, cfg.calibrate or [], cfg.allowed_formats)
    runner = OpenVinoRunner(loaded, cfg, patches, extras)
    if patches:
        from geoserve.engine.ov_convert import shape_of

        runner.convert(shape_of(patches[0]), extras[0])
    elif (shape := _fixed_shape(in_proc)) is not None and not _takes_arguments(loaded):
        runner.convert(shape)  # (else converted for the first batch: its bands, arguments)
    return runner


def _takes_arguments(loaded: LoadedModel) -> bool:
    """Whether the model's forward takes arguments besides the pixels (dates, location)."""
    import inspect

    try:
        params = inspect.signature(loaded.module.forward).parameters
    except (TypeError, ValueError):
        return True
    return len(params) > 1


def _shapes(extra: Extra) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return tuple((n, tuple(np.shape(extra[n]))) for n in sorted(extra))


def _pixel_key(shape: PixelShape) -> tuple[Any, ...]:
    """The pixels' part of a converted model's key: (C, P, P), or (name, shape) each."""
    if isinstance(shape, Mapping):
        return tuple((n, tuple(shape[n])) for n in sorted(shape))
    return tuple(shape)


def _said(key: tuple[Any, ...]) -> str:
    """A converted model's inputs as messages say them: ``(6, 224, 224) + location_coords (2,)``."""
    shape = tuple(k for k in key if isinstance(k, int))
    others = [k for k in key if not isinstance(k, int)]
    said = [str(shape)] if shape else []
    return " + ".join([*said, *(f"{n} {s}" for n, s in others)])


def _fixed_shape(in_proc: InputProcessor) -> tuple[int, ...] | None:
    """The patch shape (C, P, P) when the input processor fixes its band count (one image)."""
    if getattr(in_proc, "modalities", None):
        return None  # (which modalities a request gives is known only then)
    c = in_proc.in_channels
    return None if c is None else (c, in_proc.patch_size, in_proc.patch_size)


def check_cpu_precision(precision: str, force: bool) -> None:
    """Refuse bf16 or int8 where this CPU lacks the instructions that make them pay.

    Raises:
        ConfigError: naming the CPU, the flags it lacks and ``--force-precision``.
    """
    if precision == "fp32" or force:
        return
    if precision == "bf16" and not native_reduced_precision("bf16"):
        need = "AMX or AVX512-BF16"
    elif precision == "int8" and not set(INT8_FLAGS) & cpu_flags():
        need = "AVX512-VNNI, AVX-VNNI or AMX"
    else:
        return
    raise ConfigError(
        f"precision: {precision} needs {need} to pay, and this CPU ({cpu_name()}) has none "
        f"(docs/performance.md); use --precision fp32, or --force-precision to run "
        f"{precision} anyway"
    )


def calibration_patches(
    in_proc: InputProcessor,
    scenes: Sequence[Path | str],
    formats: Sequence[str],
    count: int = CALIBRATION_PATCHES,
) -> tuple[list[Pixels], list[Extra]]:
    """About ``count`` patches spread over ``scenes``, cut by the model's input processor.

    Rows spread evenly over each scene's grid, patches spread over those rows; all-nodata
    patches are left out (as the engine does). With each patch, the model's other arguments
    for it (its scene's date and location for a Prithvi TL model; empty for most).

    Raises:
        ConfigError: a scene cannot be opened or read, or gives no patch.
    """
    from geoserve.raster.source import open_raster

    if not scenes:
        return [], []
    per_scene = math.ceil(count / len(scenes))
    out: list[Pixels] = []
    extras: list[Extra] = []
    for scene in scenes:
        try:
            with open_raster(str(scene), formats=formats) as src:
                ctx = in_proc.prepare([src])
                rows = np.unique(np.linspace(0, ctx.grid.rows - 1, min(per_scene, ctx.grid.rows)))
                found: list[Pixels] = []
                for r in rows.astype(int):
                    patches = in_proc.read_row([src], ctx, int(r)).patches
                    if isinstance(patches, Mapping):  # (a multimodal model: by modality)
                        found.extend(
                            {k: np.array(v[i], dtype=np.float32) for k, v in patches.items()}
                            for i in range(len(next(iter(patches.values()))))
                        )
                    else:
                        found.extend(np.array(p, dtype=np.float32) for p in patches)  # type: ignore[union-attr]
        except GeoServeError as exc:
            raise prefixed(exc, f"calibrate: {scene}") from None
        if not found:
            raise ConfigError(f"calibrate: {scene}: no patch with valid pixels to calibrate on")
        take = np.unique(np.linspace(0, len(found) - 1, min(per_scene, len(found))).astype(int))
        out.extend(found[i] for i in take)
        extras.extend(dict(ctx.model_kwargs) for _ in take)
    logger.info("calibration: %d patches from %d scene(s)", len(out), len(scenes))
    return out, extras
