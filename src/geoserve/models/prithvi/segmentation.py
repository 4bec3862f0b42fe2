"""Prithvi segmentation models: encoder, UperNet or UNet decoder, segmentation head.

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

The burn-scar and crop fine-tunes use the same scale modules as a neck (``neck.2.fpn1..4``) and
a UNet decoder (``decoder.decoder.blocks.N``) instead of UperNet; see :class:`UNetDecoder`.

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


class ScalePyramid(nn.Module):
    """Four same-size ViT maps -> a pyramid at 4x, 2x, 1x and 1/2x their size (``fpn1..4``).

    TerraTorch 1.1 kept these in UperNet (``decoder_scale_modules``); later versions and the
    UNet fine-tunes have them as the ``LearnedInterpolateToPyramidal`` neck. Same layers.
    """

    def __init__(self, in_channels: int) -> None:
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
        self.levels = [c // 4, c // 2, c, c]

    def pyramid(self, features: list[torch.Tensor]) -> list[torch.Tensor]:
        """Apply fpn1..fpn4 to the four maps."""
        return [
            self.fpn1(features[0]),
            self.fpn2(features[1]),
            self.fpn3(features[2]),
            self.fpn4(features[3]),
        ]


class UperNetDecoder(ScalePyramid):
    """UperNet over a ViT feature list, with the scale modules that build the pyramid."""

    def __init__(
        self,
        in_channels: int,
        channels: int = 256,
        pool_scales: Sequence[int] = (1, 2, 3, 6),
    ) -> None:
        super().__init__(in_channels)
        levels = self.levels
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
        pyramid = self.pyramid(features)
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


class ConvBNReLUSeq(nn.Sequential):
    """3x3 conv (no bias), BatchNorm, ReLU as an indexed Sequential (keys ``0``, ``1``)."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__(
            nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()
        )


class UNetBlock(nn.Module):
    """Resize to the target size (nearest), concatenate the skip, two conv-BN-ReLU."""

    def __init__(self, cin: int, skip: int, cout: int) -> None:
        super().__init__()
        self.conv1 = ConvBNReLUSeq(cin + skip, cout)
        self.conv2 = ConvBNReLUSeq(cout, cout)

    def forward(
        self, x: torch.Tensor, size: tuple[int, int], skip: torch.Tensor | None
    ) -> torch.Tensor:
        """One decoder step."""
        x = F.interpolate(x, size=size, mode="nearest")
        if skip is not None:
            x = torch.cat([x, skip], dim=1)
        return self.conv2(self.conv1(x))


class _UNetCore(nn.Module):
    def __init__(self, levels: Sequence[int], channels: Sequence[int]) -> None:
        super().__init__()
        rev = list(levels)[::-1]  # deepest first
        ins = [rev[0], *channels[:-1]]
        skips = [*rev[1:], 0]
        self.blocks = nn.ModuleList(
            UNetBlock(i, s, o) for i, s, o in zip(ins, skips, channels, strict=True)
        )


class UNetDecoder(nn.Module):
    """The UNet decoder of the burn-scar and crop fine-tunes (segmentation-models-pytorch 0.5).

    smp 0.5 resizes each step to the *next feature's* size; TerraTorch feeds the H/4 level
    twice, so the last step (no skip) stays at H/4 and the output is ``channels[-1]`` at H/4.
    (smp 0.3 upsampled x2 per step and would end at H/2: the semantics, not just the weights,
    are pinned.) Keys: ``decoder.blocks.{i}.conv{1,2}.{0,1}``.
    """

    def __init__(self, levels: Sequence[int], channels: Sequence[int]) -> None:
        super().__init__()
        self.decoder = _UNetCore(levels, channels)
        self.out_channels = channels[-1]

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        """Pyramid (shallowest first) -> (B, channels[-1], H/4, W/4)."""
        sizes = [f.shape[2:] for f in [features[0], *features]][::-1]
        deep = features[::-1]
        x = deep[0]
        for i, block in enumerate(self.decoder.blocks):
            skip = deep[i + 1] if i + 1 < len(deep) else None
            x = block(x, tuple(sizes[i + 1]), skip)
        return x


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
        decoder: str = "upernet",
        decoder_channels: int | Sequence[int] = 256,
        head_dropout: float = 0.1,
        **encoder_kwargs: object,
    ) -> None:
        super().__init__()
        self.encoder = PrithviViT(**encoder_kwargs)  # type: ignore[arg-type]
        self.feature_indices = tuple(feature_indices)
        c = self.encoder.embed_dim * self.encoder.grid[0]
        self.neck: nn.Module | None = None
        if decoder == "upernet":
            if not isinstance(decoder_channels, int):
                raise TypeError(f"UperNet takes one channel count, got {decoder_channels!r}")
            self.decoder: nn.Module = UperNetDecoder(c, decoder_channels)
            head_in = decoder_channels
        elif decoder == "unet":
            channels = [decoder_channels] if isinstance(decoder_channels, int) else decoder_channels
            pyramid = ScalePyramid(c)
            # TerraTorch's necks: SelectIndices, ReshapeTokensToImage (no weights), pyramid
            self.neck = nn.Sequential(nn.Identity(), nn.Identity(), pyramid)
            self.decoder = UNetDecoder(pyramid.levels, list(channels))
            head_in = list(channels)[-1]
        else:
            raise TypeError(f"unknown decoder {decoder!r}; use 'upernet' or 'unet'")
        self.head = SegmentationHead(head_in, num_classes, head_dropout)
        self.num_classes = num_classes
        self.decoder_kind = decoder

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
        if isinstance(self.neck, nn.Sequential):
            pyramid = self.neck[2]
            assert isinstance(pyramid, ScalePyramid)
            maps = pyramid.pyramid(maps)
        logits = self.head(self.decoder(maps))
        logits = F.interpolate(logits, size=x.shape[-2:], mode="bilinear")
        return logits[..., top : top + h, left : left + w]


def _reflect_pad(x: torch.Tensor, pads: tuple[int, int, int, int]) -> torch.Tensor:
    if x.ndim == 5:
        b, c, t, hh, ww = x.shape
        flat = F.pad(x.reshape(b, c * t, hh, ww), pads, mode="reflect")
        return flat.reshape(b, c, t, *flat.shape[-2:])
    return F.pad(x, pads, mode="reflect")
