"""Input and output processors: the interfaces and geoserve's built-in implementations."""

from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from geoserve.engine.canvas import Canvas as Canvas

__all__ = [
    "OUTPUT_KINDS",
    "Canvas",
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


def __getattr__(name: str) -> Any:
    # Canvas, the engine's stitching state, lives in geoserve.engine.canvas; still importable
    # from here as before (on first use: the engine package imports this one)
    if name == "Canvas":
        from geoserve.engine.canvas import Canvas

        return Canvas
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
