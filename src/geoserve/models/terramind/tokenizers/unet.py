"""The DiVAE decoder: a patched, code-conditioned diffusion UNet (TerraMind's ``unet_patched``).

One call predicts the clean image from a noisy one at timestep ``t``:

1. the noisy image ``(B, C, H, W)`` is pixel-unshuffled by 4 (channel ``c * 16 + 4 * row +
   col``), the FSQ codes ``(B, 5, H/16, W/16)`` are nearest-upsampled to ``H/4 x W/4`` and
   appended: ``16 C + 5`` channels;
2. a UNet runs on that: 256 base channels, multipliers (1, 2, 2, 2), 3 residual blocks per
   level, stride-2 convolutions down and nearest x2 + convolution up, skip connections
   concatenated, single-head attention at downsampling 4 and 8 (``H/16``, ``H/32``) and in
   the middle block (residual block, attention, residual block);
3. the ``16 C`` output channels are pixel-shuffled back to ``(B, C, H, W)``.

Residual blocks: GroupNorm (32 groups, computed in float32), SiLU, 3 x 3 convolution, plus the
timestep embedding projected per block (added, no scale-shift), GroupNorm, SiLU, 3 x 3
convolution, and a 1 x 1 convolution on the skip where the width changes. The timestep
embedding is sinusoidal on the raw integer ``t`` (cosines then sines, 128 frequencies, period
10000), then Linear 256 -> 1024, SiLU, Linear 1024 -> 1024. Each row of a batch may be at its
own timestep (``t`` of shape ``(B,)``), so an engine can batch different steps together.

Attention here is ``scaled_dot_product_attention`` (no full score matrix kept where the
backend fuses it); the channels are split per head as TerraTorch's "legacy" attention splits
them (each head's q, k, v contiguous). H and W must be multiples of 32 (4 x 2^3).

Parameter names are the published checkpoints' under ``decoder.`` (``time_embed.0``,
``input_blocks.<i>.<j>.in_layers.2``, ``middle_block.1.qkv``, ``output_blocks.<i>.<j>.conv``,
``out.2`` ...). Facts from TerraTorch 1.2.13 (``tokenizer/models/unet/``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

#: ``unet_patched``'s configuration.
PATCH = 4
MODEL_CHANNELS = 256
CHANNEL_MULT = (1, 2, 2, 2)
NUM_RES_BLOCKS = 3
ATTENTION_AT = (4, 8)


class GroupNorm32(nn.GroupNorm):
    """GroupNorm of 32 groups computed in float32, returned in the input's dtype."""

    def __init__(self, channels: int) -> None:
        super().__init__(32, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise ``x`` (any shape ``(B, C, ...)``)."""
        weight = None if self.weight is None else self.weight.float()
        bias = None if self.bias is None else self.bias.float()
        return F.group_norm(x.float(), self.num_groups, weight, bias, self.eps).to(x.dtype)


def timestep_embedding(t: torch.Tensor, dim: int, period: float = 10000.0) -> torch.Tensor:
    """``(B,)`` timesteps -> ``(B, dim)`` float32: ``[cos(t f), sin(t f)]``, ``f`` geometric."""
    half = dim // 2
    freqs = torch.exp(-math.log(period) * torch.arange(half, dtype=torch.float32) / half)
    args = t[:, None].float() * freqs.to(t.device)[None]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        emb = torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1)
    return emb


class ResBlock(nn.Module):
    """Residual block conditioned on the timestep embedding."""

    def __init__(self, channels: int, out_channels: int, emb_channels: int) -> None:
        super().__init__()
        self.in_layers = nn.Sequential(
            GroupNorm32(channels), nn.SiLU(), nn.Conv2d(channels, out_channels, 3, padding=1)
        )
        self.emb_layers = nn.Sequential(nn.SiLU(), nn.Linear(emb_channels, out_channels))
        self.out_layers = nn.Sequential(
            GroupNorm32(out_channels),
            nn.SiLU(),
            nn.Identity(),  # dropout in training (rate 0 in every published tokenizer)
            nn.Conv2d(out_channels, out_channels, 3, padding=1),
        )
        self.skip_connection: nn.Module = (
            nn.Identity() if out_channels == channels else nn.Conv2d(channels, out_channels, 1)
        )

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W), (B, E) -> (B, C', H, W)."""
        h = self.in_layers(x)
        h = h + self.emb_layers(emb).to(h.dtype)[:, :, None, None]
        return self.skip_connection(x) + self.out_layers(h)


class AttentionBlock(nn.Module):
    """Self-attention over all positions (GroupNorm, 1 x 1 qkv, attention, 1 x 1 out, residual)."""

    def __init__(self, channels: int, num_heads: int = 1) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.norm = GroupNorm32(channels)
        self.qkv = nn.Conv1d(channels, 3 * channels, 1)
        self.proj_out = nn.Conv1d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, C, H, W)."""
        b, c, *spatial = x.shape
        flat = x.reshape(b, c, -1)
        n = flat.shape[-1]
        qkv = self.qkv(self.norm(flat)).reshape(b, self.num_heads, 3, c // self.num_heads, n)
        q, k, v = (part.transpose(-1, -2) for part in qkv.unbind(2))  # (B, heads, N, ch)
        out = F.scaled_dot_product_attention(q, k, v)
        out = out.transpose(-1, -2).reshape(b, c, n)
        return (flat + self.proj_out(out)).reshape(b, c, *spatial)


class Downsample(nn.Module):
    """Stride-2 3 x 3 convolution."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.op = nn.Conv2d(channels, channels, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, C, H/2, W/2)."""
        return self.op(x)


