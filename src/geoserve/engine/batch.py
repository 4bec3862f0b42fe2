"""What moves through a batch: a queued patch, the outputs of a forward pass, patch keys.

Plain values shared by the request (:mod:`geoserve.engine.request`, which queues patches),
the model runner (:mod:`geoserve.engine.runner`, which makes outputs of them), the output stage
and the patch cache (:mod:`geoserve.engine.patch_cache`, which answers some from memory), so
none of those modules imports another for them.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from numpy.typing import NDArray

from geoserve.engine import transfer
from geoserve.errors import GeoServeError
from geoserve.processors.base import ModelInput

if TYPE_CHECKING:
    from geoserve.engine.patch_cache import PatchCache
    from geoserve.engine.request import Request


@dataclass
class Patch:
    """One queued model input and where its output goes.

    ``step`` and ``state``: for a model whose patches take several steps
    (:class:`geoserve.models.steps.SteppedModel`), the next step's index and the state it
    starts from (None before the first step).
    """

    request: Request
    row: int
    col: int
    data: ModelInput
    step: int = 0
    state: dict[str, torch.Tensor] | None = None
    seconds: float = 0.0  # model time of its earlier steps


@dataclass
class BatchOutput:
    """What :meth:`ModelRunner.run` made of some of a batch's patches.

    Attributes:
        patches: The patches, in the order of the outputs.
        out: (B, C_out, P, P) float32 on the model's device.
        host: ``out`` copied to the host, when some patch's canvas is there.
        seconds: Model time per patch.
        error: Instead of outputs: why the forward pass failed on these patches.
        tokens: (B, D, P / t, P / t) float32 encoder tokens, when a request of the batch asked
            for an embeddings kind (on the device).
        host_tokens: ``tokens`` copied to the host, when some patch's canvas is there.
        wait_seconds: Time per patch the main thread waited for the device (the host copies).
        span: The forward pass's time on the device (CUDA events; 0 elsewhere).
        more_steps: The patches took a step and wait for their next (no outputs yet).
    """

    patches: list[Patch]
    out: torch.Tensor | None = None
    host: NDArray[np.float32] | None = None
    seconds: float = 0.0
    error: GeoServeError | None = None
    tokens: torch.Tensor | None = None
    host_tokens: NDArray[np.float32] | None = None
    wait_seconds: float = 0.0
    span: transfer.DeviceSpan | None = None
    more_steps: bool = False


@dataclass(frozen=True)
class PatchKeys:
    """How one request's patches are named in a :class:`PatchCache`.

    ``key(row, col)`` is the key of the request's grid patch (row, col), or None for a patch
    whose input is not the scene's own (one filled at the edge of a cut-out); see
    :mod:`geoserve.tiles.plan`.
    """

    cache: PatchCache
    key: Callable[[int, int], Hashable | None]
