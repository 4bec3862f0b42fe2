"""Input and output processors: the interfaces and geoserve's built-in implementations."""

from geoserve.processors.base import (
    OUTPUT_KINDS,
    InputProcessor,
    OutputKind,
    OutputProcessor,
    PatchRow,
    RasterContext,
)
from geoserve.processors.multimodal import Modality, MultimodalPatcher
from geoserve.processors.patcher import GeoTiffPatcher
from geoserve.processors.reassemblers import RawReassembler, SegmentationReassembler

__all__ = [
    "OUTPUT_KINDS",
    "GeoTiffPatcher",
    "InputProcessor",
    "Modality",
    "MultimodalPatcher",
    "OutputKind",
    "OutputProcessor",
    "PatchRow",
    "RasterContext",
    "RawReassembler",
    "SegmentationReassembler",
]
