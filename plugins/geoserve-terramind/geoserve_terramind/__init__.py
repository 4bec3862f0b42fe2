"""TerraMind (IBM/ESA) fine-tunes for geoserve.

Each model is a factory taking the local weights path: a TerraTorch fine-tune checkpoint of any
TerraMind v1 size, read by :func:`geoserve.models.load_checkpoint` (the architecture comes from
the weights and from a ``config.yaml`` beside them). Inputs are normalised with TerraMind's
published pretraining statistics (:data:`geoserve.models.terramind.variants.MODALITIES`).

The ``terramind-v1-<size>-generate`` models generate modalities (S2L2A, S1GRD, S1RTC, DEM,
NDVI, LULC) from any set of the raw-pixel ones (:mod:`geoserve.models.terramind.generate`):
the output kinds name what is generated (``--output-kind s1grd,lulc``); weights from the Hub's
published checkpoints (or their cache), a directory of them, or one TerraTorch state dict.

Import only geoserve's public modules here (registries, processors, models).
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from geoserve.errors import WeightsError
from geoserve.models import load_checkpoint
from geoserve.models.terramind import TerraMindSegmentation
from geoserve.models.terramind.generate import RAW_INPUTS, TerraMindGenerate
from geoserve.models.terramind.generation_weights import GenerationFiles
from geoserve.models.terramind.products import GeneratedProducts
from geoserve.models.terramind.variants import MODALITIES, modality_key
from geoserve.processors import (
    GeoTiffPatcher,
    Modality,
    MultimodalPatcher,
    SegmentationReassembler,
)
from geoserve.registry import INPUT_REGISTRY, MODEL_REGISTRY, OUTPUT_REGISTRY

HF = "https://huggingface.co/ibm-esa-geospatial"
WATER = SegmentationReassembler(
    classes=("not water", "water"), colors=((230, 230, 220), (31, 120, 220))
)


def _modality(name: str, required: bool) -> Modality:
    info = MODALITIES[name]
    return Modality(
        name, bands=tuple(range(len(info.bands))), mean=info.mean, std=info.std, required=required
    )


def _load(weights: str | Path, name: str, modalities: dict[str, int], classes: int) -> nn.Module:
    model = load_checkpoint(weights)
    if not isinstance(model, TerraMindSegmentation):
        raise WeightsError(
            f"{weights}: holds a {type(model).__name__}, but model {name!r} needs a TerraMind "
            "segmentation fine-tune"
        )
    embeddings = model.encoder.encoder_embeddings
    have = {n: embeddings[modality_key(n)].channels for n in model.modalities}
    same = {modality_key(n): c for n, c in have.items()} == {
        modality_key(n): c for n, c in modalities.items()
    }
    if not same or model.num_classes != classes:
        raise WeightsError(
            f"{weights}: a fine-tune of {have} with {model.num_classes} classes, but model "
            f"{name!r} takes {modalities} and has {classes} classes"
        )
    return model


@MODEL_REGISTRY.register_model(
    "terramind-v1-sen1floods11",
    description="TerraMind v1 fine-tuned on Sen1Floods11 (S2 L1C + S1 GRD, either optional): water",
    input_description="S2L1C: a 13-band Sentinel-2 L1C stack (B01-B08, B8A, B09-B12, in that "
    "order), and/or S1GRD: Sentinel-1 GRD VV, VH in dB",
    weights_required=True,
    loads_weights=True,
    token_size=16,  # its encoder's patch tokens: the embeddings kinds
    weights_hint=(
        "a TerraTorch fine-tune of TerraMind v1 on Sen1Floods11 (backbone_modalities "
        f"[S2L1C, S1GRD], 2 classes), e.g. trained from {HF}/TerraMind-1.0-base"
    ),
)
@INPUT_REGISTRY.register_input_processor(
    MultimodalPatcher(
        modalities=(_modality("S2L1C", False), _modality("S1GRD", False)),
        patch_size=224,
        stride=192,
        blend="center",
    )
)
@OUTPUT_REGISTRY.register_output_processor(WATER)
def sen1floods11(weights: str | Path) -> nn.Module:
    """TerraMind v1 (any size) + UNet/UperNet, S2 L1C and S1 GRD."""
    return _load(weights, "terramind-v1-sen1floods11", {"S2L1C": 13, "S1GRD": 2}, 2)


@MODEL_REGISTRY.register_model(
    "terramind-v1-s2l2a-water",
    description="TerraMind v1 fine-tuned on Sentinel-2 L2A alone (12 bands): water",
    input_description="a 12-band Sentinel-2 L2A stack (B01-B08, B8A, B09, B11, B12, in that order)",
    weights_required=True,
    loads_weights=True,
    token_size=16,  # its encoder's patch tokens: the embeddings kinds
    weights_hint=(
        "a TerraTorch fine-tune of TerraMind v1 with backbone_modalities [S2L2A] and 2 classes, "
        f"e.g. trained from {HF}/TerraMind-1.0-base"
    ),
)
@INPUT_REGISTRY.register_input_processor(
    GeoTiffPatcher(
        bands=tuple(range(12)),
        band_roles=MODALITIES["S2L2A"].bands,
        mean=MODALITIES["S2L2A"].mean,
        std=MODALITIES["S2L2A"].std,
        patch_size=224,
        stride=192,
        blend="center",
    )
)
@OUTPUT_REGISTRY.register_output_processor(WATER)
def s2l2a_water(weights: str | Path) -> nn.Module:
    """TerraMind v1 (any size) + UNet/UperNet on S2 L2A; the input tensor is the one modality."""
    return _load(weights, "terramind-v1-s2l2a-water", {"S2L2A": 12}, 2)


def _register_generate(size: str) -> None:
    name = f"terramind-v1-{size}-generate"

    def factory(weights: str | Path | None) -> nn.Module:
        return TerraMindGenerate(GenerationFiles(size, weights))

    factory.__doc__ = f"TerraMind v1 {size}: any-to-any generation (tokens, then diffusion)."
    factory.__name__ = factory.__qualname__ = f"generate_{size}"
    decorate = [
        MODEL_REGISTRY.register_model(
            name,
            description=f"TerraMind v1 {size} generation: S2L2A, S1GRD, S1RTC, DEM, NDVI or "
            "LULC from any of S2L2A, S2L1C, S1GRD, S1RTC, DEM, RGB (output kinds name what)",
            input_description="modalities by name, each optional (S2L2A: 12 bands, S2L1C: 13, "
            "S1GRD/S1RTC: VV, VH in dB, DEM: metres, RGB: 3 bands 0-255)",
            weights_required=False,
            loads_weights=True,
            weights_hint=(
                f"TerraMind_v1_{size}.pt and TerraMind_Tokenizer_<MODALITY>.pt ({HF}), "
                "a directory of them, or a TerraTorch TerraMindGeneration state dict"
            ),
        ),
        INPUT_REGISTRY.register_input_processor(
            MultimodalPatcher(
                modalities=tuple(_modality(m, False) for m in RAW_INPUTS),
                patch_size=224,
                stride=192,
                blend="cosine",
            )
        ),
        OUTPUT_REGISTRY.register_output_processor(GeneratedProducts()),
    ]
    registered: object = factory
    for deco in reversed(decorate):
        registered = deco(registered)


for _size in ("tiny", "small", "base", "large"):
    _register_generate(_size)


def register() -> None:
    """Entry point: the decorators above ran when this module was imported."""
