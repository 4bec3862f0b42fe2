"""Test-only models, registered like plugin models."""

from __future__ import annotations

import os
import time

import torch
from torch import nn

from geoserve import (
    INPUT_REGISTRY,
    MODEL_REGISTRY,
    OUTPUT_REGISTRY,
    GeoTiffPatcher,
    RawReassembler,
    SegmentationReassembler,
)
from geoserve.models.steps import SteppedModel, noise_field

BOX_RADIUS = 3
#: Models made to refuse their own dummy input (error-message tests), not run on it.
REFUSE_THEIR_DUMMY = ("test-six-bands", "test-three-for-six")


@MODEL_REGISTRY.register_model("test-box")
@INPUT_REGISTRY.register_input_processor(
    GeoTiffPatcher(bands=(0,), patch_size=32, stride=24, blend="center")
)
@OUTPUT_REGISTRY.register_output_processor(RawReassembler(channels=1))
class BoxFilter(nn.Module):
    """BOX_RADIUS passes of an all-ones 3x3 filter with zero padding: receptive radius 3.

    Translation-equivariant, and exact in float32 on small integers.
    """

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 1, 3, padding=1, bias=False)
        nn.init.ones_(self.conv.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(BOX_RADIUS):
            x = self.conv(x)
        return x


@MODEL_REGISTRY.register_model("test-seg")
@INPUT_REGISTRY.register_input_processor(
    GeoTiffPatcher(
        bands=(0, 1, 2),
        mean=(100.0, 200.0, 300.0),
        std=(50.0, 60.0, 70.0),
        patch_size=16,
        stride=12,
        blend="cosine",
    )
)
@OUTPUT_REGISTRY.register_output_processor(SegmentationReassembler(classes=("a", "b", "c", "d")))
class TinySeg(nn.Module):
    """Seeded 3x3 conv, 3 bands -> 4 class logits."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        with torch.no_grad():
            self.conv.weight.copy_(torch.randn(self.conv.weight.shape, generator=g))
            self.conv.bias.copy_(torch.randn(4, generator=g))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


@MODEL_REGISTRY.register_model("test-fragile")
@INPUT_REGISTRY.register_input_processor(GeoTiffPatcher(patch_size=16, stride=16, blend="none"))
@OUTPUT_REGISTRY.register_output_processor(RawReassembler())
class Fragile(nn.Module):
    """Identity that raises on any patch holding a value above 1e6 (a poisoned input)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool((x > 1e6).any()):
            raise RuntimeError("poisoned patch")
        return x


@MODEL_REGISTRY.register_model("test-coords")
@INPUT_REGISTRY.register_input_processor(
    GeoTiffPatcher(bands=(0,), patch_size=16, stride=16, blend="none", num_frames=2, coords=True)
)
@OUTPUT_REGISTRY.register_output_processor(RawReassembler())
class CoordsEcho(nn.Module):
    """Outputs, per patch, bands encoding what it received: value of (band 0, date t), year,
    day of year, lon, lat."""

    def forward(
        self, x: torch.Tensor, temporal_coords: torch.Tensor, location_coords: torch.Tensor
    ) -> torch.Tensor:
        b, _, t, h, w = x.shape
        extra = torch.cat([temporal_coords.reshape(b, -1), location_coords], dim=1)
        planes = extra[:, :, None, None].expand(b, extra.shape[1], h, w)
        return torch.cat([x[:, 0], planes], dim=1)


@MODEL_REGISTRY.register_model("test-slow")
@INPUT_REGISTRY.register_input_processor(GeoTiffPatcher(patch_size=16, stride=16, blend="none"))
@OUTPUT_REGISTRY.register_output_processor(RawReassembler())
class Slow(nn.Module):
    """Identity that sleeps GEOSERVE_TEST_SLOW seconds (default 0.05) per forward pass."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(float(os.environ.get("GEOSERVE_TEST_SLOW", "0.05")))
        return x


class SlowReadPatcher(GeoTiffPatcher):
    """A patcher whose every row read takes 0.1 s longer (a slow disk or network)."""

    def read_row(self, sources, ctx, row):  # type: ignore[no-untyped-def]
        time.sleep(0.1)
        return super().read_row(sources, ctx, row)


@MODEL_REGISTRY.register_model("test-slow-read")
@INPUT_REGISTRY.register_input_processor(SlowReadPatcher(patch_size=16, stride=16, blend="none"))
@OUTPUT_REGISTRY.register_output_processor(RawReassembler())
class SlowReadIdentity(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


OOM_ABOVE = 3


@MODEL_REGISTRY.register_model("test-oom")
@INPUT_REGISTRY.register_input_processor(GeoTiffPatcher(patch_size=16, stride=12, blend="mean"))
@OUTPUT_REGISTRY.register_output_processor(RawReassembler())
class RunsOutOfMemory(nn.Module):
    """Doubles its input; raises torch's out-of-memory error above OOM_ABOVE patches."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.batches.append(x.shape[0])
        if x.shape[0] > OOM_ABOVE:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return 2 * x


@MODEL_REGISTRY.register_model("test-nan")
@INPUT_REGISTRY.register_input_processor(GeoTiffPatcher(bands=(0,), patch_size=16, stride=16))
@OUTPUT_REGISTRY.register_output_processor(SegmentationReassembler(classes=("low", "high")))
class NanWhereLarge(nn.Module):
    """Two-class logits (-x, x), but NaN where the input is above 1e5 (a numerically broken
    model; its dummy input stays below that)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = torch.cat([-x, x], dim=1)
        return torch.where(x > 1e5, torch.full_like(logits, float("nan")), logits)


@MODEL_REGISTRY.register_model("test-six-bands")
@INPUT_REGISTRY.register_input_processor(GeoTiffPatcher(patch_size=16, stride=16))
@OUTPUT_REGISTRY.register_output_processor(RawReassembler(channels=1))
class WantsSixBands(nn.Module):
    """A first layer made for six bands, behind a processor that passes every input band."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(6, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


@MODEL_REGISTRY.register_model("test-three-for-six")
@INPUT_REGISTRY.register_input_processor(GeoTiffPatcher(bands=(0, 1, 2), patch_size=16))
@OUTPUT_REGISTRY.register_output_processor(RawReassembler(channels=1))
class ThreeForSix(WantsSixBands):
    """The same six-band first layer, behind a processor that selects three bands."""


@MODEL_REGISTRY.register_model("test-roles")
@INPUT_REGISTRY.register_input_processor(
    GeoTiffPatcher(
        bands=(0, 1, 2, 3, 4, 5),
        band_roles=("BLUE", "GREEN", "RED", "NIR_NARROW", "SWIR_1", "SWIR_2"),
        patch_size=16,
        stride=16,
        blend="none",
    )
)
@OUTPUT_REGISTRY.register_output_processor(RawReassembler())
class RolesIdentity(nn.Module):
    """Identity that declares what its six input bands are (HLS order: blue first)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


#: What ``test-steps`` adds to its noise over its steps: 1 + 2 + 3.
STEPS_ADDED = 6.0


@MODEL_REGISTRY.register_model("test-steps")
@INPUT_REGISTRY.register_input_processor(GeoTiffPatcher(patch_size=16, stride=12, blend="mean"))
@OUTPUT_REGISTRY.register_output_processor(RawReassembler())
class NoisySteps(SteppedModel):
    """A stepped model: a "draw" step, then three "add" steps; returns its input (exactly) and
    one more band: the request's scene noise field plus each step's index (1 + 2 + 3).

    A patch whose input holds a value above 1e5 makes the step at index 2 raise. ``calls``
    records every step: (kind, step indices, seeds, origins); ``live_max`` the most patches
    started and not finished at once.
    """

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, list[int], list[int], list[tuple[int, int]]]] = []
        self._live: set[tuple[int, int, int]] = set()
        self.live_max = 0

    def plan(self) -> tuple[str, ...]:
        return ("draw", "add", "add", "add")

    def step(self, kind, state, index, **kwargs):  # type: ignore[no-untyped-def]
        seeds, origins = state["seed"].tolist(), [tuple(o) for o in state["origin"].tolist()]
        self.calls.append((kind, index.tolist(), seeds, origins))
        x = state["x"]
        if kind == "draw":
            p = x.shape[-1]
            z = [noise_field(s, 0, o, (1, p, p)) for s, o in zip(seeds, origins, strict=True)]
            self._live.update((s, *o) for s, o in zip(seeds, origins, strict=True))
            self.live_max = max(self.live_max, len(self._live))
            return {**state, "z": torch.stack(z).to(x.device)}
        if bool(((x > 1e5).flatten(1).any(1) & (index == 2)).any()):
            raise RuntimeError("a poisoned patch at step 2")
        return {**state, "z": state["z"] + index.view(-1, 1, 1, 1).to(x.dtype)}

    def finish(self, state, **kwargs):  # type: ignore[no-untyped-def]
        for s, o in zip(state["seed"].tolist(), state["origin"].tolist(), strict=True):
            self._live.discard((s, *o))
        return torch.cat([state["x"], state["z"]], dim=1)


import tests.generate_stub  # noqa: E402, F401  (registers test-generate)

#: Models of test-slow-load built so far (each build sleeps GEOSERVE_TEST_SLOW_LOAD s, 0.5).
SLOW_LOADS: list[float] = []


@MODEL_REGISTRY.register_model("test-slow-load")
@INPUT_REGISTRY.register_input_processor(GeoTiffPatcher(patch_size=16, stride=16, blend="none"))
@OUTPUT_REGISTRY.register_output_processor(RawReassembler())
class SlowLoad(nn.Module):
    """Identity whose every build takes GEOSERVE_TEST_SLOW_LOAD seconds (a large checkpoint)."""

    def __init__(self) -> None:
        super().__init__()
        SLOW_LOADS.append(time.monotonic())
        time.sleep(float(os.environ.get("GEOSERVE_TEST_SLOW_LOAD", "0.5")))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class Weighing(nn.Module):
    """Identity holding ``MB`` megabytes of weights it does not use (a model of known size)."""

    MB = 1.0

    def __init__(self) -> None:
        super().__init__()
        self.weights = nn.Parameter(torch.zeros(int(self.MB * 2**20) // 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


for _mb, _name in ((2.0, "test-2mb"), (3.0, "test-3mb"), (3.0, "test-3mb-b"), (9.0, "test-9mb")):
    MODEL_REGISTRY.register_model(_name)(
        INPUT_REGISTRY.register_input_processor(
            GeoTiffPatcher(patch_size=16, stride=16, blend="none")
        )(
            OUTPUT_REGISTRY.register_output_processor(RawReassembler())(
                type(f"Weighing{_name}", (Weighing,), {"MB": _mb})
            )
        )
    )
