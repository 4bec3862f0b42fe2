"""TerraMind (IBM/ESA) v1: the encoder and its TerraTorch segmentation fine-tunes."""

from geoserve.models.terramind.checkpoint import load_terramind
from geoserve.models.terramind.encoder import TerraMindEncoder
from geoserve.models.terramind.segmentation import TerraMindSegmentation

__all__ = ["TerraMindEncoder", "TerraMindSegmentation", "load_terramind"]
