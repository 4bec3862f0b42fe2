"""Built-in models that need no weights, so the demo and the tests run before any learned model.

- ``identity`` returns its input bands unchanged: with ``center`` blending the output GeoTIFF
  equals the input exactly, which proves the pipeline lossless.
- ``ndwi-water`` classifies water with the Normalized Difference Water Index,
  (green - NIR) / (green + NIR) > 0 (McFeeters 1996), from Sentinel-2 bands B3 and B8. It is a
  fixed spectral rule, not a learned model, and the baseline learned water models must beat.

``s1s2-water`` (:mod:`geoserve.models.fusion`) adds Sentinel-1 radar where the optical image
has no data.
"""

from __future__ import annotations

import torch
from torch import nn

from geoserve.processors import GeoTiffPatcher, RawReassembler, SegmentationReassembler
from geoserve.registry import INPUT_REGISTRY, MODEL_REGISTRY, OUTPUT_REGISTRY

#: Logit scale of ``ndwi-water``: an NDWI of 0.1 gives a water probability of about 0.88.
NDWI_SHARPNESS = 10.0


@MODEL_REGISTRY.register_model("identity", description="returns its input bands (lossless check)")
@INPUT_REGISTRY.register_input_processor(
    # each band keeps its own nodata, as NaN through the model: the output equals the input
    GeoTiffPatcher(patch_size=224, blend="center", per_band_nodata=True, fill=float("nan"))
)
@OUTPUT_REGISTRY.register_output_processor(RawReassembler())
class Identity(nn.Module):
    """Returns its input unchanged."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Identity."""
        return x


@MODEL_REGISTRY.register_model(
    "ndwi-water",
    description="NDWI > 0 water map from Sentinel-2 B3 (green) and B8 (NIR)",
    input_description="Sentinel-2 reflectance x 10000 with named bands: a GeoTIFF whose band "
    "descriptions include B3 and B8 (as a 13-band stack's B1..B12), or a STAC Item",
)
@INPUT_REGISTRY.register_input_processor(
    GeoTiffPatcher(bands=("B3", "B8"), scale_factor=1e-4, patch_size=224, blend="center")
)
@OUTPUT_REGISTRY.register_output_processor(
    SegmentationReassembler(
        classes=("not water", "water"), colors=((230, 230, 220), (31, 120, 220))
    )
)
class NdwiWater(nn.Module):
    """Two-class logits (not water, water) = (-k, +k) x NDWI; argmax is NDWI > 0."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 2 bands, H, W) green/NIR reflectance -> (B, 2, H, W) logits."""
        green, nir = x[:, 0:1], x[:, 1:2]
        ndwi = (green - nir) / (green + nir).abs().clamp_min(1e-6)
        return torch.cat([-ndwi, ndwi], dim=1) * NDWI_SHARPNESS


def register() -> None:
    """Entry point: the decorators here, in the demo model and in the fusion model ran."""
    import geoserve.models.demo  # noqa: F401
    import geoserve.models.fusion  # noqa: F401
