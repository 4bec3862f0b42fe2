"""TerraMind v1's tokenizers: tokens <-> images for the modalities TerraMind generates.

``fsq`` (token index <-> code), ``vit`` (the ViT-B encoder and LULC decoder), ``unet`` (the
DiVAE's patched diffusion UNet), ``ddim`` (its deterministic sampler, one step at a time),
``autoencoders`` (:class:`DiVAE`, :class:`VQVAE`) and ``builders`` (per-modality sizes, the
published weights, the strict loader). Nothing here imports ``diffusers``.
"""

from geoserve.models.terramind.tokenizers.autoencoders import VQVAE, DiVAE
from geoserve.models.terramind.tokenizers.builders import (
    TOKENIZERS,
    TokenizerSpec,
    build_tokenizer,
    load_tokenizer,
    tokenizer_spec,
)
from geoserve.models.terramind.tokenizers.ddim import DDIM
from geoserve.models.terramind.tokenizers.fsq import FSQ

__all__ = [
    "DDIM",
    "FSQ",
    "TOKENIZERS",
    "VQVAE",
    "DiVAE",
    "TokenizerSpec",
    "build_tokenizer",
    "load_tokenizer",
    "tokenizer_spec",
]
