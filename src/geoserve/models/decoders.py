"""Decoders and heads of TerraTorch's fine-tunes, shared by every family.

Prithvi, TerraMind and the timm / SMP encoder-decoders use the layers of TerraTorch's
``UperNetDecoder``, ``UNetDecoder`` (segmentation-models-pytorch 0.5's UNet),
``SMPDecoderWrapper`` (smp's FPN), ``LearnedInterpolateToPyramidal`` neck and
``SegmentationHead``, with the module and parameter names of TerraTorch checkpoints
(``decoder.psp_modules.0.1.conv``, ``decoder.decoder.blocks.0.conv1.0``, ``neck.2.fpn1.0``,
``head.head.2``...). Each takes the feature list shallowest first. Dropout is
inference-irrelevant and kept only for the key layout.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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


class UNetDecoder(nn.Module):
    """segmentation-models-pytorch 0.5's UNet decoder, as TerraTorch's ``UNetDecoder`` wraps it.

    TerraTorch feeds the first (shallowest) feature twice, so each block resizes (nearest) to
    the next feature's size and the last block, with no skip, stays at the first feature's
    size: ``channels[-1]`` wide at H/4 over a ViT pyramid. (smp 0.3 upsampled x2 per block and
    would end at H/2: the semantics, not just the weights, are pinned.) Keys:
    ``decoder.blocks.{i}.conv{1,2}.{0,1}``.
    """

    def __init__(
        self,
        embed_dim: Sequence[int],
        channels: Sequence[int],
        use_batchnorm: bool | str = "batchnorm",
        attention_type: str | None = None,
    ) -> None:
        from segmentation_models_pytorch.decoders.unet.decoder import UnetDecoder

        if len(embed_dim) != len(channels):
            raise ValueError(
                f"decoder_channels has {len(channels)} entries, but the encoder gives "
                f"{len(embed_dim)} features (one channel count per feature)"
            )
        super().__init__()
        self.decoder = UnetDecoder(
            encoder_channels=[embed_dim[0], *embed_dim],
            decoder_channels=list(channels),
            n_blocks=len(channels),
            use_norm=use_batchnorm,
            add_center_block=False,
            attention_type=attention_type,
        )
        self.out_channels = int(channels[-1])

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        """Features (shallowest first) -> (B, channels[-1], h0, w0)."""
        return self.decoder([features[0].clone(), *features])


class SMPDecoder(nn.Module):
    """smp's FPN decoder for the encoder's channels (TerraTorch's ``SMPDecoderWrapper``).

    TerraTorch builds ``smp.FPN`` around a stand-in encoder with the feature channels and depth
    ``len(channels) - 1`` and keeps its decoder; this builds that decoder with the arguments
    ``smp.FPN`` gives it.
    """

    def __init__(
        self,
        embed_dim: Sequence[int],
        decoder_pyramid_channels: int = 256,
        decoder_segmentation_channels: int = 128,
        decoder_merge_policy: str = "add",
        decoder_dropout: float = 0.2,
        decoder_interpolation: str = "nearest",
    ) -> None:
        from segmentation_models_pytorch.decoders.fpn.decoder import FPNDecoder

        super().__init__()
        self._smp_decoder = FPNDecoder(
            encoder_channels=list(embed_dim),
            encoder_depth=len(embed_dim) - 1,
            pyramid_channels=decoder_pyramid_channels,
            segmentation_channels=decoder_segmentation_channels,
            dropout=decoder_dropout,
            merge_policy=decoder_merge_policy,  # type: ignore[arg-type]
            interpolation_mode=decoder_interpolation,
        )
        self.out_channels = int(self._smp_decoder.out_channels)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        """Features (shallowest first) -> (B, out_channels, h1, w1)."""
        return self._smp_decoder(features)


def upernet_decoder(
    embed_dim: Sequence[int],
    pool_scales: Sequence[int] = (1, 2, 3, 6),
    channels: int = 256,
    align_corners: bool = True,
) -> UperNet:
    """:class:`UperNet` with TerraTorch's ``UperNetDecoder`` argument names and order."""
    return UperNet(embed_dim, channels, pool_scales, align_corners)


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


#: Decoders by the name ``EncoderDecoderFactory`` configs give them: ``(channels, **kwargs)``.
DECODER_CLASSES: dict[str, Callable[..., nn.Module]] = {
    "UNetDecoder": UNetDecoder,
    "UperNetDecoder": upernet_decoder,
    "FPN": SMPDecoder,
}


def reflect_pad(x: torch.Tensor, pads: tuple[int, int, int, int]) -> torch.Tensor:
    """Reflect-pad the last two dimensions of a (B, C, H, W) or (B, C, T, H, W) tensor."""
    if x.ndim == 5:
        b, c, t, hh, ww = x.shape
        flat = F.pad(x.reshape(b, c * t, hh, ww), pads, mode="reflect")
        return flat.reshape(b, c, t, *flat.shape[-2:])
    return F.pad(x, pads, mode="reflect")