class Upsample(nn.Module):
    """Nearest x2, then a 3 x 3 convolution."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, C, 2H, 2W)."""
        return self.conv(F.interpolate(x, scale_factor=2, mode="nearest"))


class Stage(nn.ModuleList):
    """Layers run in order; residual blocks also get the timestep embedding."""

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        """Run every layer."""
        for layer in self:
            x = layer(x, emb) if isinstance(layer, ResBlock) else layer(x)
        return x


class UNet(nn.Module):
    """The timestep-conditioned UNet (no class conditioning, no scale-shift norm)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        *,
        model_channels: int = MODEL_CHANNELS,
        channel_mult: Sequence[int] = CHANNEL_MULT,
        num_res_blocks: int = NUM_RES_BLOCKS,
        attention_at: Sequence[int] = ATTENTION_AT,
        num_heads: int = 1,
    ) -> None:
        super().__init__()
        self.model_channels = model_channels
        self.levels = len(channel_mult)
        emb = 4 * model_channels
        self.time_embed = nn.Sequential(
            nn.Linear(model_channels, emb), nn.SiLU(), nn.Linear(emb, emb)
        )
        ch = channel_mult[0] * model_channels
        self.input_blocks = nn.ModuleList([Stage([nn.Conv2d(in_channels, ch, 3, padding=1)])])
        skips, ds = [ch], 1
        for level, mult in enumerate(channel_mult):
            for _ in range(num_res_blocks):
                layers: list[nn.Module] = [ResBlock(ch, mult * model_channels, emb)]
                ch = mult * model_channels
                if ds in attention_at:
                    layers.append(AttentionBlock(ch, num_heads))
                self.input_blocks.append(Stage(layers))
                skips.append(ch)
            if level < self.levels - 1:
                self.input_blocks.append(Stage([Downsample(ch)]))
                skips.append(ch)
                ds *= 2
        self.middle_block = Stage(
            [ResBlock(ch, ch, emb), AttentionBlock(ch, num_heads), ResBlock(ch, ch, emb)]
        )
        self.output_blocks = nn.ModuleList()
        for level in reversed(range(self.levels)):
            width = channel_mult[level] * model_channels
            for i in range(num_res_blocks + 1):
                layers = [ResBlock(ch + skips.pop(), width, emb)]
                ch = width
                if ds in attention_at:
                    layers.append(AttentionBlock(ch, num_heads))
                if level and i == num_res_blocks:
                    layers.append(Upsample(ch))
                    ds //= 2
                self.output_blocks.append(Stage(layers))
        self.out = nn.Sequential(
            GroupNorm32(ch), nn.SiLU(), nn.Conv2d(ch, out_channels, 3, padding=1)
        )

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """(B, C_in, h, w) at timesteps ``t`` (B,) -> (B, C_out, h, w)."""
        dtype = next(self.time_embed.parameters()).dtype
        emb = self.time_embed(timestep_embedding(t, self.model_channels).to(dtype))
        h = x.to(dtype)
        skips = []
        for stage in self.input_blocks:
            h = stage(h, emb)
            skips.append(h)
        h = self.middle_block(h, emb)
        for stage in self.output_blocks:
            h = stage(torch.cat([h, skips.pop()], dim=1), emb)
        return self.out(h)


class PatchedUNet(UNet):
    """DiVAE's decoder: ``(x_t, t, codes)`` -> the predicted clean image ``(B, C, H, W)``."""

    def __init__(
        self, channels: int, cond_channels: int = 5, patch: int = PATCH, **unet: Any
    ) -> None:
        super().__init__(channels * patch * patch + cond_channels, channels * patch * patch, **unet)
        self.channels = channels
        self.cond_channels = cond_channels
        self.patch = patch

    @property
    def multiple(self) -> int:
        """Image sides must be multiples of this (the patch times the UNet's downsampling)."""
        return self.patch * 2 ** (self.levels - 1)

    def forward(  # type: ignore[override]
        self, x_t: torch.Tensor, t: int | torch.Tensor, codes: torch.Tensor
    ) -> torch.Tensor:
        """Predict the clean image from ``x_t`` at timestep ``t`` given the FSQ ``codes``.

        ``t``: an int or 0-d tensor for the whole batch, or a ``(B,)`` tensor, one per row.
        ``codes``: ``(B, cond_channels, h, w)``, usually ``h = H / 16``.

        Raises:
            ValueError: shapes that do not fit (sizes, channels, batch, timesteps).
        """
        if x_t.ndim != 4 or x_t.shape[1] != self.channels:
            raise ValueError(f"x_t must be (B, {self.channels}, H, W), got {tuple(x_t.shape)}")
        b, _, height, width = x_t.shape
        if height % self.multiple or width % self.multiple:
            raise ValueError(f"image size {height}x{width} is not a multiple of {self.multiple}")
        if codes.ndim != 4 or codes.shape[:2] != (b, self.cond_channels):
            raise ValueError(
                f"codes must be ({b}, {self.cond_channels}, h, w), got {tuple(codes.shape)}"
            )
        steps = torch.as_tensor(t, device=x_t.device).reshape(-1)
        if steps.numel() == 1:
            steps = steps.expand(b)
        if steps.numel() != b:
            raise ValueError(f"{steps.numel()} timesteps for a batch of {b}")
        x = F.pixel_unshuffle(x_t, self.patch)
        cond = F.interpolate(codes.to(x.dtype), size=x.shape[-2:], mode="nearest")
        out = super().forward(torch.cat([x, cond], dim=1), steps)
        return F.pixel_shuffle(out, self.patch)
