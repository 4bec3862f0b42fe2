"""``test-generate``: TerraMind generation at toy width, randomly initialised (seeded).

The real ``TerraMindGenerate`` step logic, sampling, DDIM and products, with a two-block
generator, a narrow UNet (32 channels, one ResBlock per level) and a two-block ViT decoder, so
a 64 px patch takes a fraction of a second per step on a CPU. Weights are seeded per part:
every build is the same model. Patches of 64 px at stride 32 (margin 16: on the token grid),
2 diffusion steps by default (2 UNet calls).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from geoserve import INPUT_REGISTRY, MODEL_REGISTRY, OUTPUT_REGISTRY
from geoserve.models.terramind.generate import RAW_INPUTS, GenerationOptions, TerraMindGenerate
from geoserve.models.terramind.generation import TerraMindGenerator
from geoserve.models.terramind.products import GeneratedProducts
from geoserve.models.terramind.tokenizers import VQVAE, DiVAE
from geoserve.models.terramind.tokenizers.builders import tokenizer_spec
from geoserve.models.terramind.variants import MODALITIES
from geoserve.processors import Modality, MultimodalPatcher

TINY_UNET = dict(model_channels=32, num_res_blocks=1)
TINY_VIT = dict(dim=64, depth=2, num_heads=4)
TINY_GENERATOR = dict(dim=48, depth=2, decoder_depth=2, num_heads=2, gated_mlp=False, bias=True)
_SCALES = ("norm1.weight", "norm2.weight", "norm_mlp.weight", "norm.weight", "layers.0.weight")


def randomise(model: nn.Module, seed: int) -> nn.Module:
    """Every parameter away from its init (a fresh UNet outputs exactly zero)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if name.endswith(_SCALES) or name == "out.0.weight":
                p.copy_(1 + 0.1 * noise)
            else:
                p.copy_(0.05 * noise)
    return model.eval()


class TinyParts:
    """A :class:`~geoserve.models.terramind.generate.GenerationLoader` of toy-size parts."""

    def generator(self, inputs: Sequence[str], outputs: Sequence[str]) -> TerraMindGenerator:
        seed = sum(ord(c) for c in "".join(outputs))
        model = TerraMindGenerator(inputs, outputs, **TINY_GENERATOR)  # type: ignore[arg-type]
        randomise(model, seed)
        return model

    def tokenizer(self, modality: str) -> DiVAE | VQVAE:
        spec = tokenizer_spec(modality)
        seed = 1000 + sum(ord(c) for c in spec.modality)
        if spec.kind == "vqvae":
            tok: DiVAE | VQVAE = VQVAE(spec.channels, spec.levels, encoder=False, vit=TINY_VIT)
        else:
            tok = DiVAE(spec.channels, spec.levels, encoder=False, unet=TINY_UNET)
        randomise(tok, seed)
        return tok


def _modality(name: str) -> Modality:
    info = MODALITIES[name]
    return Modality(
        name, bands=tuple(range(len(info.bands))), mean=info.mean, std=info.std, required=False
    )


@MODEL_REGISTRY.register_model("test-generate")
@INPUT_REGISTRY.register_input_processor(
    MultimodalPatcher(
        modalities=tuple(_modality(m) for m in RAW_INPUTS),
        patch_size=64,
        stride=32,
        blend="cosine",
    )
)
@OUTPUT_REGISTRY.register_output_processor(GeneratedProducts())
def tiny_generate() -> nn.Module:
    """TerraMind generation at toy size (2 diffusion steps by default)."""
    return TerraMindGenerate(TinyParts(), GenerationOptions(steps=2))
