"""The DDIM sampler TerraMind's diffusion tokenizers decode with, one step at a time.

The schedule and step are TerraTorch 1.2.13's (its own ``DDIMScheduler`` with the DiVAE
defaults): 1000 training steps, betas linear from 1e-4 to 0.02, rescaled to zero terminal
SNR (``alphas_cumprod[999] == 0``), the network predicting the clean sample, that prediction
clamped to ``[-1, 1]`` (TerraTorch's dynamic thresholding with a maximum of 1 is exactly this
clamp), eta 0 (deterministic), and "trailing" timesteps with an *integer* step ratio
``r = 1000 // n``: ``999, 999 - r, ...`` down to the last value above ``-1``, so ``n = 3``
runs 4 steps (999, 666, 333, 0) and ``n = 30`` runs 31. The step after ``t`` goes to
``t - r``; past 0 the previous ``alphas_cumprod`` is 1, so the last step returns the clamped
prediction itself, inside ``[-1, 1]``.

Why not ``diffusers``: its ``DDIMScheduler`` with the same options has the same
``alphas_cumprod`` and the same step, but spaces trailing timesteps with a fractional ratio
(``round(arange(1000, 0, -1000 / n)) - 1``), so its timestep lists differ whenever 1000 is not
divisible by ``n`` (3, 7, 30, 64 ...), and it keeps one ``set_timesteps`` state per scheduler
object. The maths is a few lines; written here it has no state beyond the fixed table, so an
engine can advance each row of a batch at its own timestep (``t`` and ``t_prev`` as ``(B,)``
tensors) and interleave the steps of different patches. Nothing here draws random numbers:
the initial noise is the caller's.
"""

from __future__ import annotations

import torch

#: TerraTorch's defaults for the TerraMind tokenizers.
TRAIN_STEPS = 1000
BETA_START = 1e-4
BETA_END = 0.02
#: The default number of decoding steps (TerraTorch's ``timesteps=50``).
DEFAULT_STEPS = 50


def zero_snr_alphas_cumprod(
    train_steps: int = TRAIN_STEPS, beta_start: float = BETA_START, beta_end: float = BETA_END
) -> torch.Tensor:
    """``alphas_cumprod`` (float32, ``(train_steps,)``) of linear betas rescaled to zero SNR.

    The square roots of the cumulative alphas are shifted so the last is 0 and scaled so the
    first keeps its value (arXiv:2305.08891, Algorithm 1); the betas are recovered from them
    and the product taken again, in float32, as TerraTorch computes it. Always on the CPU
    (also inside a ``torch.device("meta")`` block).
    """
    betas = torch.linspace(beta_start, beta_end, train_steps, dtype=torch.float32, device="cpu")
    root = torch.cumprod(1 - betas, dim=0).sqrt()
    first, last = root[0].clone(), root[-1].clone()
    root = (root - last) * (first / (first - last))
    bar = root**2
    alphas = torch.cat([bar[:1], bar[1:] / bar[:-1]])
    betas = 1 - alphas
    return torch.cumprod(1 - betas, dim=0)


class DDIM:
    """Deterministic DDIM over TerraMind's schedule: ``timesteps(n)`` and ``step(...)``."""

    def __init__(self, train_steps: int = TRAIN_STEPS) -> None:
        self.train_steps = train_steps
        self.alphas_cumprod = zero_snr_alphas_cumprod(train_steps)
        self._on: dict[torch.device, torch.Tensor] = {}

    def ratio(self, steps: int) -> int:
        """The integer distance between consecutive timesteps of an ``steps``-step decode."""
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"diffusion steps must be a positive integer, got {steps!r}")
        if steps > self.train_steps:
            raise ValueError(f"diffusion steps must be at most {self.train_steps}, got {steps}")
        return self.train_steps // steps

    def timesteps(self, steps: int) -> list[int]:
        """The timesteps ``steps`` asks for, highest first (``steps=3`` gives 4 of them)."""
        r = self.ratio(steps)
        return list(range(self.train_steps - 1, -1, -r))

    def schedule(self, steps: int) -> list[tuple[int, int]]:
        """``(t, t_prev)`` for each step in order; ``t_prev`` is negative at the last."""
        r = self.ratio(steps)
        return [(t, t - r) for t in self.timesteps(steps)]

    def _table(self, device: torch.device) -> torch.Tensor:
        table = self._on.get(device)
        if table is None:
            table = self._on[device] = self.alphas_cumprod.to(device)
        return table

    def _alpha(
        self, t: int | torch.Tensor, device: torch.device, ndim: int
    ) -> torch.Tensor | float:
        """``alphas_cumprod[t]`` (1 where ``t < 0``), shaped to broadcast over a batch."""
        table = self._table(device)
        if isinstance(t, int):
            if t >= self.train_steps:
                raise ValueError(f"timestep {t} is beyond the schedule's {self.train_steps}")
            return table[t] if t >= 0 else torch.tensor(1.0, device=device)
        if bool((t >= self.train_steps).any()):  # checked where t is: no sync for CPU tensors
            raise ValueError(f"timesteps {t.tolist()} go beyond {self.train_steps - 1}")
        t = t.to(device=device, dtype=torch.int64).reshape(-1)
        alpha = torch.where(t >= 0, table[t.clamp(min=0)], torch.ones((), device=device))
        return alpha.reshape(-1, *([1] * (ndim - 1)))

    def step(
        self,
        x_t: torch.Tensor,
        model_output: torch.Tensor,
        t: int | torch.Tensor,
        t_prev: int | torch.Tensor,
    ) -> torch.Tensor:
        """One denoising step: the sample at ``t_prev`` from the sample at ``t`` (float32).

        ``model_output`` is the network's prediction of the clean sample at ``t``. ``t`` and
        ``t_prev`` are ints (one timestep for the whole batch) or ``(B,)`` tensors (one per
        row); a negative ``t_prev`` is the end of the chain. The noise direction is taken
        from the raw prediction and the clean part from the clamped one, as TerraTorch does.
        """
        x_t = x_t.float()
        x0 = model_output.float()
        if x0.shape != x_t.shape:
            raise ValueError(f"model output {tuple(x0.shape)} != sample {tuple(x_t.shape)}")
        for name, value in (("t", t), ("t_prev", t_prev)):
            if isinstance(value, torch.Tensor) and value.numel() not in (1, x_t.shape[0]):
                raise ValueError(f"{name} has {value.numel()} entries for {x_t.shape[0]} rows")
        a_t = self._alpha(t, x_t.device, x_t.ndim)
        a_prev = self._alpha(t_prev, x_t.device, x_t.ndim)
        eps = (x_t - a_t**0.5 * x0) / (1 - a_t) ** 0.5
        x0 = x0.clamp(-1.0, 1.0)
        return a_prev**0.5 * x0 + (1 - a_prev) ** 0.5 * eps
