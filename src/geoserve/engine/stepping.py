"""Patches that take several steps: where they wait, which the next batch takes, one step.

For a :class:`geoserve.models.steps.SteppedModel`.

**Which batch runs next.** The patches between steps wait in the :class:`StepPool`, at most
``capacity`` of them (the batch cap): new patches start their first step while there is room,
so patches that arrive later join the ones already stepping; otherwise the pool's next batch
is of the step kind of its most advanced patch (nearest completion; then priority, arrival,
row and column), filled with the patches due a step of that kind, most advanced first. One
batch holds one kind of step, its rows possibly at different step indices and from different
requests. Finishing the most advanced first keeps the pool small and lets rows finish in
order, so rows still stream: a row is stitched once all its patches took all their steps.

A request that fails or is aborted takes its waiting patches out of the pool.

**What the steps cost.** :class:`StepStats` counts, per step kind, the step batches run, the
patch-steps they held (a batch of B patches is B patch-steps), the seconds they took and their
fill (B over the batch cap), for the engine's :attr:`~geoserve.engine.core.Engine.step_stats`
and the server's ``/metrics``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from geoserve.errors import GeoServeError, ModelOutputShapeError
from geoserve.models.steps import SteppedModel, split_state, stack_states

if TYPE_CHECKING:
    from geoserve.engine.batch import Patch
    from geoserve.engine.request import Request
    from geoserve.engine.runner import ModelRunner


@dataclass(frozen=True)
class StepKindStats:
    """The steps of one kind run so far.

    Attributes:
        batches: Step batches run (a batch split after running out of memory: each half).
        patch_steps: Patches stepped, summed over those batches.
        seconds: Wall time of those batches' step calls in the engine thread (the model's
            ``begin``, ``step`` and ``finish``; on a GPU, with what the host waited for).
        fill: Each batch's patches over the batch cap it ran under, summed.
    """

    batches: int = 0
    patch_steps: int = 0
    seconds: float = 0.0
    fill: float = 0.0

    @property
    def steps_per_second(self) -> float:
        """Patch-steps per second of step time (0 before any step)."""
        return self.patch_steps / self.seconds if self.seconds > 0 else 0.0

    @property
    def mean_fill(self) -> float:
        """Mean batch fill, in (0, 1] (0 before any step)."""
        return self.fill / self.batches if self.batches else 0.0


class StepStats:
    """Step batches run, per step kind (see the module docstring); thread-safe.

    The engine thread records each step; :meth:`snapshot` may be read from any thread.

    Args:
        plan: The model's step kinds (each starts at zero).
    """

    def __init__(self, plan: Sequence[str]) -> None:
        self._lock = threading.Lock()
        self._kinds = dict.fromkeys(plan, StepKindStats())

    def record(self, kind: str, patches: int, seconds: float, cap: int) -> None:
        """One step batch of ``kind``: ``patches`` patches in ``seconds``, under cap ``cap``."""
        with self._lock:
            was = self._kinds.get(kind, StepKindStats())
            self._kinds[kind] = StepKindStats(
                was.batches + 1,
                was.patch_steps + patches,
                was.seconds + seconds,
                was.fill + patches / max(cap, patches, 1),
            )

    def snapshot(self) -> dict[str, StepKindStats]:
        """Each step kind's counts as they stand now, in plan order."""
        with self._lock:
            return dict(self._kinds)


