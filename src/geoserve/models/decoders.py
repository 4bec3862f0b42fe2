"""Decoders and heads shared by the ViT fine-tunes (Prithvi, TerraMind).

The layers of TerraTorch's ``UperNetDecoder``, ``UNetDecoder`` (segmentation-models-pytorch 0.5's
UNet), ``LearnedInterpolateToPyramidal`` neck and ``SegmentationHead``, with the module and
parameter names of TerraTorch checkpoints (``decoder.psp_modules.0.1.conv``,
``decoder.decoder.blocks.0.conv1.0``, ``neck.2.fpn1.0``, ``head.head.2``...). Dropout is
inference-irrelevant and kept only for the key layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn


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

    def forward(self, features: list[torch.Tensor]) -> list[torch.Tensor]:
        """The pyramid (TerraTorch's ``LearnedInterpolateToPyramidal`` neck)."""
        return self.pyramid(features)


class UperNet(nn.Module):
    """UperNet over a feature pyramid (TerraTorch's ``UperNetDecoder``, after mmseg).

    ``levels`` are the channel counts of the pyramid, shallowest first: PPM on the last level,
    lateral and FPN convs on the others, bilinear resizing (``align_corners`` as configured,
    ``True`` by default); the output is ``channels`` wide at the first level's size.
    """

    def __init__(
        self,
        levels: Sequence[int],
        channels: int = 256,
        pool_scales: Sequence[int] = (1, 2, 3, 6),
        align_corners: bool = True,
    ) -> None:
        super().__init__()
        levels = list(levels)
        self.align_corners = align_corners
        self.psp_modules = nn.ModuleList(
            nn.Sequential(nn.AdaptiveAvgPool2d(s), ConvBNReLU(levels[-1], channels, 1))
            for s in pool_scales
        )
        self.bottleneck = ConvBNReLU(levels[-1] + len(pool_scales) * channels, channels, 3, 1)
        self.lateral_convs = nn.ModuleList(ConvBNReLU(lv, channels, 1) for lv in levels[:-1])
        self.fpn_convs = nn.ModuleList(ConvBNReLU(channels, channels, 3, 1) for _ in levels[:-1])
        self.fpn_bottleneck = ConvBNReLU(len(levels) * channels, channels, 3, 1)
        self.out_channels = channels

    def _resize(self, x: torch.Tensor, size: Any) -> torch.Tensor:
        return F.interpolate(x, size=size, mode="bilinear", align_corners=self.align_corners)

    def decode(self, pyramid: list[torch.Tensor]) -> torch.Tensor:
        """The pyramid (shallowest first) -> (B, channels, h0, w0)."""
        top = pyramid[-1]
        pooled = [self._resize(m(top), top.shape[2:]) for m in self.psp_modules]
        laterals = [conv(pyramid[i]) for i, conv in enumerate(self.lateral_convs)]
        laterals.append(self.bottleneck(torch.cat([top, *pooled], dim=1)))
        for i in range(len(laterals) - 1, 0, -1):
            laterals[i - 1] = laterals[i - 1] + self._resize(laterals[i], laterals[i - 1].shape[2:])
        outs = [conv(laterals[i]) for i, conv in enumerate(self.fpn_convs)]
        outs.append(laterals[-1])
        size = outs[0].shape[2:]
        outs = [outs[0]] + [self._resize(o, size) for o in outs[1:]]
        return self.fpn_bottleneck(torch.cat(outs, dim=1))

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        """Decode a pyramid."""
        return self.decode(features)


class UperNetDecoder(UperNet):
    """UperNet with the scale modules inside (TerraTorch 1.1's ``decoder_scale_modules``).

    Four same-size ViT maps of ``in_channels`` -> (B, channels, 4h, 4w); keys ``fpn1..4`` as
    in the Prithvi Sen1Floods11 checkpoint.
    """

    def __init__(
        self,
        in_channels: int,
        channels: int = 256,
        pool_scales: Sequence[int] = (1, 2, 3, 6),
    ) -> None:
        scales = ScalePyramid(in_channels)
        super().__init__(scales.levels, channels, pool_scales)
        for name in ("fpn1", "fpn2", "fpn3", "fpn4"):
            self.add_module(name, getattr(scales, name))

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        """Four (B, C, h, w) maps at the token grid -> (B, channels, 4h, 4w)."""
        pyramid = [getattr(self, f"fpn{i + 1}")(f) for i, f in enumerate(features)]
        return self.decode(pyramid)


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
    """Optional 3x3 conv-ReLU blocks, dropout, then a 1x1 conv (``head.2``, as in TerraTorch)."""

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        dropout: float = 0.0,
        channel_list: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        pre: nn.Module = nn.Identity()
        if channel_list:
            chans = [in_channels, *channel_list]
            pre = nn.Sequential(
                *(
                    nn.Sequential(nn.Conv2d(chans[i], chans[i + 1], 3, padding=1), nn.ReLU())
                    for i in range(len(chans) - 1)
                )
            )
            in_channels = chans[-1]
        self.head = nn.Sequential(
            pre,
            nn.Dropout(dropout) if dropout else nn.Identity(),
            nn.Conv2d(in_channels, num_classes, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Per-pixel class logits."""
        return self.head(x)


def reflect_pad(x: torch.Tensor, pads: tuple[int, int, int, int]) -> torch.Tensor:
    """Reflect-pad the last two dimensions of a (B, C, H, W) or (B, C, T, H, W) tensor."""
    if x.ndim == 5:
        b, c, t, hh, ww = x.shape
        flat = F.pad(x.reshape(b, c * t, hh, ww), pads, mode="reflect")
        return flat.reshape(b, c, t, *flat.shape[-2:])
    return F.pad(x, pads, mode="reflect")
