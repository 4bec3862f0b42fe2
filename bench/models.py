"""The benchmark models, registered on import: ``bench-conv`` and ``bench-1x1``.

Both see six bands, reflectance-scaled (x 1e-4) and normalised (mean 0.1, std 0.05), in 224 px
patches at stride 192 with the ``center`` blend, and give two classes (land, water). The same
normalisation and tiling are what ``bench.pipeline`` feeds TerraTorch.
``geoserve serve`` runs them after ``import bench.models`` (see ``harness.serve_command``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch
from torch import nn

from geoserve import (
    INPUT_REGISTRY,
    MODEL_REGISTRY,
    OUTPUT_REGISTRY,
    GeoTiffPatcher,
    SegmentationReassembler,
)
from geoserve.raster.grid import BlendMode

F = TypeVar("F", bound=Callable[..., nn.Module])

#: Of the lake scene's 13 bands: B2, B3, B4, B8A, B11, B12 (0-based).
BANDS = (1, 2, 3, 8, 11, 12)
#: All six bands of a synthetic scene.
SIX = (0, 1, 2, 3, 4, 5)
SCALE, MEAN, STD = 1e-4, (0.1,) * 6, (0.05,) * 6
PATCH, STRIDE = 224, 192


def bench_patcher(bands: tuple[int, ...], blend: BlendMode = "center") -> GeoTiffPatcher:
    """Six bands, reflectance-scaled and normalised, 224 px patches at stride 192 (``blend``:
    centre crop by default)."""
    return GeoTiffPatcher(
        bands=bands,
        scale_factor=SCALE,
        mean=MEAN,
        std=STD,
        patch_size=PATCH,
        stride=STRIDE,
        blend=blend,
    )


def register(name: str, bands: tuple[int, ...], description: str = "") -> Callable[[F], F]:
    """Register a model factory under ``name`` with :func:`bench_patcher` and a land/water
    class map (decorator)."""

    def decorator(factory: F) -> F:
        reassembler = SegmentationReassembler(classes=("land", "water"))
        factory = OUTPUT_REGISTRY.register_output_processor(reassembler)(factory)
        factory = INPUT_REGISTRY.register_input_processor(bench_patcher(bands))(factory)
        return MODEL_REGISTRY.register_model(name, description=description)(factory)

    return decorator


@register("bench-conv", BANDS, description="small seeded conv net (benchmark)")
class BenchConv(nn.Module):
    """Three 3x3 convolutions, 32 channels: a few hundred MFLOP per 224 px patch."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(
            nn.Conv2d(6, 32, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, 32, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, 2, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@register("bench-1x1", SIX, description="seeded 1x1 convolution (benchmark)")
class Pointwise(nn.Module):
    """6 bands -> 2 logits per pixel: almost no arithmetic, so the pipeline shows."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(6, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def register_conv6() -> str:
    """``bench-conv-6``: the ``bench-conv`` weights behind a patcher for 6-band scenes."""
    if "bench-conv-6" not in MODEL_REGISTRY:
        register("bench-conv-6", SIX)(type("BenchConv6", (BenchConv,), {}))
    return "bench-conv-6"
