"""geoserve: a serving engine for image-to-image geospatial models.

Public API::

    from geoserve import Engine
    out = Engine("ndwi-water").generate_image("scene.tif", output_path="water.tif")
"""

from geoserve.engine import Engine
from geoserve.errors import GeoServeError
from geoserve.plugins import load_plugins
from geoserve.processors import GeoTiffPatcher, RawReassembler, SegmentationReassembler
from geoserve.raster import PatchGrid, RasterArray
from geoserve.registry import INPUT_REGISTRY, MODEL_REGISTRY, OUTPUT_REGISTRY
from geoserve.schemas import ImageOutput, ImageRequestOutput, StageTimings, TensorRequestOutput

__version__ = "0.1.0"

__all__ = [
    "INPUT_REGISTRY",
    "MODEL_REGISTRY",
    "OUTPUT_REGISTRY",
    "Engine",
    "GeoServeError",
    "GeoTiffPatcher",
    "ImageOutput",
    "ImageRequestOutput",
    "PatchGrid",
    "RasterArray",
    "RawReassembler",
    "SegmentationReassembler",
    "StageTimings",
    "TensorRequestOutput",
    "__version__",
    "load_plugins",
]
