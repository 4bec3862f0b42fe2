"""Decoders and the segmentation head of TerraTorch's ``EncoderDecoderFactory`` over CNN features.

Each takes the encoder's feature list (shallowest first) and keeps TerraTorch 1.2.13's module
names, so its checkpoints load as they are:

- :class:`UNetDecoder`: segmentation-models-pytorch's ``UnetDecoder`` (keys
  ``decoder.blocks.N``), fed the first feature twice as TerraTorch does, so the last block ends
  at the first feature's size;
- :class:`UperNetDecoder`: PPM on the deepest feature, lateral and FPN convs, bilinear resizing
  with ``align_corners`` (True by default), adapted by TerraTorch from MMSegmentation;
- :class:`SMPDecoder`: an smp decoder (``FPN``) built for the encoder's channels, under
  ``_smp_decoder`` as TerraTorch's ``SMPDecoderWrapper`` holds it;
- :class:`SegmentationHead`: optional 3x3 conv + ReLU blocks, dropout, 1x1 conv (``head.N``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn


class UNetDecoder(nn.Module):
    """smp's UNet decoder over all the encoder's features (TerraTorch's ``UNetDecoder``)."""

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


class ConvModule(nn.Module):
    """conv (no bias) -> BatchNorm -> ReLU; keys ``conv`` and ``norm``."""

    def __init__(self, cin: int, cout: int, kernel: int, padding: int = 0) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, padding=padding, bias=False)
        self.norm = nn.BatchNorm2d(cout)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the three layers."""
        return self.act(self.norm(self.conv(x)))


class UperNetDecoder(nn.Module):
    """UperNet over a feature pyramid of any depth (TerraTorch's ``UperNetDecoder``)."""

    def __init__(
        self,
        embed_dim: Sequence[int],
        pool_scales: Sequence[int] = (1, 2, 3, 6),
        channels: int = 256,
        align_corners: bool = True,
    ) -> None:
        super().__init__()
        top = embed_dim[-1]
        self.align_corners = align_corners
        self.psp_modules = nn.ModuleList(
            nn.Sequential(nn.AdaptiveAvgPool2d(s), ConvModule(top, channels, 1))
            for s in pool_scales
        )
        self.bottleneck = ConvModule(top + len(pool_scales) * channels, channels, 3, 1)
        self.lateral_convs = nn.ModuleList(ConvModule(c, channels, 1) for c in embed_dim[:-1])
        self.fpn_convs = nn.ModuleList(ConvModule(channels, channels, 3, 1) for _ in embed_dim[:-1])
        self.fpn_bottleneck = ConvModule(len(embed_dim) * channels, channels, 3, 1)
        self.out_channels = channels

    def _resize(self, x: torch.Tensor, size: Any) -> torch.Tensor:
        return F.interpolate(x, size=size, mode="bilinear", align_corners=self.align_corners)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        """Features (shallowest first) -> (B, channels, h0, w0)."""
        top = features[-1]
        pooled = [self._resize(m(top), top.shape[2:]) for m in self.psp_modules]
        laterals = [conv(features[i]) for i, conv in enumerate(self.lateral_convs)]
        laterals.append(self.bottleneck(torch.cat([top, *pooled], dim=1)))
        for i in range(len(laterals) - 1, 0, -1):
            laterals[i - 1] = laterals[i - 1] + self._resize(laterals[i], laterals[i - 1].shape[2:])
        outs = [conv(laterals[i]) for i, conv in enumerate(self.fpn_convs)]
        outs.append(laterals[-1])
        size = outs[0].shape[2:]
        outs = [outs[0]] + [self._resize(o, size) for o in outs[1:]]
        return self.fpn_bottleneck(torch.cat(outs, dim=1))


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


class SegmentationHead(nn.Module):
    """TerraTorch's segmentation head: ``head.0`` conv blocks, ``head.1`` dropout, ``head.2``."""

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        channel_list: Sequence[int] | None = None,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        pre: nn.Module = nn.Identity()
        if channel_list is not None:
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


#: Decoder classes by the name ``EncoderDecoderFactory`` configs give them.
DECODER_CLASSES: dict[str, type[nn.Module]] = {
    "UNetDecoder": UNetDecoder,
    "UperNetDecoder": UperNetDecoder,
    "FPN": SMPDecoder,
}
