"""The Prithvi MAE decoder: the pretrained models' own image-to-image output (reconstruction).

Serving runs it without masking: every token is encoded and decoded, and the predicted patches
are folded back into (B, C, T, H, W) in the input's normalised units. Key names follow the
reference (``decoder.decoder_embed``, ``decoder.decoder_blocks.N``, ``decoder.decoder_pred``...)
so that pretrained checkpoints load unchanged.
"""

from __future__ import annotations

import torch
from einops import rearrange
from timm.models.vision_transformer import Block
from torch import nn

from geoserve.models.prithvi.encoder import (
    CoordsEncoder,
    PrithviViT,
    add_coords,
    resize_pos_embed,
    set_layernorm_eps,
    sincos_3d,
)


class MAEDecoder(nn.Module):
    """Transformer decoder from encoder tokens to per-patch pixel values."""

    decoder_pos_embed: torch.Tensor

    def __init__(
        self,
        patch_size: tuple[int, int, int],
        grid: tuple[int, int, int],
        in_chans: int,
        encoder_embed_dim: int,
        decoder_embed_dim: int = 512,
        depth: int = 8,
        num_heads: int = 16,
        mlp_ratio: float = 4.0,
        coords_encoding: list[str] | tuple[str, ...] | None = None,
        coords_scale_learn: bool = False,
        norm_eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.patch_size, self.grid = patch_size, grid
        self.num_frames = grid[0] * patch_size[0]
        self.decoder_embed = nn.Linear(encoder_embed_dim, decoder_embed_dim)
        coords = set(coords_encoding or ())
        self.temporal_embed_dec = (
            CoordsEncoder(decoder_embed_dim, coords_scale_learn) if "time" in coords else None
        )
        self.location_embed_dec = (
            CoordsEncoder(decoder_embed_dim, coords_scale_learn) if "location" in coords else None
        )
        self.mask_token = nn.Parameter(torch.zeros(1, 1, decoder_embed_dim))
        self.register_buffer("decoder_pos_embed", sincos_3d(decoder_embed_dim, grid))
        self.decoder_blocks = nn.ModuleList(
            Block(decoder_embed_dim, num_heads, mlp_ratio, qkv_bias=True, norm_layer=nn.LayerNorm)
            for _ in range(depth)
        )
        self.decoder_norm = nn.LayerNorm(decoder_embed_dim)
        p = patch_size
        self.decoder_pred = nn.Linear(decoder_embed_dim, p[0] * p[1] * p[2] * in_chans)
        set_layernorm_eps(self, norm_eps)

    def forward(
        self,
        tokens: torch.Tensor,
        input_shape: tuple[int, int, int],
        temporal_coords: torch.Tensor | None = None,
        location_coords: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, 1 + L, D_enc) unmasked encoder tokens -> (B, L, t*p*p*C) predictions."""
        x = self.decoder_embed(tokens)
        p = self.patch_size
        new_grid = (input_shape[0] // p[0], input_shape[1] // p[1], input_shape[2] // p[2])
        pos = resize_pos_embed(self.decoder_pos_embed, self.grid, new_grid)
        cls = x[:, :1] + pos[:, :1]
        x = add_coords(
            x[:, 1:] + pos[:, 1:],
            self.num_frames,
            self.temporal_embed_dec,
            temporal_coords,
            self.location_embed_dec,
            location_coords,
        )
        x = torch.cat([cls, x], dim=1)
        for block in self.decoder_blocks:
            x = block(x)
        return self.decoder_pred(self.decoder_norm(x))[:, 1:]


class PrithviMAE(nn.Module):
    """Encoder + MAE decoder; ``forward`` returns the unmasked reconstruction (B, C, T, H, W)."""

    def __init__(
        self,
        *,
        decoder_embed_dim: int = 512,
        decoder_depth: int = 8,
        decoder_num_heads: int = 16,
        **encoder_kwargs: object,
    ) -> None:
        super().__init__()
        self.encoder = PrithviViT(**encoder_kwargs)  # type: ignore[arg-type]
        enc = self.encoder
        self.decoder = MAEDecoder(
            enc.patch_size,  # type: ignore[arg-type]
            enc.grid,
            enc.in_chans,
            enc.embed_dim,
            decoder_embed_dim,
            decoder_depth,
            decoder_num_heads,
            coords_encoding=encoder_kwargs.get("coords_encoding"),  # type: ignore[arg-type]
            coords_scale_learn=bool(encoder_kwargs.get("coords_scale_learn", False)),
            norm_eps=float(encoder_kwargs.get("norm_eps", 1e-5)),  # type: ignore[arg-type]
        )

    def forward(
        self,
        x: torch.Tensor,
        temporal_coords: torch.Tensor | None = None,
        location_coords: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Reconstruct every patch: (B, C, T, H, W) (or (B, C, H, W) in, same shape out)."""
        squeeze = x.ndim == 4
        if squeeze:
            x = x.unsqueeze(2)
        tokens = self.encoder(x, temporal_coords, location_coords)
        pred = self.decoder(tokens, tuple(x.shape[-3:]), temporal_coords, location_coords)
        s, p, q = self.encoder.patch_size
        t, h, w = x.shape[-3:]
        out = rearrange(
            pred,
            "b (t h w) (s p q c) -> b c (t s) (h p) (w q)",
            t=t // s,
            h=h // p,
            w=w // q,
            s=s,
            p=p,
            q=q,
        )
        return out.squeeze(2) if squeeze else out

    def forward_features(
        self,
        x: torch.Tensor,
        temporal_coords: torch.Tensor | None = None,
        location_coords: torch.Tensor | None = None,
    ) -> list[torch.Tensor]:
        """The encoder's per-block features (reference contract)."""
        return self.encoder.forward_features(x, temporal_coords, location_coords)
