"""The three registries a model author decorates a model with.

Example::

    @MODEL_REGISTRY.register_model("my-water-model")
    @INPUT_REGISTRY.register_input_processor(GeoTiffPatcher(bands=("B3", "B8"), patch_size=224))
    @OUTPUT_REGISTRY.register_output_processor(SegmentationReassembler(classes=("land", "water")))
    class MyWaterModel(torch.nn.Module): ...
"""

from geoserve.registry.base import Registry
from geoserve.registry.models import (
    InputRegistry,
    ModelRegistry,
    ModelSpec,
    OutputRegistry,
    factory_key,
)

MODEL_REGISTRY = ModelRegistry()
INPUT_REGISTRY = InputRegistry()
OUTPUT_REGISTRY = OutputRegistry()

__all__ = [
    "INPUT_REGISTRY",
    "MODEL_REGISTRY",
    "OUTPUT_REGISTRY",
    "InputRegistry",
    "ModelRegistry",
    "ModelSpec",
    "OutputRegistry",
    "Registry",
    "factory_key",
]
