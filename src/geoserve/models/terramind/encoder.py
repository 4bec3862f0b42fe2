"""The TerraMind v1 encoder as TerraTorch fine-tunes it (``TerraMindViT``).

Each image modality has its own patch embedding: 16x16 patches flattened channel-last and a
bias-free linear projection, plus a learned modality embedding and a fixed 2-D sin-cos position
embedding (built on the 14x14 grid of 224 px, resized bicubically for other sizes). The
modalities' token sequences are concatenated, run through the shared transformer blocks, and
each block's output is split back per modality and merged (mean by default) into one
(B, N, D) tensor per layer; the encoder norm is applied to the last. There is no CLS token.

Module and parameter names follow TerraTorch checkpoints (``encoder_embeddings.<key>.proj``,
``encoder.<i>.attn.qkv``, ``encoder_norm``). Facts from TerraTorch 1.2.13 and arXiv:2504.11171.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F  # noqa: N812
from einops import rearrange
from torch import nn

from geoserve.models.terramind.variants import IMG_SIZE, PATCH_SIZE, modality_key


class LayerNorm(nn.Module):
    """LayerNorm whose bias may be a fixed zero buffer (kept in checkpoints as ``bias``)."""

    def __init__(self, dim: int, eps: float = 1e-6, bias: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        if bias:
            self.bias = nn.Parameter(torch.zeros(dim))
        else:
            self.register_buffer("bias", torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise the last dimension."""
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class Attention(nn.Module):
    """Multi-head self-attention with a fused qkv projection."""

    def __init__(self, dim: int, num_heads: int, bias: bool) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=bias)
        self.proj = nn.Linear(dim, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, D) -> (B, N, D)."""
        b, n, d = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, d // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(q, k, v, scale=self.scale)
        return self.proj(y.transpose(1, 2).reshape(b, n, d))


class Mlp(nn.Module):
    """fc1 -> activation -> fc2; gated (SwiGLU: fc2(act(fc1) * fc3)) for base and large."""

    def __init__(self, dim: int, hidden: int, gated: bool, bias: bool) -> None:
        super().__init__()
        if gated:
            hidden = int(2 * hidden / 3)
        self.fc1 = nn.Linear(dim, hidden, bias=bias)
        self.act: nn.Module = nn.SiLU() if gated else nn.GELU()
        self.fc2 = nn.Linear(hidden, dim, bias=bias)
        self.fc3 = nn.Linear(dim, hidden, bias=bias) if gated else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, D) -> (B, N, D)."""
        h = self.act(self.fc1(x))
        if self.fc3 is not None:
            h = h * self.fc3(x)
        return self.fc2(h)


