"""Models whose every patch takes several steps, and their position-keyed random numbers.

The contract with the engine, and the random numbers that keep outputs reproducible and
seamless.

A generative model (TerraMind's any-to-any generation: token-sampling passes, then a diffusion
decoder's denoising steps) runs a patch through several forward calls. A model says so by
subclassing :class:`SteppedModel`: it names the kind of each step (:meth:`SteppedModel.plan`),
and the engine, instead of one forward pass per patch, calls :meth:`SteppedModel.step` on
batches of patches that are due a step of the same kind — a batch may mix patches of different
requests at different steps, the way an LLM engine batches decode steps of different
sequences. Between steps a patch waits with its *state* (a dict of tensors); after its last
step :meth:`SteppedModel.finish` turns the state into the (C, P, P) output that is blended
into the scene like any model's output.

**Reproducible**: the engine gives every patch its request's ``seed`` and the patch's
``origin`` (the scene pixel of its top-left corner, which may be negative at the edges). Draw
every random number from them — :func:`noise_field` for values indexed by scene position,
:func:`patch_generator` for draws of one patch — never from torch's global generator, and a
patch's output does not depend on batch size, batch composition, other requests or threads.
**Seamless**: :func:`noise_field` gives overlapping patches the same numbers where they overlap,
so a diffusion starts from the same noise across a patch border.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from torch import nn

from geoserve.errors import ConfigError

State = dict[str, torch.Tensor]
"""A batch's state between steps: tensors whose first dimension is the batch."""

#: Side of the square cells a :func:`noise_field` is drawn in (pixels).
NOISE_CELL = 64
_MASK64 = (1 << 64) - 1


