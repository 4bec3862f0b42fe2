"""The engine refuses a model that lacks a processor or disagrees with it."""

import pytest
import torch

from geoserve import INPUT_REGISTRY, MODEL_REGISTRY, OUTPUT_REGISTRY, Engine, GeoTiffPatcher
from geoserve.errors import ProcessorMismatchError, RegistryError
from geoserve.processors import SegmentationReassembler


@pytest.fixture
def cleanup():
    names: list[str] = []
    yield names
    for name in names:
        spec = MODEL_REGISTRY.remove(name)
        for reg in (INPUT_REGISTRY, OUTPUT_REGISTRY):
            if spec.key in reg:
                reg.remove(spec.key)


def test_model_without_output_processor_is_refused(cleanup):
    @MODEL_REGISTRY.register_model("half-model")
    @INPUT_REGISTRY.register_input_processor(GeoTiffPatcher(patch_size=8))
    class Half(torch.nn.Module):
        def forward(self, x):
            return x

    cleanup.append("half-model")
    with pytest.raises(ProcessorMismatchError, match="'half-model' has no output processor;"):
        Engine("half-model")


def test_model_without_any_processor_is_refused(cleanup):
    @MODEL_REGISTRY.register_model("bare-model")
    class Bare(torch.nn.Module):
        def forward(self, x):
            return x

    cleanup.append("bare-model")
    with pytest.raises(
        ProcessorMismatchError, match="has no input processor and no output processor;"
    ):
        Engine("bare-model")


def test_channel_mismatch_found_at_startup(cleanup):
    @MODEL_REGISTRY.register_model("wrong-classes")
    @INPUT_REGISTRY.register_input_processor(GeoTiffPatcher(bands=(0, 1), patch_size=8))
    @OUTPUT_REGISTRY.register_output_processor(SegmentationReassembler(classes=("a", "b", "c")))
    class TwoOut(torch.nn.Module):
        def forward(self, x):
            return x

    cleanup.append("wrong-classes")
    with pytest.raises(ProcessorMismatchError, match="returns 2 channels .* expects 3"):
        Engine("wrong-classes")


def test_processor_registered_twice_for_one_model_is_an_error():
    class Model(torch.nn.Module):
        pass

    deco = INPUT_REGISTRY.register_input_processor(GeoTiffPatcher(patch_size=8))
    deco(Model)
    try:
        with pytest.raises(RegistryError, match="already registered"):
            deco(Model)
    finally:
        INPUT_REGISTRY.remove(f"{Model.__module__}:{Model.__qualname__}")
