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
    BURN_SCARS_MEAN,
    BURN_SCARS_STD,
    CROP_CLASSES,
    CROPS_MEAN,
    CROPS_STD,
    HLS_SIX,
    PRITHVI_BANDS,
    S2_L1C_PRITHVI_INDICES,
    S2_L1C_STACK,
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


def _segmentation(weights: str | Path, name: str, decoder: str, classes: int) -> nn.Module:
    model = _load(weights, PrithviSegmentation, name)
    assert isinstance(model, PrithviSegmentation)
    if model.decoder_kind != decoder or model.num_classes != classes:
        raise WeightsError(
            f"{weights}: holds a {model.decoder_kind} model with {model.num_classes} classes, "
            f"but model {name!r} is a {decoder} model with {classes} classes"
        )
    return model


@MODEL_REGISTRY.register_model(
    "prithvi-eo2-300m-tl-sen1floods11",
    description="Prithvi-EO-2.0-300M-TL fine-tuned on Sen1Floods11: water map",
    input_description=f"{S2_L1C_STACK} or {HLS_SIX}, reflectance x 10000",
    weights_required=True,
    loads_weights=True,
    token_size=16,  # its encoder's patch tokens: the embeddings kinds
    weights_hint=(
        f"Prithvi-EO-V2-300M-TL-Sen1Floods11.pt from {HF}/Prithvi-EO-2.0-300M-TL-Sen1Floods11, "
        "downloaded on a machine that can reach it"
    ),
)
@INPUT_REGISTRY.register_input_processor(
    GeoTiffPatcher(
        bands=S2_L1C_PRITHVI_INDICES,
        band_roles=PRITHVI_BANDS,
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
    return _segmentation(weights, "prithvi-eo2-300m-tl-sen1floods11", "upernet", 2)


@MODEL_REGISTRY.register_model(
    "prithvi-eo1-100m",
    description="Prithvi-EO-1.0-100M MAE: reconstruction of 3 HLS dates",
    input_description=f"3 dates of one place, each {HLS_SIX}, reflectance x 10000",
    weights_required=True,
    loads_weights=True,
    token_size=16,  # its encoder's patch tokens: the embeddings kinds
    weights_hint=(
        f"Prithvi_EO_V1_100M.pt from {HF}/Prithvi-EO-1.0-100M, downloaded on a machine "
        "that can reach it"
    ),
)
@INPUT_REGISTRY.register_input_processor(
    GeoTiffPatcher(
        bands=HLS_6,
        band_roles=PRITHVI_BANDS,
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


@MODEL_REGISTRY.register_model(
    "prithvi-eo2-300m-burnscars",
    description="Prithvi-EO-2.0-300M fine-tuned on HLS burn scars (UNet): burn scar map",
    input_description=f"a chip of {HLS_SIX}, reflectance 0-1 as stored",
    weights_required=True,
    loads_weights=True,
    token_size=16,  # its encoder's patch tokens: the embeddings kinds
    weights_hint=(
        f"Prithvi_EO_V2_300M_BurnScars.pt from {HF}/Prithvi-EO-2.0-300M-BurnScars, "
        "downloaded on a machine that can reach it"
    ),
)
@INPUT_REGISTRY.register_input_processor(
    GeoTiffPatcher(
        bands=HLS_6,
        band_roles=PRITHVI_BANDS,
        mean=BURN_SCARS_MEAN,
        std=BURN_SCARS_STD,
        patch_size=512,
        stride=448,
        blend="center",
    )
)
@OUTPUT_REGISTRY.register_output_processor(
    SegmentationReassembler(
        classes=("not burned", "burn scar"), colors=((220, 220, 200), (200, 40, 20))
    )
)
def burnscars(weights: str | Path) -> nn.Module:
    """Prithvi-EO-2.0-300M burn scars (pyramid neck + UNet decoder)."""
    return _segmentation(weights, "prithvi-eo2-300m-burnscars", "unet", 2)


@MODEL_REGISTRY.register_model(
    "prithvi-eo2-300m-tl-crops",
    description="Prithvi-EO-2.0-300M-TL multi-temporal crop classification: 13 classes",
    input_description=f"3 dates of one place, each {HLS_SIX}, reflectance x 10000",
    weights_required=True,
    loads_weights=True,
    token_size=16,  # its encoder's patch tokens: the embeddings kinds
    weights_hint=(
        f"Prithvi_EO_V2_300M_TL_Crops.pt from {HF}/Prithvi-EO-2.0-300M-TL-Crops (or a "
        "TerraTorch fine-tune of it), downloaded on a machine that can reach it"
    ),
)
@INPUT_REGISTRY.register_input_processor(
    GeoTiffPatcher(
        bands=HLS_6,
        band_roles=PRITHVI_BANDS,
        mean=CROPS_MEAN,
        std=CROPS_STD,
        patch_size=224,
        stride=192,
        blend="center",
        num_frames=3,
        coords=True,
    )
)
@OUTPUT_REGISTRY.register_output_processor(SegmentationReassembler(classes=CROP_CLASSES))
def crops(weights: str | Path) -> nn.Module:
    """Prithvi-EO-2.0-300M-TL crops (3 dates, pyramid neck + UNet decoder)."""
    return _segmentation(weights, "prithvi-eo2-300m-tl-crops", "unet", len(CROP_CLASSES))


def register() -> None:
    """Entry point: the decorators above ran when this module was imported."""
