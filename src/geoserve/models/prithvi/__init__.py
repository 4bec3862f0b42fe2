"""Prithvi encoders, decoders and checkpoint loading (see docs/models.md)."""

from geoserve.models.prithvi.checkpoint import load_checkpoint, normalize_keys
from geoserve.models.prithvi.encoder import PrithviViT
from geoserve.models.prithvi.mae import PrithviMAE
from geoserve.models.prithvi.segmentation import PrithviSegmentation
from geoserve.models.prithvi.variants import VARIANTS, encoder_kwargs

__all__ = [
    "VARIANTS",
    "PrithviMAE",
    "PrithviSegmentation",
    "PrithviViT",
    "encoder_kwargs",
    "load_checkpoint",
    "normalize_keys",
]
