"""Raster I/O and geometry: opening inputs, the patch grid, writing outputs (no torch here)."""

from geoserve.raster.bands import resolve_bands
from geoserve.raster.grid import BLEND_MODES, BlendMode, PatchGrid, reflect_indices
from geoserve.raster.source import (
    RasterArray,
    RasterInfo,
    RasterLike,
    RasterSource,
    open_raster,
)
from geoserve.raster.write import OutputRaster, geotiff_bytes, write_geotiff

__all__ = [
    "BLEND_MODES",
    "BlendMode",
    "OutputRaster",
    "PatchGrid",
    "RasterArray",
    "RasterInfo",
    "RasterLike",
    "RasterSource",
    "geotiff_bytes",
    "open_raster",
    "reflect_indices",
    "resolve_bands",
    "write_geotiff",
]