class StepPool:
    """Patches between steps; see the module docstring.

    Args:
        plan: The model's step kinds, in order (:meth:`SteppedModel.plan`).
    """

    def __init__(self, plan: Sequence[str]) -> None:
        if not plan:
            raise ValueError("a stepped model's plan needs at least one step")
        self.plan = tuple(plan)
        self.waiting: list[Patch] = []

    def __len__(self) -> int:
        return len(self.waiting)

    def room(self, capacity: int) -> int:
        """How many new patches may start their first step now."""
        return max(0, capacity - len(self.waiting))

    def add(self, patches: Sequence[Patch]) -> None:
        """Patches that took a step and wait for their next."""
        self.waiting.extend(patches)

    def drop(self, request: Request) -> None:
        """Take a failed or aborted request's patches out."""
        self.waiting = [p for p in self.waiting if p.request is not request]

    def take(self, cap: int, cross_request: bool = True) -> list[Patch]:
        """Up to ``cap`` waiting patches due a step of one kind (see the module docstring)."""
        live = [p for p in self.waiting if p.request.error is None]
        if not live:
            self.waiting = []
            return []

        def order(p: Patch) -> tuple[int, int, float, int, int]:
            return (-p.step, p.request.priority, p.request.arrival, p.row, p.col)

        lead = min(live, key=order)
        kind, signature = self.plan[lead.step], lead.request.signature
        due = [
            p
            for p in live
            if self.plan[p.step] == kind
            and p.request.signature == signature
            and (cross_request or p.request is lead.request)
        ]
        batch = sorted(due, key=order)[:cap]
        taken = {id(p) for p in batch}
        self.waiting = [p for p in live if id(p) not in taken]
        return batch


def run_step(
    module: SteppedModel,
    plan: Sequence[str],
    batch: list[Patch],
    x: Any,
    kwargs: dict[str, torch.Tensor],
    device: torch.device,
) -> tuple[torch.Tensor | None, list[Patch]]:
    """One step for ``batch`` (all new, with inputs ``x``; or all waiting, of one kind).

    Returns the outputs of the patches that took their last step (in batch order; None if
    none did) and those patches; every other patch of the batch gets its new state and step
    index (set only once the step succeeded, so a failed step can be retried).
    """
    n = len(batch)
    if batch[0].state is None:
        seed = torch.tensor([p.request.seed for p in batch], dtype=torch.int64, device=device)
        origin = torch.tensor(
            [p.request.ctx.grid.origin(p.row, p.col) for p in batch],
            dtype=torch.int64,
            device=device,
        )
        state = module.begin(x, seed=seed, origin=origin, **kwargs)
    else:
        state = stack_states([p.state for p in batch])  # type: ignore[misc]
    steps = [p.step for p in batch]
    kinds = {plan[s] for s in steps}
    if len(kinds) != 1:  # (the pool never mixes kinds)
        raise ValueError(f"one batch, several step kinds: {sorted(kinds)}")
    index = torch.tensor(steps, dtype=torch.int64, device=device)
    state = module.step(kinds.pop(), state, index, **kwargs)
    last = [s + 1 == len(plan) for s in steps]
    done = [p for p, d in zip(batch, last, strict=True) if d]
    out = None
    if done:
        rows = torch.tensor(last, device=device)
        out = module.finish(
            {k: v[rows] for k, v in state.items()},
            **{k: v[rows] for k, v in kwargs.items()},
        )
        if not isinstance(out, torch.Tensor) or out.ndim not in (4, 5) or out.shape[0] != len(done):
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ModelOutputShapeError(
                f"a stepped model's finish returned {got} for {len(done)} patches"
            )
    for p, s, one in zip(batch, steps, split_state(state, n), strict=True):
        if s + 1 < len(plan):
            p.state, p.step = one, s + 1
    return out, done


def forward_step(
    runner: ModelRunner, batch: list[Patch]
) -> tuple[torch.Tensor | None, list[Patch]]:
    """One step of ``runner``'s stepped model over ``batch``.

    Returns the (B_done, C_out, P, P) float32 outputs of the patches that took their last
    step (None: none did), and those patches. Raises as :meth:`ModelRunner.forward` does.
    """
    x: Any = runner.inputs(batch) if batch[0].state is None else None
    kwargs = runner.model_kwargs(batch)
    module, plan, stats = runner.eager, runner.plan, runner.step_stats
    if not isinstance(module, SteppedModel) or plan is None or stats is None:
        raise TypeError(f"model {runner.name!r} does not take steps")
    kind, t0 = plan[batch[0].step], time.perf_counter()
    try:
        with torch.inference_mode(), runner.autocast():
            y, done = run_step(module, plan, batch, x, kwargs, runner.device)
    except (torch.OutOfMemoryError, GeoServeError):
        raise
    except Exception as exc:
        raise runner.model_failed(batch[0].request.ctx, x, exc) from exc
    stats.record(kind, len(batch), time.perf_counter() - t0, runner.max_batch_patches)
    if y is None:
        return None, done
    return runner.checked(y, done, x), done
