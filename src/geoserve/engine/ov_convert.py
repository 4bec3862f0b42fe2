"""A loaded torch module as an OpenVINO model: converted, quantised, checked, cached.

:func:`load_or_convert` gives the compiled OpenVINO model of a module for one input shape
(C, P, P) with a dynamic batch: from the cache (:mod:`geoserve.engine.converted_cache`) when
this module's weights, shape, precision and library versions were converted before, else by
``openvino.convert_model`` (the module traced on an example input of the engine's patch
shape), for ``int8`` quantised by NNCF's post-training static quantisation calibrated on the
given patches (fixed per-tensor scales: a patch's result does not depend on its batch), then
saved in float32 (no fp16 weight compression). Given calibration patches (required for int8
and bf16) the **accuracy gate** runs the result and torch fp32 on them (same classes, largest
logit error); its figures are stored with the converted model and checked again when it is
reused. A model that takes arguments besides the pixels (a Prithvi TL model's dates and
location) is converted with them as further inputs, calibrated and checked with each patch's;
a multimodal model (its pixels a dict of modalities) with each modality an input of its own.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import logging
import math
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from geoserve.engine import converted_cache as cache
from geoserve.errors import ConfigError, GeoServeWarning

logger = logging.getLogger(__name__)

#: Least share of calibration pixels whose class must match torch fp32's (int8, bf16).
MIN_AGREEMENT = 0.99
#: Patches per reference forward pass of the gate.
GATE_BATCH = 4


class AccuracyGateWarning(GeoServeWarning):
    """A converted model failed the accuracy gate and runs anyway (``accuracy_gate: warn``)."""


@dataclass
class Converted:
    """One converted model, compiled for the CPU.

    Attributes:
        compiled: The ``openvino.CompiledModel``.
        meta: Its ``meta.json`` (parts of its key, times, gate figures).
        folder: Its folder in the cache.
        reused: Read from the cache (not converted now).
    """

    compiled: Any
    meta: dict[str, Any]
    folder: Path
    reused: bool


def ov_version() -> str:
    """The installed OpenVINO's version (``openvino`` must be importable)."""
    import openvino as ov

    return str(ov.__version__)


def weights_hash(module: torch.nn.Module) -> str:
    """A hash of ``module``'s parameters and buffers (names, shapes, dtypes, values)."""
    h = hashlib.sha256()
    for name, tensor in module.state_dict().items():
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:32]


#: A patch's pixels: (C, P, P), or for a multimodal model one such array per modality.
Pixels = NDArray[np.float32] | Mapping[str, NDArray[np.float32]]
#: The pixels' shape: (C, P, P), or each modality's by name.
PixelShape = tuple[int, ...] | Mapping[str, tuple[int, ...]]

#: A patch's model arguments besides its pixels (``temporal_coords``, ``location_coords``:
#: arrays without the batch axis), by name; the converted model takes them as inputs after
#: the pixels, in the order of their names.
Extra = Mapping[str, NDArray[np.float32]]


def patches_hash(patches: Sequence[Pixels], extras: Sequence[Extra] = ()) -> str:
    """A hash of the calibration patches and their model arguments (they decide int8)."""
    h = hashlib.sha256()
    for p in patches:
        for name, part in _parts(p):
            h.update((name or "").encode() + np.ascontiguousarray(part, np.float32).tobytes())
    for extra in extras:
        for name in sorted(extra):
            h.update(name.encode() + np.ascontiguousarray(extra[name], np.float32).tobytes())
    return h.hexdigest()[:32]


def _parts(pixels: Pixels) -> list[tuple[str | None, NDArray[np.float32]]]:
    """The pixels as the converted model's first inputs: one array, or each modality's."""
    if isinstance(pixels, Mapping):
        return [(n, np.asarray(pixels[n], np.float32)) for n in sorted(pixels)]
    return [(None, np.asarray(pixels, np.float32))]


def shape_of(pixels: Pixels) -> PixelShape:
    """A patch's :data:`PixelShape`."""
    if isinstance(pixels, Mapping):
        return {n: tuple(np.shape(pixels[n])) for n in sorted(pixels)}
    return tuple(np.shape(pixels))


