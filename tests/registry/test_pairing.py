"""The engine refuses a model that lacks a processor or disagrees with it."""

import pytest
import torch

from geoserve import INPUT_REGISTRY, Engine, GeoTiffPatcher
from geoserve.errors import ProcessorMismatchError, RegistryError
from geoserve.processors import SegmentationReassembler


class Echo(torch.nn.Module):
    def forward(self, x):
        return x


@pytest.mark.parametrize(
    ("input_processor", "output_processor", "match"),
    [
        pytest.param(
            GeoTiffPatcher(patch_size=8),
            None,
            "'mismatched' has no output processor;",
            id="no-output-processor",
        ),
        pytest.param(
            None,
            None,
            "has no input processor and no output processor;",
            id="no-processor-at-all",
        ),
        pytest.param(
            GeoTiffPatcher(bands=(0, 1), patch_size=8),
            SegmentationReassembler(classes=("a", "b", "c")),
            "returns 2 channels .* expects 3",
            id="channel-count-found-at-startup",
        ),
    ],
)
def test_model_that_disagrees_with_its_processors_is_refused(
    register_model, input_processor, output_processor, match
):
    register_model("mismatched", Echo, input_processor, output_processor)
    with pytest.raises(ProcessorMismatchError, match=match):
        Engine("mismatched")


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
