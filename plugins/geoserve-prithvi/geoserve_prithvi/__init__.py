"""Prithvi models for geoserve.

Each model is a factory taking the local weights path; the checkpoint layout (Lightning
fine-tune, v2 pretrained, v1 bare, TerraTorch <= 0.99.7) and the architecture are read from
the file and from a ``config.json``/``config.yaml`` beside it.

Import only geoserve's public modules here (registries, processors, models).
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from geoserve.errors import WeightsError
from geoserve.models import load_checkpoint
from geoserve.models.prithvi import PrithviMAE, PrithviSegmentation
from geoserve.models.prithvi.variants import (
    PRITHVI_BANDS,
    S2_L1C_PRITHVI_INDICES,
    SEN1FLOODS11_MEAN,
    SEN1FLOODS11_STD,
    V1_MEAN,
    V1_STD,
)
from geoserve.processors import GeoTiffPatcher, RawReassembler, SegmentationReassembler
from geoserve.registry import INPUT_REGISTRY, MODEL_REGISTRY, OUTPUT_REGISTRY

HF = "https://huggingface.co/ibm-nasa-geospatial"
HLS_6 = (0, 1, 2, 3, 4, 5)


def _load(weights: str | Path, kind: type[nn.Module], name: str) -> nn.Module:
    model = load_checkpoint(weights)
    if not isinstance(model, kind):
        raise WeightsError(
            f"{weights}: holds a {type(model).__name__}, but model {name!r} needs a "
            f"{kind.__name__} checkpoint"
        )
    return model


@MODEL_REGISTRY.register_model(
    "prithvi-eo2-300m-tl-sen1floods11",
    description="Prithvi-EO-2.0-300M-TL fine-tuned on Sen1Floods11: water map",
    weights_required=True,
    loads_weights=True,
    weights_hint=(
        f"Prithvi-EO-V2-300M-TL-Sen1Floods11.pt from {HF}/Prithvi-EO-2.0-300M-TL-Sen1Floods11, "
        "downloaded on a machine that can reach it"
    ),
)
@INPUT_REGISTRY.register_input_processor(
    GeoTiffPatcher(
        bands=S2_L1C_PRITHVI_INDICES,
        bands_by_count={13: S2_L1C_PRITHVI_INDICES, 6: HLS_6},
        scale_factor=1e-4,
        mean=SEN1FLOODS11_MEAN,
        std=SEN1FLOODS11_STD,
        patch_size=512,
        stride=448,
        blend="center",
        coords=("location",),
    )
)
@OUTPUT_REGISTRY.register_output_processor(
    SegmentationReassembler(
        classes=("not water", "water"), colors=((230, 230, 220), (31, 120, 220))
    )
)
def sen1floods11(weights: str | Path) -> nn.Module:
    """Prithvi-EO-2.0-300M-TL Sen1Floods11 (UperNet) from a local checkpoint."""
    model = _load(weights, PrithviSegmentation, "prithvi-eo2-300m-tl-sen1floods11")
    if model.num_classes != 2:  # type: ignore[union-attr]
        raise WeightsError(f"{weights}: has {model.num_classes} classes; Sen1Floods11 has 2")
    return model


@MODEL_REGISTRY.register_model(
    "prithvi-eo1-100m",
    description="Prithvi-EO-1.0-100M MAE: reconstruction of 3 HLS dates",
    weights_required=True,
    loads_weights=True,
    weights_hint=(
        f"Prithvi_EO_V1_100M.pt from {HF}/Prithvi-EO-1.0-100M, downloaded on a machine "
        "that can reach it"
    ),
)
@INPUT_REGISTRY.register_input_processor(
    GeoTiffPatcher(
        bands=HLS_6,
        mean=V1_MEAN,
        std=V1_STD,
        patch_size=224,
        stride=224,
        blend="none",
        num_frames=3,
    )
)
@OUTPUT_REGISTRY.register_output_processor(
    RawReassembler(
        band_names=tuple(f"t{t}_{b}" for t in range(3) for b in PRITHVI_BANDS),
        multiply=V1_STD,
        add=V1_MEAN,
    )
)
def eo1_100m(weights: str | Path) -> nn.Module:
    """Prithvi-EO-1.0-100M masked autoencoder, run without masking."""
    return _load(weights, PrithviMAE, "prithvi-eo1-100m")


def register() -> None:
    """Entry point: the decorators above ran when this module was imported."""
