"""The Prithvi ViT encoder (Prithvi-EO-1.0 and -2.0), built from timm ``Block``s.

Written from the published architecture (Szwarcman et al., "Prithvi-EO-2.0: A Versatile
Multi-Temporal Foundation Model for Earth Observation Applications", arXiv:2412.02732) and the
public reference code (Apache-2.0): the ``prithvi_mae.py`` that IBM and NASA publish with the
weights (e.g. huggingface.co/ibm-nasa-geospatial/Prithvi-EO-2.0-300M) and TerraTorch's copy of
it (github.com/IBM/terratorch, ``terratorch/models/backbones/prithvi_mae.py``), so that
checkpoints of the reference implementation load by name and give the same numbers:

- 3D patch embedding: ``Conv3d(in_chans, D, kernel=stride=(1, p, p))``, tokens in (t, h, w)
  order;
- a fixed 3D sin-cos positional embedding with channels split w : h : t = 6 : 6 : 4 (sixteenths
  of D), row 0 (the CLS position) zero. It is recomputed, never loaded. For another number of
  frames it is recomputed for the new T; for another image size the configured grid is
  interpolated bicubically with ``align_corners=True``, exactly as the reference does (a freshly
  computed grid differs by up to 2.0);
- optional temporal (year, day of year) and location (lon, lat) sin-cos encodings, each times a
  learned or fixed ``scale``, added to the patch tokens when the coordinates are given;
- a CLS token, pre-norm transformer blocks (exact GELU, qkv bias, LayerNorm eps 1e-5), and the
  final norm applied to the last block's output only.

``forward_features`` keeps the reference contract: one tensor per block (CLS included), the last
one normed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from einops import rearrange
from numpy.typing import NDArray
from timm.models.vision_transformer import Block
from torch import nn

from geoserve.errors import ConfigError


def sincos_1d(dim: int, positions: NDArray[Any]) -> NDArray[np.float64]:
    """MAE 1-D sin-cos: (M,) positions -> (M, dim), sines then cosines."""
    if dim % 2:
        raise ValueError(f"sin-cos embedding needs an even dimension, got {dim}")
    omega = 1.0 / 10000 ** (np.arange(dim // 2, dtype=np.float64) / (dim / 2.0))
    angles = np.outer(positions.reshape(-1).astype(np.float64), omega)
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)


def sincos_3d(dim: int, grid: tuple[int, int, int]) -> torch.Tensor:
    """(1, 1 + t*h*w, dim) float32 embedding for a (t, h, w) token grid; row 0 is zeros."""
    if dim % 16:
        raise ValueError(f"embed_dim must be divisible by 16, got {dim}")
    t, h, w = grid
    dw, dh, dt = dim // 16 * 6, dim // 16 * 6, dim // 16 * 4
    ew = np.tile(sincos_1d(dw, np.arange(w)), (t * h, 1))
    eh = np.tile(np.repeat(sincos_1d(dh, np.arange(h)), w, axis=0), (t, 1))
    et = np.repeat(sincos_1d(dt, np.arange(t)), h * w, axis=0)
    table = np.concatenate([np.zeros((1, dim)), np.concatenate([ew, eh, et], axis=1)], axis=0)
    return torch.from_numpy(table).float().unsqueeze(0)


def sincos_torch(dim: int, values: torch.Tensor) -> torch.Tensor:
    """1-D sin-cos of arbitrary float values (coordinates), computed in the values' dtype."""
    omega = torch.arange(dim // 2, dtype=values.dtype, device=values.device)
    omega = 1.0 / 10000 ** (omega / (dim / 2.0))
    angles = values.reshape(-1, 1) * omega
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)


def set_layernorm_eps(module: nn.Module, eps: float) -> None:
    """Set every LayerNorm's eps (the reference uses 1e-5; the first v1 demo used 1e-6)."""
    for m in module.modules():
        if isinstance(m, nn.LayerNorm):
            m.eps = eps


def resize_pos_embed(
    pos_embed: torch.Tensor,
    grid: tuple[int, int, int],
    new_grid: tuple[int, int, int],
) -> torch.Tensor:
    """The embedding for ``new_grid``: new T recomputed, new H/W bicubically interpolated."""
    if new_grid == grid:
        return pos_embed
    dim = pos_embed.shape[-1]
    base = pos_embed
    t = grid[0]
    if new_grid[0] != grid[0]:
        t = new_grid[0]
        base = sincos_3d(dim, (t, grid[1], grid[2])).to(pos_embed)
    cls, tokens = base[:, :1], base[:, 1:]
    tokens = tokens.reshape(t, grid[1], grid[2], dim).permute(0, 3, 1, 2)
    tokens = nn.functional.interpolate(
        tokens, size=new_grid[1:], mode="bicubic", align_corners=True
    )
    tokens = tokens.permute(0, 2, 3, 1).reshape(1, -1, dim)
    return torch.cat([cls, tokens], dim=1)


def layer_tokens(
    features: list[torch.Tensor], layer: int, frames: int, h: int, w: int
) -> torch.Tensor:
    """Block ``layer``'s patch tokens as (B, D, h, w), CLS dropped, averaged over time frames.

    ``layer`` indexes :meth:`PrithviViT.forward_features`' list (-1: the last block, normed).

    Raises:
        ConfigError: no such block (naming how many there are).
    """
    n = len(features)
    if not -n <= layer < n:
        raise ConfigError(
            f"embedding_layer {layer}: the encoder has {n} blocks (0 to {n - 1}, or -1 for the "
            "last)"
        )
    grid = rearrange(features[layer][:, 1:], "b (t h w) e -> b e t h w", t=frames, h=h, w=w)
    return grid.mean(dim=2)


