"""The ViT-B encoder and decoder of TerraMind's tokenizers.

Both are pre-norm transformers over 16 x 16 patches (768 wide, 12 blocks, 12 heads, GELU MLP
of 3072, LayerNorms with eps 1e-6 and learned biases, qkv and projection biases) with a 2-D
sin-cos position table built for 256 px (a 16 x 16 grid, stored in the checkpoints as the
``pos_emb`` parameter, ``(1, D, 16, 16)``) and resized bicubically to other grids.

- :class:`TokenizerEncoder`: a strided 16 x 16 convolution (``proj``) to tokens, the blocks,
  then a residual Tanh MLP (``norm_mlp``, ``post_mlp``) computed in float32; returns
  ``(B, D, H/16, W/16)``. A class map (``(B, H, W)`` or ``(B, 1, H, W)`` for a model of more
  channels) is one-hot encoded first.
- :class:`TokenizerDecoder`: the blocks over ``(B, D, h, w)`` features, the same residual
  Tanh MLP, then a linear layer (``out_proj``) to ``C x 16 x 16`` values per token, laid out
  as ``(B, C, 16 h, 16 w)``.

Parameter names are those of the published tokenizer checkpoints (``blocks.<i>.attn.qkv``,
``blocks.<i>.mlp.fc1``, ``post_mlp.fc2`` ...). Facts from TerraTorch 1.2.13
(``tokenizer/models/vit_models.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812
from einops import rearrange
from torch import nn

from geoserve.models.terramind.encoder import Attention, LayerNorm, sincos_2d
from geoserve.models.terramind.encoder import Mlp as _GeluMlp

PATCH = 16
#: The grid the position tables were built on (256 px tokenizers).
GRID = 16
WIDTH = 768
DEPTH = 12
HEADS = 12


class Block(nn.Module):
    """Pre-norm block with biased LayerNorms, attention and GELU MLP."""

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.norm1 = LayerNorm(dim)
        self.attn = Attention(dim, num_heads, bias=True)
        self.norm2 = LayerNorm(dim)
        self.mlp = _GeluMlp(dim, 4 * dim, gated=False, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, D) -> (B, N, D)."""
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TanhMlp(nn.Module):
    """``fc2(tanh(fc1(x)))``: the residual MLP after the blocks."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, D) -> (B, N, D)."""
        return self.fc2(torch.tanh(self.fc1(x)))


def position_table(dim: int, grid: int = GRID) -> nn.Parameter:
    """The fixed sin-cos table as the checkpoints store it: a frozen ``(1, D, g, g)`` parameter."""
    table = sincos_2d(grid, grid, dim).transpose(1, 2).reshape(1, dim, grid, grid)
    return nn.Parameter(table, requires_grad=False)


def _positions(table: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """The table resized to an ``h x w`` grid, as ``(1, h*w, D)``."""
    resized = F.interpolate(table, size=(h, w), mode="bicubic", align_corners=False)
    return resized.flatten(2).transpose(1, 2)


class _Trunk(nn.Module):
    """What encoder and decoder share: position table, blocks, the residual Tanh MLP."""

    def __init__(self, dim: int, depth: int, num_heads: int) -> None:
        super().__init__()
        self.dim = dim
        self.pos_emb = position_table(dim)
        self.blocks = nn.Sequential(*(Block(dim, num_heads) for _ in range(depth)))
        self.norm_mlp = LayerNorm(dim)
        self.post_mlp = TanhMlp(dim)


class TokenizerEncoder(_Trunk):
    """Image (or class map) -> ``(B, D, H/16, W/16)`` features."""

    def __init__(
        self, in_channels: int, dim: int = WIDTH, depth: int = DEPTH, num_heads: int = HEADS
    ) -> None:
        super().__init__(dim, depth, num_heads)
        self.in_channels = in_channels
        self.proj = nn.Conv2d(in_channels, dim, kernel_size=PATCH, stride=PATCH)

    def _one_hot(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim == 4 and x.shape[1] == 1:
            x = x[:, 0]
        if x.ndim != 3:
            raise ValueError(
                f"expected {self.in_channels} channels (B, {self.in_channels}, H, W) or a class "
                f"map (B, H, W), got shape {tuple(x.shape)}"
            )
        classes = x.to(torch.int64)
        if x.dtype.is_floating_point and not bool((classes == x).all()):
            raise ValueError("a class map must hold whole class numbers")
        if bool(((classes < 0) | (classes >= self.in_channels)).any()):
            raise ValueError(f"class numbers must lie in 0..{self.in_channels - 1}")
        one_hot = F.one_hot(classes, num_classes=self.in_channels).permute(0, 3, 1, 2)
        return one_hot.to(self.proj.weight.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) with H, W multiples of 16 -> (B, D, H/16, W/16)."""
        if x.ndim != 4 or x.shape[1] != self.in_channels:
            x = self._one_hot(x)
        b, _, height, width = x.shape
        if height % PATCH or width % PATCH:
            raise ValueError(f"image size {height}x{width} is not a multiple of {PATCH}")
        h, w = height // PATCH, width // PATCH
        tokens = self.proj(x.to(self.proj.weight.dtype)).flatten(2).transpose(1, 2)
        tokens = self.blocks(tokens + _positions(self.pos_emb, h, w))
        tokens = self._post_mlp_float32(tokens)
        return tokens.transpose(1, 2).reshape(b, self.dim, h, w)

    def _post_mlp_float32(self, x: torch.Tensor) -> torch.Tensor:
        """``x + post_mlp(norm_mlp(x))`` in float32 whatever the weights' dtype or autocast."""
        norm, mlp = self.norm_mlp, self.post_mlp
        kind = x.device.type if x.device.type in ("cpu", "cuda") else "cpu"
        with torch.autocast(kind, enabled=False):
            x = x.float()
            y = F.layer_norm(x, norm.weight.shape, norm.weight.float(), norm.bias.float(), norm.eps)
            y = torch.tanh(F.linear(y, mlp.fc1.weight.float(), mlp.fc1.bias.float()))
            return x + F.linear(y, mlp.fc2.weight.float(), mlp.fc2.bias.float())


class TokenizerDecoder(_Trunk):
    """``(B, D, h, w)`` features -> ``(B, C, 16 h, 16 w)`` values (logits, for LULC)."""

    def __init__(
        self, out_channels: int, dim: int = WIDTH, depth: int = DEPTH, num_heads: int = HEADS
    ) -> None:
        super().__init__(dim, depth, num_heads)
        self.out_channels = out_channels
        self.out_proj = nn.Linear(dim, out_channels * PATCH * PATCH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, D, h, w) -> (B, C, 16 h, 16 w)."""
        _, _, h, w = x.shape
        tokens = x.flatten(2).transpose(1, 2) + _positions(self.pos_emb, h, w)
        tokens = self.blocks(tokens)
        tokens = tokens + self.post_mlp(self.norm_mlp(tokens))
        values = self.out_proj(tokens)
        return rearrange(values, "b (h w) (c p q) -> b c (h p) (w q)", h=h, w=w, p=PATCH, q=PATCH)
