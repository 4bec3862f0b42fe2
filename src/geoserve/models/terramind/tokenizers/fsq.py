"""TerraMind's finite scalar quantiser (FSQ): token index <-> code vector, exactly.

A code has one digit per latent dimension, digit ``i`` in ``0 .. L_i - 1`` for the levels
``L`` (8-8-8-6-5 for the DiVAE tokenizers, 15360 tokens; 7-5-5-5-5 for LULC, 4375). The
index is the mixed-radix number of the digits, the first dimension least significant
(``index = sum(digit_i * prod(L_0 .. L_{i-1}))``), and the code the decoders are given is
``digit_i / (L_i - 1)`` in ``[0, 1]``. Quantising a latent ``z`` takes
``digit = round(sigmoid(z) * (L - 1))``. Facts from TerraTorch 1.2.13 (its
``FiniteScalarQuantizer``), where the tables are non-persistent buffers: here they are made
on the input's device at each call, so nothing is in the state dict and a model built on the
meta device needs nothing filled in after its weights are assigned.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn


class FSQ(nn.Module):
    """Index <-> code for fixed levels; no parameters."""

    def __init__(self, levels: Sequence[int]) -> None:
        super().__init__()
        if not levels or any(int(n) < 2 for n in levels):
            raise ValueError(f"FSQ levels must be integers >= 2, got {list(levels)}")
        self.levels = tuple(int(n) for n in levels)
        self.codebook_size = math.prod(self.levels)

    @property
    def dim(self) -> int:
        """Digits per code (the latent dimension)."""
        return len(self.levels)

    def _tables(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        levels = torch.tensor(self.levels, dtype=torch.int32, device=device)
        basis = [math.prod(self.levels[:i]) for i in range(self.dim)]
        return levels, torch.tensor(basis, dtype=torch.int32, device=device)

    def indices_to_codes(self, indices: torch.Tensor) -> torch.Tensor:
        """``(...)`` integer indices -> ``(..., dim)`` float32 codes in ``[0, 1]``.

        Raises:
            ValueError: not integers, or an index outside ``0 .. codebook_size - 1``.
        """
        if indices.dtype.is_floating_point or indices.dtype == torch.bool:
            raise ValueError(f"token indices must be integers, got {indices.dtype}")
        if indices.numel() and bool(((indices < 0) | (indices >= self.codebook_size)).any()):
            lo, hi = int(indices.min()), int(indices.max())
            raise ValueError(
                f"token indices must lie in 0..{self.codebook_size - 1} "
                f"(levels {'-'.join(map(str, self.levels))}); got {lo}..{hi}"
            )
        levels, basis = self._tables(indices.device)
        digits = (indices.unsqueeze(-1) // basis) % levels
        return digits / (levels - 1)

    def codes_to_indices(self, codes: torch.Tensor) -> torch.Tensor:
        """``(..., dim)`` codes (each a multiple of ``1 / (L - 1)``) -> ``(...)`` int64 indices."""
        if codes.shape[-1] != self.dim:
            raise ValueError(f"codes must end in {self.dim} digits, got shape {tuple(codes.shape)}")
        levels, basis = self._tables(codes.device)
        digits = torch.round(codes * (levels - 1)).to(torch.int64)
        return (digits * basis).sum(dim=-1)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """``(B, h, w)`` token grid -> ``(B, dim, h, w)`` codes, as the decoders take them."""
        if tokens.ndim != 3:
            raise ValueError(f"a token grid is (B, h, w), got shape {tuple(tokens.shape)}")
        return self.indices_to_codes(tokens).permute(0, 3, 1, 2)

    def forward(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(B, dim, h, w)`` latent -> codes ``(B, dim, h, w)`` and int64 tokens ``(B, h, w)``."""
        if latent.ndim != 4 or latent.shape[1] != self.dim:
            raise ValueError(f"latent must be (B, {self.dim}, h, w), got {tuple(latent.shape)}")
        levels, basis = self._tables(latent.device)
        z = latent.permute(0, 2, 3, 1)
        digits = torch.round(torch.sigmoid(z) * (levels - 1))
        codes = digits / (levels - 1)
        tokens = (digits * basis).sum(dim=-1).to(torch.int64)
        return codes.permute(0, 3, 1, 2), tokens