class _Positional(torch.nn.Module):
    """``module(x, **extras)`` as ``forward(*pixels, *extras)``: every input positional.

    ``modalities``: the names of the pixels' parts (a multimodal model's ``x`` is a dict of
    them), or None for one array; ``names``: the other arguments', in order.
    """

    def __init__(
        self, module: torch.nn.Module, modalities: Sequence[str] | None, names: Sequence[str]
    ) -> None:
        super().__init__()
        self.module = module
        self.modalities = None if modalities is None else tuple(modalities)
        self.names = tuple(names)

    def forward(self, *inputs: torch.Tensor) -> Any:
        m = 1 if self.modalities is None else len(self.modalities)
        if self.modalities is None:
            x: Any = inputs[0]
        else:
            x = dict(zip(self.modalities, inputs[:m], strict=True))
        return self.module(x, **dict(zip(self.names, inputs[m:], strict=True)))


def _batched(extras: Sequence[Extra], names: Sequence[str]) -> list[NDArray[np.float32]]:
    """The model arguments of a batch, one array per name: (B, ...) each."""
    return [np.stack([np.asarray(e[n], np.float32) for e in extras]) for n in names]


def _stacked(patches: Sequence[Pixels]) -> Pixels:
    """A batch of patches: (B, C, P, P), or each modality's (B, C, P, P) by name."""
    first = patches[0]
    if isinstance(first, Mapping):
        return {n: np.stack([np.asarray(p[n], np.float32) for p in patches]) for n in first}  # type: ignore[call-overload]
    return np.stack([np.asarray(p, np.float32) for p in patches])


def _torch_input(x: Pixels) -> Any:
    if isinstance(x, Mapping):
        return {n: torch.from_numpy(np.ascontiguousarray(v)) for n, v in x.items()}
    return torch.from_numpy(np.ascontiguousarray(x))


def load_or_convert(
    module: torch.nn.Module,
    *,
    model: str,
    shape: PixelShape,
    precision: str,
    patches: Sequence[Pixels],
    cache_dir: Path,
    threads: int | None,
    classes: bool,
    gate: str,
    extras: Sequence[Extra] = (),
    example_extra: Extra | None = None,
) -> Converted:
    """The compiled OpenVINO form of ``module`` for inputs (B, *shape); see the module docs.

    ``patches`` (C, P, P) calibrate int8 and feed the gate (int8, bf16); ``classes``: the
    model's outputs are class scores (the gate compares classes); ``gate``: ``refuse`` or
    ``warn`` below :data:`MIN_AGREEMENT`. A model that takes arguments besides the pixels
    (a Prithvi TL model's dates and location): ``extras``, each patch's (with ``patches``),
    or ``example_extra``, one patch's (without): they become inputs of the converted model
    after the pixels, with a dynamic batch too, in the order of their names.

    Raises:
        ConfigError: the cache folder cannot be written, the module does not convert, or
            the gate refuses.
    """
    example = extras[0] if extras else example_extra or {}
    parts: dict[str, Any] = {
        "model": model,
        "weights": weights_hash(module),
        "input_shape": (
            {n: list(v) for n, v in shape.items()} if isinstance(shape, Mapping) else list(shape)
        ),
        "backend": "openvino",
        "precision": precision,
        "openvino": ov_version(),
    }
    if example:
        parts["extra_inputs"] = {n: list(np.shape(example[n])) for n in sorted(example)}
    if patches:  # (int8 is made from them; every precision is checked on them)
        parts["calibration"] = patches_hash(patches, extras)
        parts["calibration_patches"] = len(patches)
    if precision == "int8":
        parts["nncf"] = importlib.metadata.version("nncf")
    folder = cache.entry_dir(cache_dir, model, cache.cache_key(parts))
    meta = cache.read_meta(folder)
    if meta is not None and (folder / "model.xml").is_file():
        compiled = _compile(_core().read_model(str(folder / "model.xml")), precision, threads)
        logger.info("model %r: openvino %s model reused from %s", model, precision, folder)
        found = Converted(compiled, meta, folder, reused=True)
    else:
        found = _convert(module, parts, folder, patches, threads, classes, extras, example)
    check_gate(found.meta, model, gate)
    return found


