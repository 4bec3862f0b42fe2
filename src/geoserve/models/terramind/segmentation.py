"""TerraMind segmentation fine-tunes as TerraTorch's ``EncoderDecoderFactory`` builds them.

encoder (:class:`TerraMindEncoder`) -> necks -> UperNet or UNet decoder -> head, run like
TerraTorch's ``PixelWiseModel``: every modality is reflect-padded (split evenly on both sides)
to a multiple of 32 px, the logits are resized bilinearly to the padded size if the decoder
ends smaller, and the centre is cropped back to the input size.

Necks are TerraTorch's, by name and in the config's order, so their checkpoint keys line up
(``neck.2.fpn1.0``): ``SelectIndices``, ``ReshapeTokensToImage`` (TerraMind has no CLS token,
so ``remove_cls_token`` changes nothing: TerraTorch itself falls back to keeping every token),
``LearnedInterpolateToPyramidal``, ``InterpolateToPyramidal`` and ``MaxpoolToPyramidal``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from einops import rearrange
from torch import nn

from geoserve.errors import ConfigError
from geoserve.models.decoders import ScalePyramid, SegmentationHead, UNetDecoder, UperNet
from geoserve.models.terramind.encoder import TerraMindEncoder

NECKS = (
    "SelectIndices",
    "ReshapeTokensToImage",
    "LearnedInterpolateToPyramidal",
    "InterpolateToPyramidal",
    "MaxpoolToPyramidal",
)
DECODERS = ("UperNetDecoder", "UNetDecoder")
#: Largest factor a pyramid neck scales a map by (TerraTorch's configs: 2**4 over 4 layers).
MAX_SCALE = 64
_MODES = ("nearest", "nearest-exact", "bilinear", "bicubic", "area")


class SelectIndices(nn.Module):
    """Keep the features of the given layers."""

    def __init__(self, indices: Sequence[int]) -> None:
        super().__init__()
        self.indices = list(indices)

    def forward(self, features: list[torch.Tensor]) -> list[torch.Tensor]:
        """Select."""
        return [features[i] for i in self.indices]


class TokensToImage(nn.Module):
    """(B, N, D) tokens -> (B, D, h, w) maps on the token grid of the (padded) input."""

    def forward(self, features: list[torch.Tensor], grid: tuple[int, int]) -> list[torch.Tensor]:
        """Reshape each token sequence onto the ``grid`` (h, w) of tokens."""
        h, w = grid
        return [
            f if f.ndim >= 4 else rearrange(f, "b (h w) e -> b e h w", h=h, w=w) for f in features
        ]


class Resample(nn.Module):
    """``InterpolateToPyramidal`` (nearest up-scaling) or ``MaxpoolToPyramidal``."""

    def __init__(self, kind: str, factor: int = 2, mode: str = "nearest") -> None:
        super().__init__()
        self.kind, self.factor, self.mode = kind, factor, mode

    def forward(self, features: list[torch.Tensor]) -> list[torch.Tensor]:
        """Make a pyramid from same-size maps."""
        n = len(features)
        if self.kind == "InterpolateToPyramidal":
            return [
                F.interpolate(f, scale_factor=self.factor ** (n - i), mode=self.mode)
                for i, f in enumerate(features)
            ]
        return [f if i == 0 else F.max_pool2d(f, self.factor**i) for i, f in enumerate(features)]


def build_necks(
    necks: Sequence[Mapping[str, Any]], channels: list[int]
) -> tuple[nn.Sequential, list[int]]:
    """TerraTorch's neck list -> modules and the channel list after them.

    Raises:
        ValueError: an unknown neck, or arguments it does not take.
    """
    mods: list[nn.Module] = []
    for spec in necks:
        name = spec.get("name")
        args = {k: v for k, v in spec.items() if k != "name"}
        if name == "SelectIndices":
            indices = list(args.pop("indices"))
            channels = [channels[i] for i in indices]
            mods.append(SelectIndices(indices))
        elif name == "ReshapeTokensToImage":
            args.pop("remove_cls_token", None)
            if args.pop("effective_time_dim", 1) != 1:
                raise ValueError("ReshapeTokensToImage: TerraMind has no time dimension")
            mods.append(TokensToImage())
        elif name == "LearnedInterpolateToPyramidal":
            if len(channels) != 4 or len(set(channels)) != 1:
                raise ValueError(
                    f"LearnedInterpolateToPyramidal needs 4 maps of one width, got {channels}"
                )
            pyramid = ScalePyramid(channels[0])
            channels = list(pyramid.levels)
            mods.append(pyramid)
        elif name == "InterpolateToPyramidal":
            factor = _factor(name, args.pop("scale_factor", 2), len(channels))
            mode = args.pop("mode", "nearest")
            if mode not in _MODES:
                raise ValueError(f"{name}: mode {mode!r} is not one of {', '.join(_MODES)}")
            mods.append(Resample(name, factor, mode))
        elif name == "MaxpoolToPyramidal":
            kernel = _factor(name, args.pop("kernel_size", 2), len(channels) - 1)
            mods.append(Resample(name, kernel))
        else:
            raise ValueError(f"neck {name!r} is not supported; supported: {', '.join(NECKS)}")
        if args:
            raise ValueError(f"neck {name}: unsupported arguments {sorted(args)}")
    return nn.Sequential(*mods), channels


def _factor(neck: str, value: Any, levels: int) -> int:
    """A pyramid neck's step, checked: its largest power (``levels``) at most :data:`MAX_SCALE`.

    Raises:
        ValueError: not a positive integer, or one that would make the maps too large.
    """
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{neck}: the scale must be a positive integer, not {value!r:.40}")
    if value ** max(levels, 0) > MAX_SCALE:
        raise ValueError(
            f"{neck}: {value} over {levels} levels scales the maps {value}**{levels} times; "
            f"at most {MAX_SCALE} (select fewer layers first with SelectIndices)"
        )
    return value


class TerraMindSegmentation(nn.Module):
    """TerraMind encoder + necks + decoder + head: modality dict -> logits (B, classes, H, W).

    Args:
        encoder: The encoder's arguments (:class:`TerraMindEncoder`), or the encoder itself
            (a TiM backbone: :class:`~geoserve.models.terramind.tim.TerraMindTiMEncoder`).
        necks: TerraTorch's neck list (dicts with ``name`` and arguments).
        decoder: ``UperNetDecoder`` or ``UNetDecoder``.
        decoder_args: ``channels`` (an int for UperNet, a list for UNet), and for UperNet
            ``pool_scales`` and ``align_corners``.
        num_classes: Output classes.
        head_args: ``dropout`` and ``channel_list`` of the segmentation head.
    """

    def __init__(
        self,
        encoder: Mapping[str, Any] | TerraMindEncoder,
        *,
        necks: Sequence[Mapping[str, Any]],
        decoder: str,
        num_classes: int,
        decoder_args: Mapping[str, Any] | None = None,
        head_args: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.encoder = (
            encoder if isinstance(encoder, TerraMindEncoder) else TerraMindEncoder(**encoder)
        )
        self.neck, levels = build_necks(necks, list(self.encoder.out_channels))
        if not any(isinstance(m, TokensToImage) for m in self.neck):
            raise ValueError("the necks must include ReshapeTokensToImage (tokens to maps)")
        args = dict(decoder_args or {})
        if decoder == "UperNetDecoder":
            self.decoder: nn.Module = UperNet(
                levels,
                args.pop("channels", 256),
                tuple(args.pop("pool_scales", (1, 2, 3, 6))),
                args.pop("align_corners", True),
            )
        elif decoder == "UNetDecoder":
            channels = list(args.pop("channels"))
            if len(channels) != len(levels):
                raise ValueError(f"UNetDecoder: {len(channels)} channels for {len(levels)} maps")
            self.decoder = UNetDecoder(levels, channels)
        else:
            raise ValueError(f"decoder {decoder!r} is not supported; supported: {DECODERS}")
        if args:
            raise ValueError(f"{decoder}: unsupported arguments {sorted(args)}")
        head = dict(head_args or {})
        self.head = SegmentationHead(
            self.decoder.out_channels,  # type: ignore[arg-type]
            num_classes,
            head.pop("dropout", 0.0),
            head.pop("channel_list", None),
        )
        if head:
            raise ValueError(f"segmentation head: unsupported arguments {sorted(head)}")
        self.num_classes = num_classes
        self.decoder_kind = decoder

    @property
    def modalities(self) -> list[str]:
        """The modality names the model takes."""
        return self.encoder.modalities

    def forward(self, x: Mapping[str, torch.Tensor] | torch.Tensor) -> torch.Tensor:
        """Class logits at the input's size; a bare tensor is the first modality."""
        return self._run(x, None)[0]

    def forward_with_tokens(
        self, x: Mapping[str, torch.Tensor] | torch.Tensor, *, layer: int = -1
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The logits, and layer ``layer``'s merged tokens (B, D, H / 16, W / 16).

        The tokens are the encoder's output after the modalities are merged (mean, max or
        concatenated), the last layer normed: what the decoder's necks take.
        """
        logits, tokens = self._run(x, layer)
        assert tokens is not None
        return logits, tokens

    def _run(
        self, x: Mapping[str, torch.Tensor] | torch.Tensor, layer: int | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if isinstance(x, torch.Tensor):
            x = {self.modalities[0]: x}
        # (ints: traced for a converted model, a shape's entries are tensors, never equal)
        sizes = {(int(t.shape[-2]), int(t.shape[-1])) for t in x.values()}
        if len(sizes) != 1:
            raise ValueError(f"modalities must share one size, got {sorted(sizes)}")
        h, w = sizes.pop()
        pad_h, pad_w = (-h) % 32, (-w) % 32
        top, left = pad_h // 2, pad_w // 2
        if pad_h or pad_w:
            pads = (left, pad_w - left, top, pad_h - top)
            x = {m: F.pad(t, pads, mode="reflect") for m, t in x.items()}
        hp, wp = h + pad_h, w + pad_w
        features = self.encoder(x)
        tokens = None
        if layer is not None:
            n = len(features)
            if not -n <= layer < n:
                raise ConfigError(
                    f"embedding_layer {layer}: the encoder has {n} layers (0 to {n - 1}, or -1 "
                    "for the last)"
                )
            if pad_h or pad_w:  # the token grid would not line up with the input's pixels
                raise ConfigError(
                    f"embeddings from this model need patches of a multiple of 32 pixels "
                    f"(got {h} x {w})"
                )
            tokens = rearrange(features[layer], "b (h w) d -> b d h w", h=hp // 16, w=wp // 16)
        for neck in self.neck:
            if isinstance(neck, TokensToImage):
                features = neck(features, (hp // 16, wp // 16))
            else:
                features = neck(features)
        logits = self.head(self.decoder(features))
        if logits.shape[-2:] != (hp, wp):
            logits = F.interpolate(logits, size=(hp, wp), mode="bilinear")
        return logits[..., top : top + h, left : left + w], tokens
