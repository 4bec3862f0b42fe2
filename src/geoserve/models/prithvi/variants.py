"""Prithvi encoder variants (anchor_prithvi.md A1) and the band statistics of each family."""

from __future__ import annotations

from typing import Any

#: TerraTorch names -> encoder arguments.
VARIANTS: dict[str, dict[str, Any]] = {
    "prithvi_eo_v1_100": dict(embed_dim=768, depth=12, num_heads=12, patch_size=16, num_frames=3),
    "prithvi_eo_v2_tiny_tl": dict(
        embed_dim=192,
        depth=12,
        num_heads=3,
        patch_size=16,
        num_frames=1,
        coords_encoding=("time", "location"),
        coords_scale_learn=True,
    ),
    "prithvi_eo_v2_100_tl": dict(
        embed_dim=768,
        depth=12,
        num_heads=12,
        patch_size=16,
        num_frames=4,
        coords_encoding=("time", "location"),
        coords_scale_learn=True,
    ),
    "prithvi_eo_v2_300": dict(embed_dim=1024, depth=24, num_heads=16, patch_size=16, num_frames=4),
    "prithvi_eo_v2_300_tl": dict(
        embed_dim=1024,
        depth=24,
        num_heads=16,
        patch_size=16,
        num_frames=4,
        coords_encoding=("time", "location"),
        coords_scale_learn=True,
    ),
    "prithvi_eo_v2_600": dict(embed_dim=1280, depth=32, num_heads=16, patch_size=14, num_frames=4),
    "prithvi_eo_v2_600_tl": dict(
        embed_dim=1280,
        depth=32,
        num_heads=16,
        patch_size=14,
        num_frames=4,
        coords_encoding=("time", "location"),
        coords_scale_learn=True,
    ),
}

#: Decoder feature indices TerraTorch uses per depth.
FEATURE_INDICES: dict[int, tuple[int, ...]] = {
    12: (2, 5, 8, 11),
    24: (5, 11, 17, 23),
    32: (7, 15, 23, 31),
}

PRITHVI_BANDS = ("BLUE", "GREEN", "RED", "NIR_NARROW", "SWIR_1", "SWIR_2")
#: Sentinel-2 13-band L1C stack (B1..B8, B8A, B9..B12) -> Prithvi's six bands, 0-based.
S2_L1C_PRITHVI_INDICES = (1, 2, 3, 8, 11, 12)
#: The inputs of the models that take those, in words (``ModelSpec.input_description``).
S2_L1C_STACK = "a 13-band Sentinel-2 L1C stack (B01-B08, B8A, B09-B12, in that order)"
HLS_SIX = "the 6 HLS bands Blue, Green, Red, NIR narrow, SWIR 1, SWIR 2 (in that order)"

V2_MEAN = (1087.0, 1342.0, 1433.0, 2734.0, 1958.0, 1363.0)
V2_STD = (2248.0, 2179.0, 2178.0, 1850.0, 1242.0, 1049.0)
V1_MEAN = (
    775.2290211032589,
    1080.992780391705,
    1228.5855250417867,
    2497.2022620507532,
    2204.2139147975554,
    1610.8324823273745,
)
V1_STD = (
    1281.526139861424,
    1270.0297974547493,
    1399.4802505642526,
    1368.3446143747644,
    1291.6764008585435,
    1154.505683480695,
)
#: Sen1Floods11 fine-tune (reflectance 0-1, i.e. DN x 1e-4).
SEN1FLOODS11_MEAN = (0.1412956, 0.13795798, 0.12353792, 0.30902815, 0.2044958, 0.11912015)
SEN1FLOODS11_STD = (0.07406382, 0.07370365, 0.08692279, 0.11798815, 0.09772074, 0.07659938)


def encoder_kwargs(variant: str, **overrides: Any) -> dict[str, Any]:
    """Encoder arguments of a variant, with overrides.

    Raises:
        UnknownNameError: the variant is not known (the message lists the known ones).
    """
    from geoserve.errors import UnknownNameError

    if variant not in VARIANTS:
        raise UnknownNameError("Prithvi variant", variant, VARIANTS)
    return {"img_size": 224, "in_chans": 6, **VARIANTS[variant], **overrides}


#: HLS burn scars (reflectance 0-1 as stored in the ``_merged.tif`` chips).
BURN_SCARS_MEAN = (
    0.033349706741586264,
    0.05701185520536176,
    0.05889748132001316,
    0.2323245113436119,
    0.1972854853760658,
    0.11944914225186566,
)
BURN_SCARS_STD = (
    0.02269135568823774,
    0.026807560223070237,
    0.04004109844362779,
    0.07791732423672691,
    0.08708738838140137,
    0.07241979477437814,
)
#: Multi-temporal crop classification (DN; the same statistics for each of the 3 dates).
CROPS_MEAN = (494.905781, 815.239594, 924.335066, 2968.881459, 2634.621962, 1739.579917)
CROPS_STD = (284.925432, 357.84876, 575.566823, 896.601013, 951.900334, 921.407808)
#: The 13 classes of the HLS multi-temporal crop data set, in label order.
CROP_CLASSES = (
    "Natural Vegetation",
    "Forest",
    "Corn",
    "Soybeans",
    "Wetlands",
    "Developed/Barren",
    "Open Water",
    "Winter Wheat",
    "Alfalfa",
    "Fallow/Idle Cropland",
    "Cotton",
    "Sorghum",
    "Other",
)