def _convert(
    module: torch.nn.Module,
    parts: dict[str, Any],
    folder: Path,
    patches: Sequence[Pixels],
    threads: int | None,
    classes: bool,
    extras: Sequence[Extra],
    example_extra: Extra,
) -> Converted:
    """Convert (and for int8 quantise) ``module``, check it, and store it as ``folder``."""
    import openvino as ov

    model, precision, given = parts["model"], parts["precision"], parts["input_shape"]
    names = sorted(example_extra)
    t0 = time.perf_counter()
    if patches:
        pixels = [a[None] for _, a in _parts(patches[0])]
    elif isinstance(given, Mapping):
        pixels = [np.zeros((1, *given[n]), np.float32) for n in sorted(given)]
    else:
        pixels = [np.zeros((1, *given), np.float32)]
    modalities = sorted(given) if isinstance(given, Mapping) else None
    example = (
        *(torch.from_numpy(np.ascontiguousarray(a)) for a in pixels),
        *(torch.from_numpy(a) for a in _batched([example_extra], names)),
    )
    shapes = [
        *(ov.PartialShape([-1, *a.shape[1:]]) for a in pixels),
        *(ov.PartialShape([-1, *np.shape(example_extra[n])]) for n in names),
    ]
    plain = not names and modalities is None
    traced = module if plain else _Positional(module, modalities, names).eval()
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # (torch.jit.trace's deprecation and tracer notes)
            ov_model = ov.convert_model(
                traced, example_input=example[0] if plain else example, input=shapes
            )
    except Exception as exc:
        raise ConfigError(
            f"backend: openvino could not convert model {model!r} "
            f"({type(exc).__name__}: {exc}); run it with --backend torch"
        ) from None
    meta: dict[str, Any] = {**parts, "conversion_s": round(time.perf_counter() - t0, 3)}
    if precision == "int8":
        t1 = time.perf_counter()
        ov_model = _quantize(ov_model, patches, extras)
        meta["calibration_s"] = round(time.perf_counter() - t1, 3)
    compiled = _compile(ov_model, precision, threads)
    if patches:
        meta["gate"] = gate_figures(module, compiled, patches, classes, extras)
    try:
        tmp = cache.new_tmp(folder.parent)
        ov.save_model(ov_model, str(tmp / "model.xml"), compress_to_fp16=False)
        cache.write_meta(
            tmp, {**meta, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        )
    except OSError as exc:
        raise ConfigError(
            f"backend_cache_dir: cannot write the converted model in {folder.parent} "
            f"({exc.strerror or exc})"
        ) from None
    cache.publish(tmp, folder)
    logger.info(
        "model %r: converted to openvino %s in %.1f s (%s)",
        model,
        precision,
        meta["conversion_s"],
        folder,
    )
    return Converted(compiled, cache.read_meta(folder) or meta, folder, reused=False)


def _quantize(ov_model: Any, patches: Sequence[Pixels], extras: Sequence[Extra]) -> Any:
    """NNCF post-training static int8 quantisation, calibrated on ``patches`` one at a time."""
    import nncf

    logging.getLogger("nncf").setLevel(logging.WARNING)  # (no progress bars in the logs)
    names = sorted(extras[0]) if extras else []
    items: list[Any] = []
    for i, p in enumerate(patches):  # (several inputs: each item all of them, in order)
        inputs = [np.ascontiguousarray(a[None]) for _, a in _parts(p)]
        inputs += _batched([extras[i]], names) if names else []
        items.append(inputs[0] if len(inputs) == 1 else inputs)
    data = nncf.Dataset(items)
    with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):
        warnings.simplefilter("ignore")  # (NNCF's progress bars go to stderr, not the output)
        return nncf.quantize(ov_model, data, subset_size=len(patches))


def _core() -> Any:
    import openvino as ov

    return ov.Core()


def _compile(ov_model: Any, precision: str, threads: int | None) -> Any:
    """``ov_model`` compiled for the CPU: f32 arithmetic around int8 layers, bf16 for bf16."""
    config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": "bf16" if precision == "bf16" else "f32"}
    if threads is not None:
        config["INFERENCE_NUM_THREADS"] = threads
    return _core().compile_model(ov_model, "CPU", config)


