"""TerraMind v1 variants, its image modalities and their published band statistics.

Facts from TerraTorch 1.2.13 (``terramind_register.py``, ``modality_info.py``; the TerraMind
paper, arXiv:2504.11171): the v1 builders fix width and depth; ``tiny``/``small`` use a plain
GELU MLP with biases, ``base``/``large`` a gated SiLU MLP (SwiGLU) without biases; every
variant has bias-free LayerNorms (the bias kept as a zero buffer), patch size 16, 224 px
pretraining size and no CLS token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: TerraTorch backbone names -> encoder arguments.
VARIANTS: dict[str, dict[str, Any]] = {
    "terramind_v1_tiny": dict(dim=192, depth=12, num_heads=3, gated_mlp=False, bias=True),
    "terramind_v1_small": dict(dim=384, depth=12, num_heads=6, gated_mlp=False, bias=True),
    "terramind_v1_base": dict(dim=768, depth=12, num_heads=12, gated_mlp=True, bias=False),
    "terramind_v1_large": dict(dim=1024, depth=24, num_heads=16, gated_mlp=True, bias=False),
}

#: Decoder feature indices TerraTorch's example configs select per depth.
FEATURE_INDICES: dict[int, tuple[int, ...]] = {12: (2, 5, 8, 11), 24: (5, 11, 17, 23)}

PATCH_SIZE = 16
IMG_SIZE = 224

S2L1C_BANDS = (
    "COASTAL_AEROSOL",
    "BLUE",
    "GREEN",
    "RED",
    "RED_EDGE_1",
    "RED_EDGE_2",
    "RED_EDGE_3",
    "NIR_BROAD",
    "NIR_NARROW",
    "WATER_VAPOR",
    "CIRRUS",
    "SWIR_1",
    "SWIR_2",
)
S2L2A_BANDS = tuple(b for b in S2L1C_BANDS if b != "CIRRUS")


@dataclass(frozen=True)
class ImageModality:
    """One TerraMind image modality: its embedding key, bands and pretraining statistics."""

    name: str  # TerraTorch's name (S2L2A, S1GRD, ...)
    key: str  # the embedding's key in checkpoints (untok_sen2l2a@224, ...)
    bands: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    tokenized: bool = False  # needs TerraMind's tokenizer (LULC, NDVI)


MODALITIES: dict[str, ImageModality] = {
    m.name: m
    for m in (
        ImageModality(
            "S2L1C",
            "untok_sen2l1c@224",
            S2L1C_BANDS,
            (2357.089, 2137.385, 2018.788, 2082.986, 2295.651, 2854.537, 3122.849)
            + (3040.56, 3306.481, 1473.847, 506.07, 2472.825, 1838.929),
            (1624.683, 1675.806, 1557.708, 1833.702, 1823.738, 1733.977, 1732.131)
            + (1679.732, 1727.26, 1024.687, 442.165, 1331.411, 1160.419),
        ),
        ImageModality(
            "S2L2A",
            "untok_sen2l2a@224",
            S2L2A_BANDS,
            (1390.458, 1503.317, 1718.197, 1853.91, 2199.1, 2779.975, 2987.011)
            + (3083.234, 3132.22, 3162.988, 2424.884, 1857.648),
            (2106.761, 2141.107, 2038.973, 2134.138, 2085.321, 1889.926, 1820.257)
            + (1871.918, 1753.829, 1797.379, 1434.261, 1334.311),
        ),
        ImageModality(
            "S1GRD", "untok_sen1grd@224", ("VV", "VH"), (-12.599, -20.293), (5.195, 5.890)
        ),
        ImageModality(
            "S1RTC", "untok_sen1rtc@224", ("VV", "VH"), (-10.93, -17.329), (4.391, 4.459)
        ),
        ImageModality("DEM", "untok_dem@224", ("DEM",), (670.665,), (951.272,)),
        ImageModality(
            "RGB",
            "untok_sen2rgb@224",
            ("RED", "GREEN", "BLUE"),
            (87.271, 80.931, 66.667),
            (58.767, 47.663, 42.631),
        ),
        ImageModality("NDVI", "tok_ndvi@224", ("NDVI",), (0.327,), (0.322,), tokenized=True),
        ImageModality("LULC", "tok_lulc@224", ("LULC",), (0.0,), (1.0,), tokenized=True),
    )
}
_BY_KEY = {m.key: m for m in MODALITIES.values()}


def modality_key(name: str) -> str:
    """The embedding key TerraTorch gives a modality name (its naming rules, same order).

    ``S2L2A``, ``s2l2a``, ``sen2l2a`` and ``untok_sen2l2a@224`` all name the S2 L2A embedding;
    any other ``s1``/``sen1`` name is S1 GRD, as in TerraTorch.

    Raises:
        ValueError: no TerraMind image modality has this name.
    """
    if name in _BY_KEY:
        return name
    n = name.lower().replace("s2", "sen2").replace("s1", "sen1")
    for part, key in (
        ("sen2l2a", "untok_sen2l2a@224"),
        ("sen2l1c", "untok_sen2l1c@224"),
        ("sen1rtc", "untok_sen1rtc@224"),
        ("sen1", "untok_sen1grd@224"),
        ("rgb", "untok_sen2rgb@224"),
        ("dem", "untok_dem@224"),
        ("lulc", "tok_lulc@224"),
        ("ndvi", "tok_ndvi@224"),
    ):
        if part in n:
            return key
    known = ", ".join(MODALITIES)
    raise ValueError(f"unknown TerraMind modality {name!r}; known: {known}")


def modality_of_key(key: str) -> ImageModality:
    """The modality behind an embedding key."""
    return _BY_KEY[key]
