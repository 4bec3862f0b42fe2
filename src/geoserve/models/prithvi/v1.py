"""hls-foundation-os (Prithvi-EO-1.0, mmseg) fine-tunes: the token-to-image neck and FCN head.

The v1 Sen1Floods11, burn-scar and multi-temporal crop checkpoints (``*_Prithvi_100M.pth``)
hold ``backbone.*`` (the v1 encoder), ``neck.fpn1/fpn2`` and ``decode_head.*`` (an mmseg
``FCNHead``). The neck reshapes the last block's normed tokens to (B, D*T, H/p, W/p) with the
channel index ``d*T + t`` ("(e t)", unlike TerraTorch's "(t e)"), then upsamples x16 with two
pairs of 2x2 transposed convolutions around a channels-last LayerNorm (eps 1e-6) and GELU.
The head is one 3x3 conv-BN-ReLU, dropout, and a 1x1 classifier; logits come out at the input
size.
"""

from __future__ import annotations

import torch
from einops import rearrange
from torch import nn

from geoserve.models.prithvi.encoder import PrithviViT


class Norm2d(nn.Module):
    """LayerNorm over channels of a (B, C, H, W) map (key ``ln``)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(channels, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise each pixel's channel vector."""
        return self.ln(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2).contiguous()


def _up(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(
        nn.ConvTranspose2d(cin, cout, 2, 2),
        Norm2d(cout),
        nn.GELU(),
        nn.ConvTranspose2d(cout, cout, 2, 2),
    )


class TokensToImageNeck(nn.Module):
    """(B, 1 + T*h*w, D) tokens -> (B, out, 16h, 16w)."""

    def __init__(self, embed_dim: int, out_dim: int) -> None:
        super().__init__()
        self.fpn1 = _up(embed_dim, out_dim)
        self.fpn2 = _up(out_dim, out_dim)

    def forward(self, tokens: torch.Tensor, frames: int, h: int, w: int) -> torch.Tensor:
        """Drop CLS, reshape with the (e t) channel order, upsample x16."""
        x = rearrange(tokens[:, 1:], "b (t h w) e -> b (e t) h w", t=frames, h=h, w=w)
        return self.fpn2(self.fpn1(x))


class ConvModule(nn.Module):
    """mmcv ConvModule: conv (no bias) -> ``bn`` -> ReLU."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.activate = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the three layers."""
        return self.activate(self.bn(self.conv(x)))


class FCNHead(nn.Module):
    """mmseg FCNHead with one conv and no input concatenation."""

    def __init__(self, cin: int, channels: int, num_classes: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.convs = nn.Sequential(ConvModule(cin, channels))
        self.dropout = nn.Dropout2d(dropout)
        self.conv_seg = nn.Conv2d(channels, num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits."""
        return self.conv_seg(self.dropout(self.convs(x)))


class PrithviV1Segmentation(nn.Module):
    """v1 encoder + token neck + FCN head: (B, C, [T,] H, W) -> logits (B, classes, H, W)."""

    def __init__(
        self,
        *,
        num_classes: int,
        neck_dim: int = 768,
        head_channels: int = 256,
        **encoder_kwargs: object,
    ) -> None:
        super().__init__()
        self.encoder = PrithviViT(**encoder_kwargs)  # type: ignore[arg-type]
        frames = self.encoder.grid[0]
        self.neck = TokensToImageNeck(self.encoder.embed_dim * frames, neck_dim)
        self.decode_head = FCNHead(neck_dim, head_channels, num_classes)
        self.num_classes = num_classes

    def forward(self, x: torch.Tensor, **coords: torch.Tensor | None) -> torch.Tensor:
        """Class logits at the input size (a multiple of the patch size)."""
        tokens = self.encoder(x)
        p = self.encoder.patch_size
        frames = (x.shape[2] if x.ndim == 5 else 1) // p[0]
        h, w = x.shape[-2] // p[1], x.shape[-1] // p[2]
        logits = self.decode_head(self.neck(tokens, frames, h, w))
        if logits.shape[-2:] != x.shape[-2:]:
            logits = nn.functional.interpolate(logits, size=x.shape[-2:], mode="bilinear")
        return logits
