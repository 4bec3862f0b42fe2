"""Choosing TerraMind's tokens from the generator's logits, without any random state.

TerraTorch 1.2.13 samples each token with ``torch.multinomial`` after reseeding torch's
process-wide generator, one shuffle and one draw per batch, so a token depends on its batch and
on the process. Here the caller gives every token position its uniform number in [0, 1)
(an engine keys them by the token's absolute position in the scene, so overlapping patches draw
the same number at the same place) and the token is the inverse of the filtered distribution's
cumulative sum at that number. The filtering is TerraTorch's: temperature 0 is argmax; otherwise
top-k, then top-p on the untempered softmax (keeping the first token over the threshold), then
the softmax of the logits divided by the temperature.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from geoserve.errors import ConfigError, InputError
from geoserve.models.terramind.generation import TerraMindGenerator

#: TerraTorch's ``TerraMindGeneration`` defaults.
DEFAULT_TOP_P = 0.8
DEFAULT_TOP_K = 0
#: Temperatures this close to 0 mean argmax (TerraTorch's ``np.isclose(t, 0, atol=1e-10)``).
ZERO_TEMPERATURE = 1e-10


def sample_tokens(
    logits: torch.Tensor,
    temperature: float,
    top_p: float = 0.0,
    top_k: int | float = 0,
    uniforms: torch.Tensor | None = None,
) -> torch.Tensor:
    """One token per position from (B, N, V) logits -> (B, N) int64 ids.

    Args:
        logits: The generator's logits (not modified).
        temperature: 0 (within 1e-10) takes the argmax and needs no ``uniforms``; otherwise
            the logits are divided by it before the softmax.
        top_p: Keep the most likely tokens until their untempered probability passes
            ``top_p`` (the first one over it kept); 0 keeps all.
        top_k: Keep the ``top_k`` most likely tokens (an int), or that fraction of the
            vocabulary (a float in (0, 1]); 0 keeps all.
        uniforms: (B, N) numbers in [0, 1), one per position: the token at a position is the
            first whose cumulative probability (vocabulary order) exceeds its number.

    With temperature > 0 the tokens are distributed as TerraTorch's, but they are not the
    tokens its ``torch.multinomial`` draws. Each position's token depends only on its own
    logits and number, never on the rest of its batch.

    Raises:
        ConfigError: a negative or non-finite temperature, ``top_p`` outside [0, 1] or a
            negative ``top_k``.
        InputError: ``uniforms`` missing (temperature > 0), of the wrong shape or outside
            [0, 1).
    """
    if logits.ndim != 3:
        raise InputError(f"logits have shape {tuple(logits.shape)}; expected (B, N, V)")
    if not math.isfinite(temperature) or temperature < 0:
        raise ConfigError(f"temperature must be a finite number >= 0, not {temperature}")
    if not 0.0 <= top_p <= 1.0:
        raise ConfigError(f"top_p must lie in [0, 1], not {top_p}")
    if isinstance(top_k, float) and not 0.0 <= top_k <= 1.0:
        raise ConfigError(f"a fractional top_k must lie in [0, 1], not {top_k}")
    if top_k < 0:
        raise ConfigError(f"top_k must be >= 0, not {top_k}")
    if abs(temperature) <= ZERO_TEMPERATURE:
        return logits.argmax(dim=-1)
    if uniforms is None:
        raise InputError("sampling at a temperature above 0 needs one uniform number per token")
    if tuple(uniforms.shape) != tuple(logits.shape[:2]):
        raise InputError(
            f"uniforms have shape {tuple(uniforms.shape)}; expected {tuple(logits.shape[:2])}"
        )
    u = uniforms.to(device=logits.device, dtype=torch.float64)
    if not bool(((u >= 0) & (u < 1)).all()):
        raise InputError("uniforms must lie in [0, 1)")
    filtered = _filtered(logits.float(), top_p, top_k)
    probs = torch.softmax(filtered / temperature, dim=-1).double()
    cdf = probs.cumsum(dim=-1)
    ids = torch.searchsorted(cdf, (u * cdf[..., -1]).unsqueeze(-1), right=True).squeeze(-1)
    # rounding can carry a number near 1 past the last kept token: take that token then
    last = probs.shape[-1] - 1 - (probs > 0).flip(-1).int().argmax(dim=-1)
    return torch.minimum(ids, last)


def _filtered(logits: torch.Tensor, top_p: float, top_k: int | float) -> torch.Tensor:
    """Logits with the tokens top-k and top-p drop set to -inf (a copy)."""
    vocab = logits.shape[-1]
    out = logits.clone()
    if top_k > 0:
        k = min(int(top_k), vocab) if isinstance(top_k, int) else min(int(top_k * vocab), vocab)
        kth = torch.topk(out, max(k, 1), dim=-1).values[..., -1:]
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p > 0:
        ordered, order = torch.sort(out, dim=-1, descending=True)
        over = torch.softmax(ordered, dim=-1).cumsum(dim=-1) > top_p
        drop = torch.zeros_like(over)
        drop[..., 1:] = over[..., :-1]  # the first token over the threshold stays
        out = out.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return out


def generate_tokens(
    model: TerraMindGenerator,
    inputs: Mapping[str, torch.Tensor],
    *,
    temperature: float,
    top_p: float = DEFAULT_TOP_P,
    top_k: int | float = DEFAULT_TOP_K,
    uniforms: Mapping[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """Every output of ``model`` in order, each conditioned on the inputs and the ones before.

    Args:
        model: The generator.
        inputs: Input name -> standardised (B, C, H, W) pixels (see
            :meth:`TerraMindGenerator.logits`).
        temperature: As :func:`sample_tokens`.
        top_p: As :func:`sample_tokens` (default: TerraTorch's).
        top_k: As :func:`sample_tokens` (default: TerraTorch's).
        uniforms: Output name -> (B, h, w) or (B, h*w) numbers in [0, 1), needed for every
            output when ``temperature`` > 0.

    Returns:
        Output name -> (B, h, w) int64 token ids.

    Raises:
        InputError, ConfigError: see :meth:`TerraMindGenerator.logits` and
            :func:`sample_tokens`.
    """
    tokens: dict[str, torch.Tensor] = {}
    for name in model.outputs:
        logits = model.logits(inputs, name, tokens)
        u = (uniforms or {}).get(name)
        if u is not None:
            u = u.reshape(u.shape[0], -1)
        elif abs(temperature) > ZERO_TEMPERATURE:
            raise InputError(f"no uniforms for output {name!r} (temperature {temperature} > 0)")
        ids = sample_tokens(logits, temperature, top_p, top_k, u)
        first = next(iter(inputs.values()))
        tokens[name] = ids.reshape(ids.shape[0], *model.token_grid(*first.shape[-2:]))
    return tokens
