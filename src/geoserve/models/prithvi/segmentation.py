"""Prithvi segmentation models: encoder, UperNet decoder with scale modules, segmentation head.

The Sen1Floods11 fine-tune layout (TerraTorch ``EncoderDecoderFactory`` with
``decoder: UperNetDecoder``, ``decoder_scale_modules: true``; anchor_prithvi.md A2/A4):

1. reflect-pad to a multiple of 2 x patch, split evenly on both sides (TerraTorch >= 1.2; older
   versions padded bottom/right only), and crop the centre back at the end;
2. encoder features of the selected blocks (e.g. 5, 11, 17, 23), CLS dropped, tokens reshaped
   to (B, T*D, H/p, W/p) with channel index t*D + d ("(t e)", TerraTorch's order);
3. scale modules make a pyramid at H/4, H/8, H/16, H/32 (2 transposed convs, 1, identity,
   max-pool); UperNet (PPM on the last level, lateral and FPN convs, bilinear
   ``align_corners=True``) gives (B, 256, H/4, W/4);
4. the head (dropout, 1x1 conv; index 2 in ``head.head``) gives class logits, resized
   bilinearly (``align_corners=False``) to the padded size and cropped back.

Module and parameter names follow the checkpoints (``decoder.fpn1.0``,
``decoder.psp_modules.0.1.conv``, ``head.head.2``...).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F  # noqa: N812
from einops import rearrange
from torch import nn

from geoserve.models.prithvi.encoder import PrithviViT


class ConvBNReLU(nn.Module):
    """conv (no bias) -> BatchNorm -> ReLU; keys ``conv`` and ``norm`` as in the checkpoints."""

    def __init__(self, cin: int, cout: int, kernel: int, padding: int = 0) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, padding=padding, bias=False)
        self.norm = nn.BatchNorm2d(cout)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the three layers."""
        return self.act(self.norm(self.conv(x)))


class UperNetDecoder(nn.Module):
    """UperNet over a ViT feature list, with the scale modules that build the pyramid."""

    def __init__(
        self,
        in_channels: int,
        channels: int = 256,
        pool_scales: Sequence[int] = (1, 2, 3, 6),
    ) -> None:
        super().__init__()
        c = in_channels
        self.fpn1 = nn.Sequential(
            nn.ConvTranspose2d(c, c // 2, 2, 2),
            nn.BatchNorm2d(c // 2),
            nn.GELU(),
            nn.ConvTranspose2d(c // 2, c // 4, 2, 2),
        )
        self.fpn2 = nn.Sequential(nn.ConvTranspose2d(c, c // 2, 2, 2))
        self.fpn3 = nn.Sequential(nn.Identity())
        self.fpn4 = nn.Sequential(nn.MaxPool2d(2, 2))
        levels = [c // 4, c // 2, c, c]
        self.psp_modules = nn.ModuleList(
            nn.Sequential(nn.AdaptiveAvgPool2d(s), ConvBNReLU(levels[-1], channels, 1))
            for s in pool_scales
        )
        self.bottleneck = ConvBNReLU(levels[-1] + len(pool_scales) * channels, channels, 3, 1)
        self.lateral_convs = nn.ModuleList(ConvBNReLU(lv, channels, 1) for lv in levels[:-1])
        self.fpn_convs = nn.ModuleList(ConvBNReLU(channels, channels, 3, 1) for _ in levels[:-1])
        self.fpn_bottleneck = ConvBNReLU(len(levels) * channels, channels, 3, 1)
        self.out_channels = channels

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        """Four (B, C, h, w) maps at the token grid -> (B, channels, 4h, 4w)."""
        pyramid = [
            self.fpn1(features[0]),
            self.fpn2(features[1]),
            self.fpn3(features[2]),
            self.fpn4(features[3]),
        ]
        top = pyramid[-1]
        pooled = [
            F.interpolate(m(top), size=top.shape[2:], mode="bilinear", align_corners=True)
            for m in self.psp_modules
        ]
        laterals = [conv(pyramid[i]) for i, conv in enumerate(self.lateral_convs)]
        laterals.append(self.bottleneck(torch.cat([top, *pooled], dim=1)))
        for i in range(len(laterals) - 1, 0, -1):
            laterals[i - 1] = laterals[i - 1] + F.interpolate(
                laterals[i], size=laterals[i - 1].shape[2:], mode="bilinear", align_corners=True
            )
        outs = [conv(laterals[i]) for i, conv in enumerate(self.fpn_convs)]
        outs.append(laterals[-1])
        size = outs[0].shape[2:]
        outs = [outs[0]] + [
            F.interpolate(o, size=size, mode="bilinear", align_corners=True) for o in outs[1:]
        ]
        return self.fpn_bottleneck(torch.cat(outs, dim=1))


class SegmentationHead(nn.Module):
    """Dropout then a 1x1 conv; the conv sits at ``head.2`` as in TerraTorch checkpoints."""

    def __init__(self, in_channels: int, num_classes: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.head = nn.Sequential(
            nn.Identity(),
            nn.Dropout(dropout) if dropout else nn.Identity(),
            nn.Conv2d(in_channels, num_classes, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Per-pixel class logits."""
        return self.head(x)


class PrithviSegmentation(nn.Module):
    """Prithvi encoder + UperNet + head: (B, C, [T,] H, W) -> logits (B, classes, H, W)."""

    def __init__(
        self,
        *,
        num_classes: int,
        feature_indices: Sequence[int],
        decoder_channels: int = 256,
        head_dropout: float = 0.1,
        **encoder_kwargs: object,
    ) -> None:
        super().__init__()
        self.encoder = PrithviViT(**encoder_kwargs)  # type: ignore[arg-type]
        self.feature_indices = tuple(feature_indices)
        t = self.encoder.grid[0]
        self.decoder = UperNetDecoder(self.encoder.embed_dim * t, decoder_channels)
        self.head = SegmentationHead(decoder_channels, num_classes, head_dropout)
        self.num_classes = num_classes

    def forward(
        self,
        x: torch.Tensor,
        temporal_coords: torch.Tensor | None = None,
        location_coords: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Class logits at the input's full size."""
        h, w = x.shape[-2:]
        multiple = 2 * self.encoder.patch_size[1]
        pad_h, pad_w = (-h) % multiple, (-w) % multiple
        top, left = pad_h // 2, pad_w // 2
        if pad_h or pad_w:
            x = _reflect_pad(x, (left, pad_w - left, top, pad_h - top))
        feats = self.encoder.forward_features(x, temporal_coords, location_coords)
        p = self.encoder.patch_size
        t = (x.shape[2] if x.ndim == 5 else 1) // p[0]
        gh, gw = x.shape[-2] // p[1], x.shape[-1] // p[2]
        maps = [
            rearrange(feats[i][:, 1:], "b (t h w) e -> b (t e) h w", t=t, h=gh, w=gw)
            for i in self.feature_indices
        ]
        logits = self.head(self.decoder(maps))
        logits = F.interpolate(logits, size=x.shape[-2:], mode="bilinear")
        return logits[..., top : top + h, left : left + w]


def _reflect_pad(x: torch.Tensor, pads: tuple[int, int, int, int]) -> torch.Tensor:
    if x.ndim == 5:
        b, c, t, hh, ww = x.shape
        flat = F.pad(x.reshape(b, c * t, hh, ww), pads, mode="reflect")
        return flat.reshape(b, c, t, *flat.shape[-2:])
    return F.pad(x, pads, mode="reflect")