def run_compiled(
    compiled: Any, x: Pixels, extra: Sequence[NDArray[np.float32]] = ()
) -> NDArray[np.float32]:
    """The compiled model's first output for ``x`` (B, ...), a copy the next call keeps.

    ``x``: a batch of pixels, or a multimodal model's by modality; ``extra``: the model's
    other inputs (B, ...) each, in the order of their names.
    """
    inputs = [np.ascontiguousarray(a) for _, a in _parts(x)]
    inputs += [np.ascontiguousarray(e, np.float32) for e in extra]
    result = compiled(inputs[0] if len(inputs) == 1 else inputs, share_outputs=False)
    return np.asarray(result[0], dtype=np.float32)


def gate_figures(
    module: torch.nn.Module,
    compiled: Any,
    patches: Sequence[Pixels],
    classes: bool,
    extras: Sequence[Extra] = (),
) -> dict[str, Any]:
    """The converted model against torch fp32 on ``patches`` (and their ``extras``).

    Returns ``patches``, ``pixels``, ``agreement`` (share of pixels with the same argmax
    class; None when the outputs are not classes), ``max_abs_error`` and ``max_rel_error``
    (over the largest torch output).
    """
    same = pixels = 0
    max_abs = max_ref = 0.0
    names = sorted(extras[0]) if extras else []
    for i in range(0, len(patches), GATE_BATCH):
        x = _stacked(patches[i : i + GATE_BATCH])
        extra = _batched(extras[i : i + GATE_BATCH], names) if names else []
        kwargs = {n: torch.from_numpy(a) for n, a in zip(names, extra, strict=True)}
        with torch.inference_mode():
            ref = module(_torch_input(x), **kwargs)
        ref_np = (ref[0] if isinstance(ref, tuple | list) else ref).float().numpy()
        got = run_compiled(compiled, x, extra)
        max_ref = max(max_ref, float(np.abs(ref_np).max()))
        diff = np.abs(got - ref_np)
        max_abs = max(max_abs, float(diff.max()) if np.isfinite(diff).all() else math.inf)
        if classes and ref_np.ndim == 4:
            same += int((got.argmax(axis=1) == ref_np.argmax(axis=1)).sum())
            pixels += ref_np.shape[0] * ref_np.shape[2] * ref_np.shape[3]
    return {
        "patches": len(patches),
        "pixels": pixels,
        "agreement": same / pixels if classes and pixels else None,
        "max_abs_error": max_abs,
        "max_rel_error": max_abs / max(max_ref, 1e-30),
        "min_agreement": MIN_AGREEMENT,
    }


def check_gate(meta: dict[str, Any], model: str, gate: str) -> None:
    """Refuse (or with ``gate="warn"`` warn about) a model whose gate figures fall short.

    Raises:
        ConfigError: agreement below :data:`MIN_AGREEMENT` and ``gate`` is ``refuse``.
    """
    figures = meta.get("gate")
    if not figures:
        return
    precision = meta.get("precision")
    agreement = figures.get("agreement")
    said = (
        f"max logit error {figures['max_abs_error']:.4g} "
        f"({100 * figures['max_rel_error']:.3f} % of the largest output)"
    )
    if agreement is None:
        logger.warning(
            "model %r: openvino %s: its outputs are not classes, so no agreement gate applies; "
            "on the calibration patches: %s",
            model,
            precision,
            said,
        )
        return
    if agreement >= MIN_AGREEMENT:
        logger.info(
            "model %r: openvino %s passed the accuracy gate: %.3f %% same classes, %s",
            model,
            precision,
            100 * agreement,
            said,
        )
        return
    why = (
        f"precision: openvino {precision} of model {model!r} gives {100 * agreement:.2f} % of "
        f"the calibration pixels the same class as torch fp32 (under the "
        f"{100 * MIN_AGREEMENT:.0f} % gate; {said})"
    )
    if gate != "warn":
        raise ConfigError(
            f"{why}; use --precision fp32, other --calibrate scenes, or --accuracy-gate warn "
            "to run it anyway"
        )
    warnings.warn(
        f"{why}; running anyway (--accuracy-gate warn)", AccuracyGateWarning, stacklevel=2
    )
