"""geoserve: a serving engine for image-to-image geospatial models.

Public API::

    from geoserve import Engine, EngineConfig
    out = Engine("ndwi-water").generate_image("scene.tif", output_path="water.tif")
    engine = Engine("demo-water", EngineConfig(max_batch_patches=32, cog=True))
    paths = Client("http://127.0.0.1:8000").run("scene.tif", "out")  # on a server, as a job

The names below are imported when first used, so ``import geoserve`` (and the command line's
``--help``, ``info`` and argument errors) do not pay for importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # (the redundant aliases mark them as re-exported)
    from geoserve.client import Client as Client
    from geoserve.config import EngineConfig as EngineConfig
    from geoserve.engine import Engine as Engine
    from geoserve.engine import RequestSpec as RequestSpec
    from geoserve.errors import GeoServeError as GeoServeError
    from geoserve.plugins import load_plugins as load_plugins
    from geoserve.processors import GeoTiffPatcher as GeoTiffPatcher
    from geoserve.processors import RawReassembler as RawReassembler
    from geoserve.processors import SegmentationReassembler as SegmentationReassembler
    from geoserve.raster import PatchGrid as PatchGrid
    from geoserve.raster import RasterArray as RasterArray
    from geoserve.registry import INPUT_REGISTRY as INPUT_REGISTRY
    from geoserve.registry import MODEL_REGISTRY as MODEL_REGISTRY
    from geoserve.registry import OUTPUT_REGISTRY as OUTPUT_REGISTRY
    from geoserve.schemas import ImageOutput as ImageOutput
    from geoserve.schemas import ImageRequestOutput as ImageRequestOutput
    from geoserve.schemas import StageTimings as StageTimings
    from geoserve.schemas import TensorRequestOutput as TensorRequestOutput
    from geoserve.stac_query import StacSearch as StacSearch
    from geoserve.stac_query import stac_search as stac_search

__version__ = "0.1.0"

#: public name -> the module that defines it
_HOMES = {
    "Client": "geoserve.client",
    "Engine": "geoserve.engine",
    "RequestSpec": "geoserve.engine",
    "EngineConfig": "geoserve.config",
    "GeoServeError": "geoserve.errors",
    "load_plugins": "geoserve.plugins",
    "GeoTiffPatcher": "geoserve.processors",
    "RawReassembler": "geoserve.processors",
    "SegmentationReassembler": "geoserve.processors",
    "PatchGrid": "geoserve.raster",
    "RasterArray": "geoserve.raster",
    "INPUT_REGISTRY": "geoserve.registry",
    "MODEL_REGISTRY": "geoserve.registry",
    "OUTPUT_REGISTRY": "geoserve.registry",
    "ImageOutput": "geoserve.schemas",
    "ImageRequestOutput": "geoserve.schemas",
    "StageTimings": "geoserve.schemas",
    "TensorRequestOutput": "geoserve.schemas",
    "StacSearch": "geoserve.stac_query",
    "stac_search": "geoserve.stac_query",
}

__all__ = sorted([*_HOMES, "__version__"])


if not TYPE_CHECKING:  # (so that mypy still reports a misspelt name)

    def __getattr__(name: str) -> Any:
        home = _HOMES.get(name)
        if home is None:  # a submodule, as `import geoserve; geoserve.errors` always allowed
            try:
                return importlib.import_module(f"geoserve.{name}")
            except ModuleNotFoundError as exc:
                if exc.name != f"geoserve.{name}":
                    raise  # the submodule exists but needs something not installed
                raise AttributeError(f"module 'geoserve' has no attribute {name!r}") from None
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value  # once imported, a plain attribute
        return value


def __dir__() -> list[str]:
    return sorted({*__all__, *(k for k in globals() if k.startswith("__"))})
