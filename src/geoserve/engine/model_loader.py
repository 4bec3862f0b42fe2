"""Turning a model name into a ready module and its processors.

Looks the name up (loading plugins first), checks that both processors are registered, builds
the module with its factory and loads weights strictly (read and matched by
:mod:`geoserve.models.state_dict`, the one reader of weights files, whose messages name the file,
the model and the keys that do not match). Weights given as a Hub reference
(``hf://ORG/REPO[/FILE][@REVISION]``) are fetched and verified here first
(:mod:`geoserve.models.hub`), so every way of building an engine takes them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch

from geoserve.config import EngineConfig
from geoserve.engine.cpu_inference import check_cpu_options, quantize_model
from geoserve.errors import ConfigError, ProcessorMismatchError, WeightsError
from geoserve.models.hub import resolve_weights
from geoserve.models.state_dict import load_weights
from geoserve.plugins import load_plugins
from geoserve.processors.base import InputProcessor, OutputProcessor
from geoserve.registry import INPUT_REGISTRY, MODEL_REGISTRY, OUTPUT_REGISTRY, ModelSpec


def resolve_model(model: str | ModelSpec) -> tuple[ModelSpec, InputProcessor, OutputProcessor]:
    """Look up a model and both of its processors.

    Raises:
        UnknownModelError: the name is not registered (the message lists those that are).
        ProcessorMismatchError: the model lacks an input or an output processor.
    """
    if isinstance(model, str):
        load_plugins()
        spec = MODEL_REGISTRY.get(model)
    else:
        spec = model
    missing = [
        (label, deco)
        for label, reg, deco in (
            ("input", INPUT_REGISTRY, "@INPUT_REGISTRY.register_input_processor(...)"),
            ("output", OUTPUT_REGISTRY, "@OUTPUT_REGISTRY.register_output_processor(...)"),
        )
        if spec.key not in reg
    ]
    if missing:
        what = " and no ".join(f"{label} processor" for label, _ in missing)
        fix = " and ".join(deco for _, deco in missing)
        raise ProcessorMismatchError(
            f"model {spec.name!r} has no {what}; decorate {spec.key} with {fix}"
        )
    return spec, INPUT_REGISTRY.get(spec.key), OUTPUT_REGISTRY.get(spec.key)


def build_model(
    spec: ModelSpec, weights: str | Path | None, device: torch.device
) -> torch.nn.Module:
    """Build ``spec``'s module, load ``weights`` if given, move it to ``device``, eval mode.

    ``weights`` is a local file or a Hub reference, fetched (or read from the Hub's cache) and
    verified before the model is built.

    Raises:
        ConfigError: ``weights`` is a malformed reference or a URL of another scheme.
        WeightsError: the model needs weights and none were given, a reference cannot be
            fetched, or the weights do not load.
    """
    if weights is None and spec.weights_required:
        hint = f" ({spec.weights_hint})" if spec.weights_hint else ""
        raise WeightsError(
            f"model {spec.name!r} needs a weights file (--weights FILE on the command line, "
            f"weights= in Python){hint}"
        )
    weights = resolve_weights(weights)
    if spec.loads_weights:
        module: Any = spec.factory(weights)  # type: ignore[call-arg]
    else:
        module = spec.factory()
    if not isinstance(module, torch.nn.Module):
        raise ProcessorMismatchError(
            f"model {spec.name!r}: factory {spec.key} returned {type(module).__name__}, "
            "not a torch.nn.Module"
        )
    if weights is not None and not spec.loads_weights:
        load_weights(module, weights, spec.name)
    return module.to(device).eval()


def load_module(
    spec: ModelSpec,
    config: EngineConfig,
    device: torch.device,
    dtype: torch.dtype | None,
    fit: Callable[[torch.nn.Module], None] | None = None,
) -> torch.nn.Module:
    """``spec``'s module as ``config`` runs it, before compiling.

    The CPU options are checked, the module built with its weights (:func:`build_model`),
    given to ``fit`` (which may load more weights into it: it is moved to ``device`` again
    after), and quantized when asked (after the weights, before compiling).

    Raises:
        ConfigError, WeightsError, ProcessorMismatchError: as :func:`build_model`, and for
            CPU options this machine or model cannot take.
    """
    q = config.quantize
    check_cpu_options(device, dtype, q, model=spec.name, validated=spec.validated)
    module = build_model(spec, config.weights, device)
    if fit is not None:
        fit(module)
        module = module.to(device).eval()
    return module if q is None else quantize_model(module, q, spec.name)


def compiled(module: torch.nn.Module, backend: str) -> torch.nn.Module:
    """``module`` under ``torch.compile`` with static shapes (batches are padded to one size)."""
    return cast(torch.nn.Module, torch.compile(module, backend=backend, dynamic=False))


def check_device(name: str) -> torch.device:
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


def check_compile_backend(backend: str) -> None:
    """Refuse a ``torch.compile`` backend this installation does not have (naming those it has).

    Raises:
        ConfigError: naming the backend and the known ones.
    """
    known = torch.compiler.list_backends(exclude_tags=())
    if backend not in known:
        raise ConfigError(f"compile_backend: unknown {backend!r}; known: {', '.join(known)}")


def resolve_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    """An autocast dtype from a torch dtype or its name (``"bf16"``, ``"float16"`` ...).

    Raises:
        ConfigError: an unknown name.
    """
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