class PatchEmbed(nn.Module):
    """Tubelet embedding: (B, C, T, H, W) -> (B, T*(H/p)*(W/p), D)."""

    def __init__(self, patch_size: tuple[int, int, int], in_chans: int, embed_dim: int) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv3d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Project and flatten the tubelets."""
        return self.proj(x).flatten(2).transpose(1, 2)


class CoordsEncoder(nn.Module):
    """Sin-cos encoding of two coordinates, half the channels each, times ``scale``.

    Used for time (year, day of year) and location (lon, lat). With ``learn_scale`` the scale is
    a parameter initialised to 0.1 (all released TL models); otherwise a persistent buffer of
    ones, as in the reference, so the key exists either way.
    """

    def __init__(self, embed_dim: int, learn_scale: bool) -> None:
        super().__init__()
        self.dims = (embed_dim // 2, embed_dim - embed_dim // 2)
        if learn_scale:
            self.scale = nn.Parameter(torch.full((1,), 0.1))
        else:
            self.register_buffer("scale", torch.ones(1))

    def forward(self, coords: torch.Tensor) -> torch.Tensor:
        """(..., 2) coordinates -> (..., D)."""
        lead = coords.shape[:-1]
        first = sincos_torch(self.dims[0], coords[..., 0]).reshape(*lead, -1)
        second = sincos_torch(self.dims[1], coords[..., 1]).reshape(*lead, -1)
        return self.scale * torch.cat([first, second], dim=-1)


def add_coords(
    tokens: torch.Tensor,
    num_frames: int,
    temporal: CoordsEncoder | None,
    temporal_coords: torch.Tensor | None,
    location: CoordsEncoder | None,
    location_coords: torch.Tensor | None,
) -> torch.Tensor:
    """Add the time and location encodings to (B, L, D) patch tokens, where both are given.

    The time encoding of each frame is repeated over that frame's tokens; tokens per frame come
    from the *configured* number of frames, as in the reference.
    """
    if temporal is not None and temporal_coords is not None:
        per_frame = tokens.shape[1] // num_frames
        tokens = tokens + torch.repeat_interleave(temporal(temporal_coords), per_frame, dim=1)
    if location is not None and location_coords is not None:
        tokens = tokens + location(location_coords).unsqueeze(1)
    return tokens


class PrithviViT(nn.Module):
    """Prithvi encoder; see the module docstring. Input (B, C, T, H, W), or (B, C, H, W) if T=1."""

    pos_embed: torch.Tensor

    def __init__(
        self,
        img_size: int = 224,
        patch_size: int | tuple[int, int, int] = (1, 16, 16),
        num_frames: int = 1,
        in_chans: int = 6,
        embed_dim: int = 1024,
        depth: int = 24,
        num_heads: int = 16,
        mlp_ratio: float = 4.0,
        coords_encoding: list[str] | tuple[str, ...] | None = None,
        coords_scale_learn: bool = False,
        norm_eps: float = 1e-5,
    ) -> None:
        super().__init__()
        if isinstance(patch_size, int):
            patch_size = (1, patch_size, patch_size)
        self.patch_size = tuple(patch_size)
        self.num_frames = num_frames
        self.in_chans = in_chans
        self.embed_dim = embed_dim
        self.img_size = img_size
        self.grid = (
            num_frames // self.patch_size[0],
            img_size // self.patch_size[1],
            img_size // self.patch_size[2],
        )
        self.patch_embed = PatchEmbed(self.patch_size, in_chans, embed_dim)  # type: ignore[arg-type]
        coords = set(coords_encoding or ())
        self.temporal_embed_enc = (
            CoordsEncoder(embed_dim, coords_scale_learn) if "time" in coords else None
        )
        self.location_embed_enc = (
            CoordsEncoder(embed_dim, coords_scale_learn) if "location" in coords else None
        )
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.register_buffer("pos_embed", sincos_3d(embed_dim, self.grid))
        self.blocks = nn.ModuleList(
            Block(embed_dim, num_heads, mlp_ratio, qkv_bias=True, norm_layer=nn.LayerNorm)
            for _ in range(depth)
        )
        self.norm = nn.LayerNorm(embed_dim)
        set_layernorm_eps(self, norm_eps)

    def embed(
        self,
        x: torch.Tensor,
        temporal_coords: torch.Tensor | None = None,
        location_coords: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens with positions and coordinates added, CLS first; also the pos embedding used."""
        if x.ndim == 4:
            x = x.unsqueeze(2)
        t, h, w = x.shape[-3:]
        p = self.patch_size
        pos = resize_pos_embed(self.pos_embed, self.grid, (t // p[0], h // p[1], w // p[2]))
        tokens = add_coords(
            self.patch_embed(x) + pos[:, 1:],
            self.num_frames,
            self.temporal_embed_enc,
            temporal_coords,
            self.location_embed_enc,
            location_coords,
        )
        cls = (self.cls_token + pos[:, :1]).expand(tokens.shape[0], -1, -1)
        return torch.cat([cls, tokens], dim=1), pos

    def forward_features(
        self,
        x: torch.Tensor,
        temporal_coords: torch.Tensor | None = None,
        location_coords: torch.Tensor | None = None,
    ) -> list[torch.Tensor]:
        """One (B, 1 + tokens, D) tensor per block; the last one normed."""
        tokens, _ = self.embed(x, temporal_coords, location_coords)
        out = []
        for block in self.blocks:
            tokens = block(tokens)
            out.append(tokens)
        out[-1] = self.norm(tokens)
        return out

    def forward(
        self,
        x: torch.Tensor,
        temporal_coords: torch.Tensor | None = None,
        location_coords: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The last block's normed tokens (B, 1 + tokens, D)."""
        return self.forward_features(x, temporal_coords, location_coords)[-1]