class Block(nn.Module):
    """Pre-norm transformer block."""

    def __init__(self, dim: int, num_heads: int, gated_mlp: bool, bias: bool) -> None:
        super().__init__()
        self.norm1 = LayerNorm(dim, bias=False)
        self.attn = Attention(dim, num_heads, bias)
        self.norm2 = LayerNorm(dim, bias=False)
        self.mlp = Mlp(dim, 4 * dim, gated_mlp, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """One block."""
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


def sincos_2d(h: int, w: int, dim: int) -> torch.Tensor:
    """TerraMind's fixed position embedding, (1, h*w, dim).

    The grid is built width-major (``meshgrid(w, h, indexing="ij")``) and the channels are
    ``[sin(x), cos(x), sin(y), cos(y)]`` with x the first grid axis, as in the checkpoints.
    """
    gw, gh = torch.meshgrid(torch.arange(w), torch.arange(h), indexing="ij")
    quarter = dim // 4
    omega = 1.0 / 10000.0 ** (torch.arange(quarter, dtype=torch.float32) / quarter)
    out_w = torch.einsum("n,d->nd", gw.reshape(-1).float(), omega)
    out_h = torch.einsum("n,d->nd", gh.reshape(-1).float(), omega)
    parts = [out_w.sin(), out_w.cos(), out_h.sin(), out_h.cos()]
    return torch.cat(parts, dim=1).unsqueeze(0)


def resized_positions(pos: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """A square (1, g*g, D) position table for an h x w token grid (row-major), resized bicubically.

    The table is returned as it is when the grid is its own.
    """
    g = round(int(pos.shape[1]) ** 0.5)  # (int: a traced shape entry is a tensor)
    if (h, w) == (g, g):
        return pos
    d = pos.shape[-1]
    grid = pos.reshape(1, g, g, d).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, size=(h, w), mode="bicubic", align_corners=False)
    return grid.permute(0, 2, 3, 1).reshape(1, -1, d)


class PatchEmbedding(nn.Module):
    """One image modality: patches -> tokens (``proj``), plus ``mod_emb`` and ``pos_emb``."""

    def __init__(self, channels: int, dim: int, img_size: int = IMG_SIZE) -> None:
        super().__init__()
        self.channels = channels
        self.grid = img_size // PATCH_SIZE
        self.register_buffer("pos_emb", sincos_2d(self.grid, self.grid, dim))
        self.mod_emb = nn.Parameter(torch.zeros(1, 1, dim))
        self.proj = nn.Linear(channels * PATCH_SIZE * PATCH_SIZE, dim, bias=False)

    def positions(self, h: int, w: int) -> torch.Tensor:
        """The position embedding for an h x w token grid (bicubic resize of the stored one)."""
        return resized_positions(self.get_buffer("pos_emb"), h, w)

    def embed(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, C, H, W) -> the projected patches (B, N, D) and position + modality (1, N, D)."""
        h, w = x.shape[-2] // PATCH_SIZE, x.shape[-1] // PATCH_SIZE
        patches = rearrange(
            x, "b c (h ph) (w pw) -> b (h w) (ph pw c)", ph=PATCH_SIZE, pw=PATCH_SIZE
        )
        return self.proj(patches), self.positions(h, w) + self.mod_emb

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) with H, W multiples of 16 -> tokens with embeddings (B, N, D)."""
        tokens, emb = self.embed(x)
        return tokens + emb


class TerraMindEncoder(nn.Module):
    """TerraMind v1 encoder: a dict of modality tensors -> one (B, N, D) tensor per layer.

    Args:
        modalities: Modality name -> channel count, in the model's order. Names are
            TerraTorch's (``S2L2A``, ``S1GRD``, ...) and map to the checkpoints' embedding
            keys by TerraTorch's rules (:func:`~geoserve.models.terramind.variants.modality_key`).
        dim, depth, num_heads, gated_mlp, bias: The variant (see ``VARIANTS``).
        merge: How the modalities' tokens become one sequence: ``mean`` (TerraTorch's
            default), ``max`` or ``concat`` (along channels; a learned ``missing_mod_token``
            stands in for modalities not given).
        img_size: The size the position embedding is stored for (224 for v1).
        num_register_tokens: Extra learned tokens in front of the sequence (0 for v1).
    """

    def __init__(
        self,
        modalities: Mapping[str, int],
        *,
        dim: int,
        depth: int,
        num_heads: int,
        gated_mlp: bool,
        bias: bool,
        merge: str = "mean",
        img_size: int = IMG_SIZE,
        num_register_tokens: int = 0,
    ) -> None:
        super().__init__()
        if merge not in ("mean", "max", "concat"):
            raise ValueError(f"merge method {merge!r} is not supported; use mean, max or concat")
        if not modalities:
            raise ValueError("a TerraMind encoder needs at least one modality")
        self.keys = {name: modality_key(name) for name in modalities}
        if len(set(self.keys.values())) != len(self.keys):
            raise ValueError(f"two modality names map to one embedding: {self.keys}")
        self.encoder_embeddings = nn.ModuleDict(
            {self.keys[name]: PatchEmbedding(c, dim, img_size) for name, c in modalities.items()}
        )
        self.merge = merge
        self.dim = dim
        if merge == "concat":
            self.missing_mod_token = nn.Parameter(torch.zeros(dim))
        self.encoder = nn.ModuleList(Block(dim, num_heads, gated_mlp, bias) for _ in range(depth))
        self.encoder_norm = LayerNorm(dim, bias=False)
        self.num_register_tokens = num_register_tokens
        if num_register_tokens:
            self.register_tokens = nn.Parameter(torch.zeros(1, num_register_tokens, dim))
        #: Modality sequences a concatenation holds (missing ones: ``missing_mod_token``).
        self.slots = len(modalities)
        width = dim * self.slots if merge == "concat" else dim
        self.out_channels = [width] * depth

    @property
    def modalities(self) -> list[str]:
        """The modality names the encoder takes, in its order."""
        return list(self.keys)

    def forward(self, x: Mapping[str, torch.Tensor] | torch.Tensor) -> list[torch.Tensor]:
        """Per-layer features after merging the modalities.

        ``x`` maps modality names to (B, C, H, W) tensors on one grid (any subset of the
        model's modalities, in any order; they are taken in the model's order); a bare tensor
        is the first modality.
        """
        x = self.given(x)
        return self.encode([self.encoder_embeddings[self.keys[m]](t) for m, t in x.items()])

    def given(self, x: Mapping[str, torch.Tensor] | torch.Tensor) -> dict[str, torch.Tensor]:
        """The inputs in the model's order (a bare tensor: the first modality), checked.

        Raises:
            ValueError: unknown modalities, or none of the model's.
        """
        if isinstance(x, torch.Tensor):
            x = {self.modalities[0]: x}
        unknown = [m for m in x if m not in self.keys]
        if unknown:
            raise ValueError(f"unknown modalities {unknown}; this model takes {self.modalities}")
        given = {m: x[m] for m in self.keys if m in x}
        if not given:
            raise ValueError(f"no input; this model takes {self.modalities}")
        return given

    def encode(self, seqs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Embedded per-modality token sequences (B, N, D) -> the merged features of each layer."""
        sizes = [s.shape[1] for s in seqs]
        tokens = torch.cat(list(seqs), dim=1)
        if self.num_register_tokens:
            tokens = torch.cat([self.register_tokens.expand(tokens.shape[0], -1, -1), tokens], 1)
        out = []
        for block in self.encoder:
            tokens = block(tokens)
            out.append(tokens)
        out[-1] = self.encoder_norm(tokens)
        return [self._merge(f, sizes) for f in out]

    def _merge(self, x: torch.Tensor, sizes: Sequence[int]) -> torch.Tensor:
        x = x[:, self.num_register_tokens :]
        per = torch.stack(torch.split(x, list(sizes), dim=1), dim=1)  # (B, M, N, D)
        if self.merge == "mean":
            return per.mean(dim=1)
        if self.merge == "max":
            return per.max(dim=1)[0]
        missing = self.slots - per.shape[1]
        if missing:
            fill = self.missing_mod_token.repeat(per.shape[0], missing, per.shape[2], 1)
            per = torch.cat([per, fill], dim=1)
        return torch.cat(per.unbind(dim=1), dim=-1)
