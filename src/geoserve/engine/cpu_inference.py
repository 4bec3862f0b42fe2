"""The CPU fast path: int8 quantisation of a loaded model, and what this CPU runs natively.

``quantize="int8"`` replaces every ``nn.Linear`` of the model (the ViT encoders' attention and
MLP layers, linear heads) by a dynamically quantised one: weights stored as int8 with one scale
per output channel, activations quantised per batch as they arrive, products summed in int32 by
PyTorch's x86 (FBGEMM/oneDNN) or ARM (QNNPACK) kernels. Convolutions, norms and everything else
stay float32. It runs in eager mode, so it needs no warm-up compile and no calibration data.

Why ``torch.ao.quantization.quantize_dynamic`` and not the ``torchao`` package that PyTorch now
points to: measured on a 2-core x86-64 CPU (AVX2, no VNNI) with a Prithvi-EO-2.0-100M-shaped
UperNet model at batch 4, torch 2.14.1, torchao 0.18.0, 2026-12-01, eager mode:
``quantize_dynamic`` ran 1.39x float32, ``torchao``'s ``Int8DynamicActivationInt8WeightConfig``
0.06x (its int8 tensors take a generic path unless the model is compiled); see
docs/performance.md for the compiled figures. ``torch.ao.quantization`` warns that it is
deprecated; its warnings are silenced here, and a torch without it gets a clear error.

Reduced precision (``dtype="bf16"``/``"fp16"``) is autocast; on a CPU without native bf16 or
fp16 arithmetic (AVX512-BF16, AMX, ARM BF16) it is emulated and far slower than float32, so
:func:`check_cpu_options` warns.
"""

from __future__ import annotations

import functools
import logging
import platform
import warnings
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from geoserve.errors import ConfigError, GeoServeWarning

logger = logging.getLogger(__name__)

Quantize = Literal["int8"]


class SlowOptionWarning(GeoServeWarning):
    """Issued when an option is known to make this machine slower, not faster."""


def check_cpu_options(
    device: torch.device,
    dtype: torch.dtype | None,
    quantize: Quantize | None,
    *,
    model: str,
    validated: tuple[str, ...] = (),
) -> None:
    """Warn about options that will be slow here, or that this model was not checked with.

    (:class:`~geoserve.config.EngineConfig` refuses the combinations that cannot work.)
    """
    if quantize is not None and quantize not in validated:
        logger.warning(
            "model %r has not been validated with quantize=%s: check it on your own scene "
            "first (geoserve bench-accuracy --model %s --quantize %s SCENE.tif)",
            model,
            quantize,
            model,
            quantize,
        )
    if device.type == "cpu" and dtype in (torch.bfloat16, torch.float16):
        name: Literal["bf16", "fp16"] = "bf16" if dtype == torch.bfloat16 else "fp16"
        if not native_reduced_precision(name):
            warnings.warn(
                f"dtype {name} on this CPU ({cpu_name()}) is emulated: it has no native {name} "
                "arithmetic (AVX512-BF16/AMX on x86), so autocast runs far slower than float32 "
                "(measured 50 to 100 times slower for Prithvi-sized models on an AVX2 CPU; "
                "docs/performance.md); use --quantize int8 for speed on a CPU",
                SlowOptionWarning,
                stacklevel=3,
            )


@functools.cache
def native_reduced_precision(name: Literal["bf16", "fp16"]) -> bool:
    """Whether this CPU computes ``name`` natively (so autocast to it can pay)."""
    flags = cpu_flags()
    if name == "bf16":
        if flags & {"avx512_bf16", "amx_bf16", "bf16"}:  # x86; ARM's BF16 extension
            return True
        check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
        return bool(check()) if check is not None and not flags else False
    if flags & {"amx_fp16", "avx512_fp16", "fphp"}:  # x86 AMX/AVX512-FP16; ARM half precision
        return True
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_fp16_supported", None)
    return bool(check()) if check is not None and not flags else False


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


@functools.cache
def cpu_name() -> str:
    """The CPU's model name, for messages and benchmark records."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def quantize_model(module: nn.Module, scheme: Quantize, model: str) -> nn.Module:
    """``module`` with its linear layers quantised (``scheme``: "int8"); see the module docs.

    Raises:
        ConfigError: this torch has no dynamic quantisation, or the module has no linear layer.
    """
    if scheme != "int8":
        raise ConfigError(f"quantize: unknown scheme {scheme!r}; known: int8")
    # quantize_dynamic replaces plain nn.Linear layers only (not subclasses, such as
    # MultiheadAttention's NonDynamicallyQuantizableLinear)
    n_linear = sum(type(m) is nn.Linear for m in module.modules())
    if n_linear == 0:
        raise ConfigError(
            f"quantize: model {model!r} has no linear layers; int8 quantises only those"
        )
    seq_first = sorted(
        {type(m).__name__ for m in module.modules() if isinstance(m, _SEQUENCE_LAYERS)}
    )
    if seq_first:
        raise ConfigError(
            f"quantize: model {model!r} uses {', '.join(seq_first)}, whose linear layers may "
            "see tokens, not patches, first (and whose fast path reads their weights): int8 "
            "runs each linear layer one patch at a time and takes only timm-style attention "
            "(nn.Linear layers on batch-first tensors)"
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic
    except ImportError as exc:
        raise ConfigError(
            f"quantize: this torch ({torch.__version__}) has no torch.ao.quantization ({exc}); "
            "int8 needs a torch that ships it"
        ) from None
    with warnings.catch_warnings():
        # deprecation notices of torch.ao.quantization and of quantised tensors (see above)
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quantize_per_(tensor|channel).*")
        quantized: nn.Module = quantize_dynamic(  # type: ignore[no-untyped-call]
            module, {nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8, inplace=False
        )
    _per_patch(quantized)
    logger.info("model %r: %d linear layers quantised to int8", model, n_linear)
    return quantized


#: torch's attention layers: sequence-first by default, and their inference fast path reads the
#: weights of their linear layers directly.
_SEQUENCE_LAYERS = (
    nn.MultiheadAttention,
    nn.TransformerEncoderLayer,
    nn.TransformerDecoderLayer,
    nn.Transformer,
)


class PerPatchLinear(nn.Module):
    """A dynamically quantised linear layer run on one patch at a time.

    Dynamic quantisation scales a layer's input by its largest value, over the whole tensor it
    is given: over a batch, one patch's result would depend on the other patches in it (other
    requests' data, with cross-request batching) and on the batch size. Run per patch (the
    first dimension), each patch is scaled by its own values alone; a CPU gains little from
    large batches, and the measured cost of the loop is in docs/performance.md.
    """

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The inner layer on each patch of ``x`` (its first dimension), concatenated."""
        if x.dim() < 2 or x.shape[0] == 1:
            return self.inner(x)  # type: ignore[no-any-return]
        return torch.cat([self.inner(x[i : i + 1]) for i in range(x.shape[0])])


def _per_patch(module: nn.Module) -> None:
    """Wrap every dynamically quantised linear layer of ``module`` in :class:`PerPatchLinear`."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    for name, child in list(module.named_children()):
        if isinstance(child, DynamicLinear):
            setattr(module, name, PerPatchLinear(child))
        else:
            _per_patch(child)
