"""The bundled demo model: a tiny Prithvi-architecture water segmenter, trained on CPU.

``demo-water`` uses the same :class:`~geoserve.models.prithvi.PrithviViT` encoder as the large
Prithvi variants, shrunk (width 128, depth 2, 4 heads, 16-px tubelets), with a light decoder:
four 2x transposed convolutions back to full resolution, plus a 3x3 convolution on the input
bands as a full-resolution skip branch. It takes the six Prithvi bands of a Sentinel-2 L1C
stack (0-based 1, 2, 3, 8, 11, 12) normalised with Prithvi-EO-2.0's statistics.

It was trained by ``scripts/train_demo_model.py`` on the bundled lake scene against NDWI > 0
labels; its honest quality on data it never saw is in ``weights/demo_water.md`` (the model
card), which a test recomputes from the shipped weights.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from torch import nn

from geoserve.models.prithvi.encoder import PrithviViT, layer_tokens
from geoserve.models.prithvi.variants import (
    PRITHVI_BANDS,
    S2_L1C_PRITHVI_INDICES,
    S2_L1C_STACK,
    V2_MEAN,
    V2_STD,
)
from geoserve.processors import GeoTiffPatcher, SegmentationReassembler
from geoserve.registry import INPUT_REGISTRY, MODEL_REGISTRY, OUTPUT_REGISTRY

WEIGHTS = "demo_water.safetensors"
CARD = "demo_water.json"
ARCH: dict[str, Any] = dict(
    img_size=224, patch_size=16, num_frames=1, in_chans=6, embed_dim=128, depth=2, num_heads=4
)


class DemoWater(nn.Module):
    """Tiny Prithvi encoder + transposed-conv decoder + full-resolution skip: 2 class logits."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = PrithviViT(**ARCH)
        d = ARCH["embed_dim"]
        self.decoder = nn.Sequential(
            nn.ConvTranspose2d(d, 64, 2, 2),
            nn.GELU(),
            nn.ConvTranspose2d(64, 32, 2, 2),
            nn.GELU(),
            nn.ConvTranspose2d(32, 16, 2, 2),
            nn.GELU(),
            nn.ConvTranspose2d(16, 16, 2, 2),
            nn.GELU(),
        )
        self.skip = nn.Sequential(nn.Conv2d(ARCH["in_chans"], 16, 3, padding=1), nn.GELU())
        self.head = nn.Conv2d(32, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 6, H, W) normalised bands (H, W multiples of 16) -> (B, 2, H, W) logits."""
        return self.forward_with_tokens(x)[0]

    def forward_with_tokens(
        self, x: torch.Tensor, *, layer: int = -1
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The logits, and block ``layer``'s tokens (B, 128, H / 16, W / 16) (embeddings)."""
        h, w = x.shape[-2] // 16, x.shape[-1] // 16
        features = self.encoder.forward_features(x)
        grid = layer_tokens(features, -1, 1, h, w)
        logits = self.head(torch.cat([self.decoder(grid), self.skip(x)], dim=1))
        if layer in (-1, len(features) - 1):
            return logits, grid
        return logits, layer_tokens(features, layer, 1, h, w)


def weights_path() -> Path:
    """Where the shipped weights are."""
    return Path(str(resources.files("geoserve.models") / "weights" / WEIGHTS))


def model_card() -> dict[str, Any]:
    """The model card's measured figures (``weights/demo_water.json``)."""
    text = (resources.files("geoserve.models") / "weights" / CARD).read_text()
    card: dict[str, Any] = json.loads(text)
    return card


@MODEL_REGISTRY.register_model(
    "demo-water",
    description="tiny Prithvi-architecture water model trained on the bundled scene (demo)",
    token_size=16,
    validated=("int8",),  # the model card's int8 figures (tests/models/test_demo.py)
    input_description=f"{S2_L1C_STACK}, 10 m, top-of-atmosphere reflectance x 10000",
    bundled_weights=weights_path(),
)
@INPUT_REGISTRY.register_input_processor(
    GeoTiffPatcher(
        bands=S2_L1C_PRITHVI_INDICES,
        band_roles=PRITHVI_BANDS,
        mean=V2_MEAN,
        std=V2_STD,
        patch_size=224,
        stride=192,
        blend="center",
    )
)
@OUTPUT_REGISTRY.register_output_processor(
    SegmentationReassembler(
        classes=("not water", "water"), colors=((230, 230, 220), (31, 120, 220))
    )
)
def demo_water() -> nn.Module:
    """The demo model with its shipped weights."""
    from safetensors.torch import load_file

    model = DemoWater()
    model.load_state_dict(load_file(str(weights_path())), strict=True)
    return model.eval()
