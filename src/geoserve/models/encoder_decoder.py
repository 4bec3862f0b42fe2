"""timm / SMP encoder-decoders of TerraTorch fine-tunes: built from the config, loaded strictly.

The network is built with the same library calls TerraTorch 1.2.13's factories make (its
registries only pick which call), so its layers, their names and its forward pass are
TerraTorch's:

- ``SMPModelFactory``: ``getattr(smp, model)(encoder_name=backbone, encoder_weights=None,
  in_channels=..., classes=num_classes, **smp_kwargs)`` inside :class:`SMPSegmentation`
  (TerraTorch's ``SMPModelWrapper``: keys ``smp_model.``; logits resized bilinearly to the
  input's size when they differ);
- ``EncoderDecoderFactory``: ``timm.create_model(name, features_only=True, pretrained=False,
  **backbone_kwargs)`` (what TerraTorch's timm registry calls; its wrapper adopts the feature
  model's modules, so keys are ``encoder.<timm names>``), a decoder from
  :mod:`geoserve.models.decoders` and the segmentation head, run as TerraTorch's
  ``PixelWiseModel`` runs them (:class:`EncoderDecoderSegmentation`).

No weights are downloaded (``encoder_weights=None``, ``pretrained=False``): they come from the
checkpoint, whose Lightning ``model.`` prefix is dropped before a strict load
(:func:`load_fine_tune`). Any band count works: the first convolution is built for
``in_channels``, as the factories build it.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from geoserve.errors import WeightsError
from geoserve.models.decoders import DECODER_CLASSES, SegmentationHead
from geoserve.models.state_dict import load_strict, read_state_dict
from geoserve.models.terratorch_config import FineTune, NetworkSpec, read_fine_tune

#: smp arguments the factory sets itself (an ``smp_`` key may not replace them).
_SMP_RESERVED = ("encoder_name", "encoder_weights", "in_channels", "classes", "aux_params")
#: Checkpoint entries of training only: auxiliary heads, loss weights, metrics.
_TRAINING_ONLY = ("aux_heads.", "criterion.", "loss", "train_metrics", "val_metrics",
                  "test_metrics")  # fmt: skip


class SMPSegmentation(nn.Module):
    """An smp segmentation model as TerraTorch's ``SMPModelWrapper`` runs it."""

    def __init__(self, smp_model: nn.Module, num_classes: int, rescale: bool = True) -> None:
        super().__init__()
        self.smp_model = smp_model
        self.num_classes = num_classes
        self.rescale = rescale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> logits (B, classes, H, W)."""
        out = self.smp_model(x)
        if isinstance(out, tuple):  # with an auxiliary classification head
            out = out[0]
        if self.rescale and out.shape[-2:] != x.shape[-2:]:
            out = F.interpolate(out, size=x.shape[-2:], mode="bilinear")
        return out


class EncoderDecoderSegmentation(nn.Module):
    """timm encoder, decoder, head, run as TerraTorch's ``PixelWiseModel`` runs them.

    A backbone with a ``patch_size`` (none of the CNNs here) gets its input reflect-padded to
    a multiple of twice that and the logits cropped back, as TerraTorch does.
    """

    def __init__(
        self,
        encoder: nn.Module,
        decoder: nn.Module,
        head: nn.Module,
        *,
        num_classes: int,
        select_indices: tuple[int, ...] | None = None,
        rescale: bool = True,
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.head = head
        self.num_classes = num_classes
        self.select_indices = select_indices
        self.rescale = rescale
        self.patch_size = _patch_size(encoder)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> logits (B, classes, H, W)."""
        h, w = x.shape[-2:]
        if self.patch_size:
            p = 2 * self.patch_size
            pad_h, pad_w = (-h) % p, (-w) % p
            if pad_h or pad_w:
                pads = (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2)
                x = F.pad(x, pads, mode="reflect")
        features = list(self.encoder(x))
        if self.select_indices is not None:
            features = [features[i] for i in self.select_indices]
        mask = self.head(self.decoder([f.clone() for f in features]))
        if self.rescale and mask.shape[-2:] != x.shape[-2:]:
            mask = F.interpolate(mask, size=x.shape[-2:], mode="bilinear")
        top, left = max((mask.shape[-2] - h) // 2, 0), max((mask.shape[-1] - w) // 2, 0)
        return mask[..., top : top + h, left : left + w]  # TerraTorch's centre crop


def _patch_size(encoder: nn.Module) -> int | None:
    """The ``patch_size`` of the first of the encoder's modules with one, as TerraTorch's."""
    for module in encoder.modules():
        if hasattr(module, "patch_size"):
            size: Any = module.patch_size
            if size is None:
                return None
            return int(size if isinstance(size, int) else size[-1])
    return None


def build_network(spec: NetworkSpec, *, empty: bool = False) -> nn.Module:
    """The untrained network ``spec`` describes (eval mode).

    ``empty``: on the meta device (no memory, no initialisation: weights are assigned from
    a checkpoint next).

    Raises:
        WeightsError: smp or timm refuse the arguments (the message says why).
    """
    try:
        with torch.device("meta" if empty else "cpu"):
            build = _smp if spec.factory == "SMPModelFactory" else _encoder_decoder
            model = build(spec)
    except (TypeError, ValueError, RuntimeError, KeyError) as exc:
        raise WeightsError(f"cannot build {spec.describe()}: {exc}") from exc
    return model.eval()


def _smp(spec: NetworkSpec) -> nn.Module:
    import segmentation_models_pytorch as smp

    cls = getattr(smp, spec.decoder)
    params = inspect.signature(cls).parameters
    accepted = [
        k
        for k, p in params.items()
        if k not in _SMP_RESERVED and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    ]
    for key in spec.smp_kwargs:
        if key not in accepted:
            raise ValueError(
                f"smp_{key} is not an argument of smp.{spec.decoder}; it takes "
                f"{', '.join('smp_' + k for k in accepted)}"
            )
    model = cls(
        encoder_name=spec.encoder,
        encoder_weights=None,
        in_channels=spec.in_channels,
        classes=spec.num_classes,
        **spec.smp_kwargs,
    )
    return SMPSegmentation(model, spec.num_classes)


def _encoder_decoder(spec: NetworkSpec) -> nn.Module:
    import timm

    encoder = timm.create_model(
        spec.encoder, pretrained=False, features_only=True, **spec.backbone_kwargs
    )
    feature_info: Any = encoder.feature_info
    channels: list[int] = list(feature_info.channels())
    if spec.select_indices is not None:
        channels = [channels[i] for i in spec.select_indices]
    decoder: Any = DECODER_CLASSES[spec.decoder](channels, **spec.decoder_kwargs)
    head = SegmentationHead(int(decoder.out_channels), spec.num_classes, **spec.head_kwargs)
    return EncoderDecoderSegmentation(
        encoder,
        decoder,
        head,
        num_classes=spec.num_classes,
        select_indices=spec.select_indices,
        rescale=spec.rescale,
    )


def checkpoint_state(path: str | Path) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors under the network's own names.

    Lightning's leading ``model.`` is dropped and training-only entries (auxiliary heads,
    loss weights, metrics) left out.

    Raises:
        WeightsError: the file is missing or unreadable.
    """
    state = {}
    for key, value in read_state_dict(path).items():
        k = key[len("model.") :] if key.startswith("model.") else key
        if not k.startswith(_TRAINING_ONLY):
            state[k] = value
    return state


def load_fine_tune(weights: str | Path, config: str | Path | FineTune) -> nn.Module:
    """Build a fine-tune's network from its config and load its checkpoint strictly.

    Raises:
        WeightsError: unreadable or unsupported config (naming the file and what is
            supported), unreadable checkpoint, or keys and shapes that do not match (named).
    """
    fine_tune = config if isinstance(config, FineTune) else read_fine_tune(config)
    state = checkpoint_state(weights)
    try:  # built empty: initialising weights the checkpoint replaces costs seconds
        model = build_network(fine_tune.network, empty=True)
    except WeightsError as exc:
        raise WeightsError(f"{fine_tune.path}: {exc}") from exc
    load_strict(model, state, weights, assign=True)
    tensors = [*model.parameters(), *model.buffers()]
    if any(t.is_meta for t in tensors):  # a buffer no checkpoint holds: build it for real
        model = build_network(fine_tune.network)
        load_strict(model, state, weights)
    return model.eval()