class SteppedModel(nn.Module):
    """A model whose patches take several steps; see the module docstring.

    Subclasses implement :meth:`plan`, :meth:`step` and :meth:`finish` (and :meth:`begin` when
    the first state is more than the input). ``forward`` runs every step on one batch, so the
    model works outside the engine too (and the engine's warm-up checks it that way).
    """

    def configure(
        self,
        *,
        kinds: Sequence[str],
        options: Mapping[str, Any],
        patch_size: int,
        stride: int,
    ) -> None:
        """Fit the model to the engine before its weights move to the device.

        Called once by the engine at start-up, before :meth:`plan`. ``kinds``: the engine's
        output kinds (a generative model may generate exactly what they name); ``options``:
        the generation options the configuration sets (``steps``, ``temperature``,
        ``top_p``, ``top_k``, ``batch_invariant``: only those given); ``patch_size`` and
        ``stride``: the engine's tiling. The default takes no option.

        Raises:
            ConfigError: an option, kind or tiling the model cannot take, naming it.
        """
        if options:
            raise ConfigError(
                f"{type(self).__name__} takes no generation options "
                f"(given: {', '.join(sorted(options))})"
            )

    def request_kwargs(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """A request's own generation options as per-request model arguments.

        ``options``: what the request sets (``temperature``, ``top_p``, ``top_k``: only those
        given, already checked against the engine's fields). Returns arrays without a batch
        axis, the same names for every request (the engine's values where the request sets
        none), given to every step of the request's patches as ``(B, ...)`` tensors. The
        default takes none.

        Raises:
            ConfigError: an option the model cannot take per request, naming it.
        """
        if options:
            raise ConfigError(
                f"{type(self).__name__} takes no per-request options "
                f"(given: {', '.join(sorted(options))})"
            )
        return {}

    def plan(self) -> tuple[str, ...]:
        """The kind of each step, in order (at least one).

        Steps of one kind run the same computation and may share a batch whatever their
        step index, e.g. ``("tokens", "denoise", "denoise", ...)``.
        """
        raise NotImplementedError

    def begin(
        self, x: Any, *, seed: torch.Tensor, origin: torch.Tensor, **kwargs: torch.Tensor
    ) -> State:
        """The state before the first step, for a batch of model inputs ``x``.

        ``seed``: (B,) int64, each patch's request seed; ``origin``: (B, 2) int64, each
        patch's top-left (row, col) on its scene. ``kwargs``: the model's per-request
        arguments (e.g. ``temporal_coords``), also given to every step. The default keeps
        ``x`` (a tensor, or a dict of them for a multimodal model: ``x_<name>``), the seed and
        the origin.
        """
        state: State = {"seed": seed, "origin": origin}
        if isinstance(x, dict):
            state.update({f"x_{k}": v for k, v in x.items()})
        else:
            state["x"] = x
        return state

    def step(self, kind: str, state: State, index: torch.Tensor, **kwargs: torch.Tensor) -> State:
        """One step of ``kind`` for a batch; returns the new state.

        ``index`` (B,) int64 holds each row's step number (rows may be at different steps of
        the same kind). The new state has the same keys for every row.
        """
        raise NotImplementedError

    def finish(self, state: State, **kwargs: torch.Tensor) -> torch.Tensor:
        """The output, (B, C, P, P), of a batch whose rows all took their last step."""
        raise NotImplementedError

    def forward(
        self,
        x: Any,
        *,
        seed: torch.Tensor | int = 0,
        origin: torch.Tensor | None = None,
        **kwargs: torch.Tensor,
    ) -> torch.Tensor:
        """Every step on one batch (all rows in step); ``origin`` default: (0, 0)."""
        first = next(iter(x.values())) if isinstance(x, dict) else x
        b, device = first.shape[0], first.device
        seeds = seed if isinstance(seed, torch.Tensor) else torch.full((b,), seed)
        if origin is None:
            origin = torch.zeros(b, 2, dtype=torch.int64)
        state = self.begin(x, seed=seeds.to(device), origin=origin.to(device), **kwargs)
        for i, kind in enumerate(self.plan()):
            index = torch.full((b,), i, dtype=torch.int64, device=device)
            state = self.step(kind, state, index, **kwargs)
        return self.finish(state, **kwargs)


def split_state(state: State, n: int) -> list[State]:
    """``state`` of an ``n``-row batch as ``n`` one-patch states (views, no batch dimension)."""
    return [{k: v[i] for k, v in state.items()} for i in range(n)]


def stack_states(states: Sequence[State]) -> State:
    """One batch state from one-patch states (the inverse of :func:`split_state`)."""
    return {k: torch.stack([s[k] for s in states]) for k in states[0]}


def _mix(*values: int) -> int:
    """A 63-bit seed from integers (splitmix64 steps): stable across runs and platforms."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (v & _MASK64)) & _MASK64
        h = (h + 0x9E3779B97F4A7C15) & _MASK64
        h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & _MASK64
        h ^= h >> 31
    return h >> 1


def patch_generator(
    seed: int, origin: tuple[int, int], step: int, stream: int = 0
) -> torch.Generator:
    """A CPU generator for one patch's draws at one step.

    Derived from (seed, origin, step, stream) alone: the same in any batch, on any thread.
    """
    return torch.Generator().manual_seed(_mix(seed, origin[0], origin[1], step, stream))


def noise_field(
    seed: int,
    stream: int,
    origin: tuple[int, int],
    shape: tuple[int, int, int],
    *,
    scale: int = 1,
    dist: Literal["normal", "uniform"] = "normal",
) -> torch.Tensor:
    """Random numbers indexed by scene position, for the window whose top-left is ``origin``.

    A (C, H, W) float32 CPU tensor; ``origin`` is (row, col) in scene pixels.

    The field is drawn in :data:`NOISE_CELL`-square cells, each from its own generator keyed
    by (seed, stream, cell), so any window gives the same number at the same position: two
    overlapping patches share their noise in the overlap. ``scale``: scene pixels per field
    sample (e.g. 16 for one number per 16-pixel token; ``origin`` stays in scene pixels and
    must then be a multiple of it). ``stream`` separates independent fields of one request
    (one per generated modality, say). ``dist``: standard normal, or uniform on [0, 1).
    """
    c, h, w = shape
    if origin[0] % scale or origin[1] % scale:
        raise ValueError(f"noise_field: origin {origin} is not a multiple of the scale {scale}")
    r0, c0 = origin[0] // scale, origin[1] // scale
    out = torch.empty((c, h, w), dtype=torch.float32)
    cell = NOISE_CELL
    for cy in range(r0 // cell, (r0 + h - 1) // cell + 1):
        for cx in range(c0 // cell, (c0 + w - 1) // cell + 1):
            gen = torch.Generator().manual_seed(_mix(seed, stream, scale, c, cy, cx))
            if dist == "normal":
                block = torch.randn((c, cell, cell), generator=gen)
            else:
                block = torch.rand((c, cell, cell), generator=gen)
            ys, xs = max(r0, cy * cell), max(c0, cx * cell)
            ye, xe = min(r0 + h, (cy + 1) * cell), min(c0 + w, (cx + 1) * cell)
            out[:, ys - r0 : ye - r0, xs - c0 : xe - c0] = block[
                :, ys - cy * cell : ye - cy * cell, xs - cx * cell : xe - cx * cell
            ]
    return out
