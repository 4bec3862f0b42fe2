"""The model runner: one forward pass over a batch of patches, and what it takes to run it.

:meth:`ModelRunner.forward` stacks a batch's patches (and their per-request model arguments
such as ``temporal_coords``) on the device, pads it to one shape for a compiled model, runs the
model under ``torch.inference_mode`` (and autocast when a dtype is set), and checks what comes
back: a (B, C, P, P) tensor, or (B, C, T, P, P) turned into T x C bands.
:meth:`ModelRunner.forward_fitting` splits a batch that runs out of device memory and lowers
the batch cap. :meth:`ModelRunner.run` isolates a forward pass that raises to the requests
whose own patches make it fail. Its start-up (the warm-up and ``"auto"`` batch sizing) is in
:mod:`geoserve.engine.startup`.

On the CPU a batch of host patches is copied into a staging buffer reused from batch to batch
(a fresh ``np.stack`` of tens of MB costs page faults each time). A model may hand back a view
of its input (an identity, a channel slice), and outputs are stitched, cached and joined
(halves of a batch split after running out of memory) after the forward pass returns: a
buffer is reused only once nothing references the batch staged in it
(:class:`~geoserve.engine.transfer.Staging`), so the next batch never overwrites a live output.
On a GPU the batch is stacked as before (a new pageable array per batch, whose copy to the
device is done with it when ``.to`` returns). Outputs come back to the host through
:func:`geoserve.engine.transfer.to_host`, only when a patch's canvas is on the host.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, cast

import numpy as np
import torch
from einops import rearrange
from numpy.typing import NDArray

from geoserve.engine import transfer
from geoserve.engine.batch import BatchOutput, Patch
from geoserve.engine.stepping import StepStats, forward_step
from geoserve.errors import (
    GeoServeError,
    ModelExecutionError,
    ModelOutputShapeError,
    count,
)
from geoserve.models.steps import SteppedModel
from geoserve.processors.base import RasterContext

logger = logging.getLogger(__name__)


class ModelRunner:
    """Runs one model on batches of patches; see the module docstring.

    Args:
        model: The (possibly compiled) module.
        name: The model's registered name, for messages.
        device: Where it runs.
        dtype: Autocast dtype; ``None`` runs float32.
        compiled: Pad batches to ``max_batch_patches`` (one graph for every batch).
        max_batch_patches: The batch cap; lowered when the device runs out of memory.
        embedding_layer: The encoder block whose tokens embeddings kinds take.
        token_size: Pixels per token of the model's encoder (None: it has no token grid).
        eager: The uncompiled module behind ``model`` (default: ``model``), for start-up
            passes at other batch sizes than ``max_batch_patches`` (no graph compiled for them).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        name: str,
        device: torch.device,
        dtype: torch.dtype | None,
        *,
        compiled: bool,
        max_batch_patches: int,
        embedding_layer: int = -1,
        token_size: int | None = None,
        eager: torch.nn.Module | None = None,
    ) -> None:
        self.embedding_layer = embedding_layer
        self.token_size = token_size
        self.model = model
        self.eager = model if eager is None else eager
        self.name = name
        self.device = device
        self.dtype = dtype
        self.compiled = compiled
        self.max_batch_patches = max_batch_patches
        self._staging = transfer.Staging()  # CPU batches, reused (see the module docstring)
        #: A stepped model's step kinds (None: one forward pass per patch).
        self.plan = self.eager.plan() if isinstance(self.eager, SteppedModel) else None
        #: Its steps run so far, per kind (None: one-pass model).
        self.step_stats = StepStats(self.plan) if self.plan is not None else None

    # -- running batches ---------------------------------------------------------------------

    def run(self, batch: list[Patch]) -> Iterator[BatchOutput]:
        """The outputs of ``batch``'s live patches, in parts; the caller stitches each part.

        A forward pass that raises is retried as two halves, down to single patches, so only
        the requests whose own patches make the model fail get an error (a batch of B patches
        with one poisoned patch costs about 2 log2(B) extra passes). Patches whose request
        failed meanwhile (the caller fails requests between parts) are dropped. For a stepped
        model the patches that took a step and wait for their next come back as one part
        with ``more_steps`` set.
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
        error: GeoServeError | None = None
        host_tokens: NDArray[np.float32] | None = None
        span = transfer.DeviceSpan(self.device)
        waited = 0.0
        done: list[Patch] = []
        pending: list[Patch] = []
        try:
            out, tokens, done, pending = self._forward_any(batch)
            span.stop(len(batch))
            t1 = time.perf_counter()
            if out is not None and any(p.request.canvas.device is None for p in done):
                host, host_tokens = _to_host(out, tokens)
            waited = time.perf_counter() - t1
        except Exception as exc:
            if len(batch) == 1:
                error = self._patch_failed(batch[0], exc)
            else:
                logger.warning(
                    "forward pass of %d patches failed (%r); retrying each half", len(batch), exc
                )
        else:
            n = len(batch)
            seconds = (time.perf_counter() - t0 - waited) / n
            for p in pending:
                p.seconds += seconds
            if pending:
                yield BatchOutput(pending, seconds=seconds, more_steps=True)
            if done and out is not None:
                spent = seconds + sum(p.seconds for p in done) / len(done)
                yield BatchOutput(
                    done, out, host, spent, None, tokens, host_tokens, waited / n, span
                )
            return
        if error is not None:
            yield BatchOutput(batch, error=error)
            return
        half = (len(batch) + 1) // 2
        yield from self.run(batch[:half])
        yield from self.run(batch[half:])

    def _forward_any(
        self, batch: list[Patch]
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, list[Patch], list[Patch]]:
        """A forward pass, or a stepped model's step.

        Returns the outputs, the tokens, the patches they are of, and the patches that wait
        for their next step.
        """
        if self.plan is None:
            out, tokens = self.forward_fitting(batch)
            return out, tokens, batch, []
        stepped, done = self.step_fitting(batch)
        finished = {id(p) for p in done}
        return stepped, None, done, [p for p in batch if id(p) not in finished]

    def _patch_failed(self, patch: Patch, exc: Exception) -> GeoServeError:
        """The error a forward pass on ``patch`` alone raised, naming the patch's input.

        (Called while handling ``exc``: an unexpected one is logged with its traceback.)
        """
        name = patch.request.ctx.names[0]
        if isinstance(exc, ModelExecutionError):  # the model raised: name the input too
            logger.error("forward pass failed on a single patch: %s", exc)
            return ModelExecutionError(f"{name}: {exc}")
        if isinstance(exc, GeoServeError):
            return exc
        logger.exception("forward pass failed on a single patch")
        return ModelExecutionError(
            f"model {self.name!r} failed on a patch of this request ({name}): {exc!r}"
        )

    def forward_fitting(self, batch: list[Patch]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`forward`, splitting the batch in two while the device runs out of memory."""

        def join(a: Any, b: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
            (ya, ta), (yb, tb) = a, b
            tokens = torch.cat([ta, tb]) if ta is not None and tb is not None else None
            return torch.cat([ya, yb]), tokens

        return cast(
            tuple[torch.Tensor, torch.Tensor | None], self._fitting(self.forward, batch, join)
        )

    def step_fitting(self, batch: list[Patch]) -> tuple[torch.Tensor | None, list[Patch]]:
        """One step of a stepped model, split like :meth:`forward_fitting`.

        See :func:`geoserve.engine.stepping.forward_step`.
        """

        def join(a: Any, b: Any) -> tuple[torch.Tensor | None, list[Patch]]:
            parts = [y for y, _ in (a, b) if y is not None]
            return (torch.cat(parts) if parts else None), a[1] + b[1]

        def one(part: list[Patch]) -> Any:
            return forward_step(self, part)

        return cast(tuple[torch.Tensor | None, list[Patch]], self._fitting(one, batch, join))

    def _fitting(
        self, fn: Callable[[list[Patch]], Any], batch: list[Patch], join: Callable[[Any, Any], Any]
    ) -> Any:
        """``fn(batch)``; while the device runs out of memory, ``join`` of it on each half.

        The batch cap is lowered to the half.
        """
        try:
            return fn(batch)
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
        return join(self._fitting(fn, batch[:half], join), self._fitting(fn, batch[half:], join))

    def forward(
        self, batch: list[Patch], *, eager: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One forward pass: (B, C_out, P, P) float32 on the model's device.

        With it the encoder's (B, D, P / t, P / t) tokens, when a request of the batch asked
        for them (else None). ``eager``: on the uncompiled module, unpadded.
        """
        x = self.inputs(batch)
        kwargs = self.model_kwargs(batch)
        n = padded = len(batch)
        module = self.eager if eager else self.model
        if self.compiled and not eager and n < self.max_batch_patches:  # one shape: one graph
            padded = self.max_batch_patches
            x = _pad(x, padded - n)
            kwargs = {k: _pad(v, padded - n) for k, v in kwargs.items()}
        want_tokens = any(getattr(p.request, "wants_tokens", False) for p in batch)
        y, tokens = self._call(module, batch, x, kwargs, want_tokens)
        if isinstance(y, tuple | list):
            y = y[0]
        if isinstance(y, torch.Tensor) and padded != n and y.shape[0] == padded:
            y = y[:n]  # drop the padding
        y = self.checked(y, batch, x)
        if tokens is not None:
            tokens = self._check_tokens(tokens[:n], batch, x)
        return y, tokens

    def inputs(self, batch: list[Patch]) -> Any:
        """The batch's model input on the device: a tensor, or one per modality."""
        first = batch[0].data
        if isinstance(first, Mapping):  # a multimodal model: one batch per modality
            return {k: self._stack([p.data[k] for p in batch], k) for k in first}  # type: ignore[call-overload,index]
        return self._stack([p.data for p in batch], None)  # type: ignore[misc]

    def model_kwargs(self, batch: list[Patch]) -> dict[str, Any]:
        """The per-request model arguments (``temporal_coords`` ...), one row per patch."""
        kwargs: dict[str, Any] = {}
        for key in batch[0].request.ctx.model_kwargs:
            vals = np.stack([p.request.ctx.model_kwargs[key] for p in batch])
            # (from a new pageable array: done with it when `.to` returns, no wait for the GPU)
            kwargs[key] = torch.from_numpy(vals).to(self.device, non_blocking=True)
        return kwargs

    def checked(self, y: Any, batch: list[Patch], x: Any) -> torch.Tensor:
        """The model's output for ``batch``: (B, C_out, P, P) float32, or a clear error."""
        if not isinstance(y, torch.Tensor):
            raise ModelOutputShapeError(
                f"model {self.name!r} returned {type(y).__name__}, not a tensor"
            )
        n = len(batch)
        if y.ndim == 5:  # (B, C, T, H, W): one band per (date, channel)
            y = rearrange(y, "b c t h w -> b (t c) h w")
        p = batch[0].request.ctx.grid.patch_size
        if y.ndim != 4 or y.shape[0] != n or tuple(y.shape[-2:]) != (p, p):
            raise ModelOutputShapeError(
                f"model {self.name!r} returned shape {tuple(y.shape)} for input "
                f"{input_shape(x)}; expected (batch={n}, channels, {p}, {p})"
            )
        return cast(torch.Tensor, y.float())

    def _stack(self, datas: list[NDArray[Any] | torch.Tensor], key: str | None) -> torch.Tensor:
        """One batch tensor on the device from host arrays or (already moved) device tensors."""
        if not all(isinstance(d, np.ndarray) for d in datas):
            return torch.stack([torch.as_tensor(d).to(self.device) for d in datas])
        arrays = cast(list[NDArray[Any]], datas)
        if self.device.type == "cpu":
            return self._staging.stack(arrays, key)
        return torch.from_numpy(np.stack(arrays)).to(self.device, non_blocking=True)

    def _call(
        self,
        module: torch.nn.Module,
        batch: list[Patch],
        x: Any,
        kwargs: dict[str, Any],
        want_tokens: bool,
    ) -> tuple[Any, torch.Tensor | None]:
        """``module`` on ``x``: its output, and its tokens when ``want_tokens``."""
        try:
            with torch.inference_mode(), self.autocast():
                if want_tokens:
                    y, tokens = module.forward_with_tokens(  # type: ignore[operator]
                        x, layer=self.embedding_layer, **kwargs
                    )
                    return y, tokens
                return module(x, **kwargs), None
        except (torch.OutOfMemoryError, GeoServeError):
            raise
        except Exception as exc:
            raise self.model_failed(batch[0].request.ctx, x, exc) from exc

    def _check_tokens(self, tokens: torch.Tensor, batch: list[Patch], x: Any) -> torch.Tensor:
        """The tokens a model returned: (B, D, P / t, P / t), as float32."""
        t = self.token_size or 1
        p = batch[0].request.ctx.grid.patch_size // t
        if tokens.ndim != 4 or tokens.shape[0] != len(batch) or tuple(tokens.shape[-2:]) != (p, p):
            raise ModelOutputShapeError(
                f"model {self.name!r} returned tokens of shape {tuple(tokens.shape)} for input "
                f"{input_shape(x)}; expected (batch={len(batch)}, D, {p}, {p}) for {t}-pixel tokens"
            )
        return tokens.float()

    def model_failed(
        self, ctx: RasterContext, x: torch.Tensor, exc: Exception
    ) -> ModelExecutionError:
        """The model raised: say which model, what it was given and where that came from."""
        names = ", ".join(ctx.band_names)
        return ModelExecutionError(
            f"model {self.name!r} failed on input of shape {input_shape(x)} "
            f"({count(len(ctx.bands), 'band')} from its input processor: {names}): "
            f"{type(exc).__name__}: {exc}"
        )

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Autocast to :attr:`dtype` on the device (nothing when it is None)."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)


def _to_host(
    out: torch.Tensor, tokens: torch.Tensor | None
) -> tuple[NDArray[np.float32], NDArray[np.float32] | None]:
    """One copy of a batch's outputs (and tokens) back to the host.

    A host canvas fed by a device model needs the values now: the one wait for the device
    that stays in the loop (both copies started first); on a GPU this is also where an
    asynchronous error of the forward pass surfaces, so it is retried like one.
    """
    out_copy = transfer.to_host(out)
    tokens_copy = transfer.to_host(tokens) if tokens is not None else None
    host = cast(NDArray[np.float32], out_copy.wait())
    if tokens_copy is None:
        return host, None
    return host, cast(NDArray[np.float32], tokens_copy.wait())


def input_shape(x: Any) -> str:
    """A model input's shape for messages: ``(2, 3, 224, 224)``, or per modality."""
    if x is None:  # (a stepped model's later step: its input is its state)
        return "a step's state"
    if isinstance(x, Mapping):
        return "{" + ", ".join(f"{k!r}: {input_shape(v)}" for k, v in x.items()) + "}"
    return str(tuple(x.shape))


def _pad(x: Any, pad: int) -> Any:
    """``x`` (a batch, or a dict of them) with its last item repeated ``pad`` more times."""
    if isinstance(x, Mapping):
        return {k: _pad(v, pad) for k, v in x.items()}
    return torch.cat([x, x[-1:].expand(pad, *x.shape[1:])])
