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

from geoserve.errors import ConfigError
from geoserve.models.decoders import (
    ScalePyramid,
    SegmentationHead,
    UNetDecoder,
    UperNetDecoder,
    reflect_pad,
)
from geoserve.models.prithvi.encoder import PrithviViT, layer_tokens

__all__ = ["PrithviSegmentation"]


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
        return self._run(x, temporal_coords, location_coords, None)[0]

    def forward_with_tokens(
        self,
        x: torch.Tensor,
        temporal_coords: torch.Tensor | None = None,
        location_coords: torch.Tensor | None = None,
        *,
        layer: int = -1,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The logits, and block ``layer``'s patch tokens (the embeddings kinds).

        Tokens are (B, D, H / 16, W / 16), averaged over time frames.
        """
        logits, tokens = self._run(x, temporal_coords, location_coords, layer)
        assert tokens is not None
        return logits, tokens

    def _run(
        self,
        x: torch.Tensor,
        temporal_coords: torch.Tensor | None,
        location_coords: torch.Tensor | None,
        layer: int | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        h, w = x.shape[-2:]
        multiple = 2 * self.encoder.patch_size[1]
        pad_h, pad_w = (-h) % multiple, (-w) % multiple
        top, left = pad_h // 2, pad_w // 2
        if pad_h or pad_w:
            x = reflect_pad(x, (left, pad_w - left, top, pad_h - top))
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
        tokens = None
        if layer is not None:
            if pad_h or pad_w:  # the token grid would not line up with the input's pixels
                raise ConfigError(
                    f"embeddings from this model need patches of a multiple of {multiple} "
                    f"pixels (got {h} x {w})"
                )
            tokens = layer_tokens(feats, layer, t, gh, gw)
        return logits[..., top : top + h, left : left + w], tokens
