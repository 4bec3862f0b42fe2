"""A multimodal request streams: peak memory follows the scene's width, not its area.

An 8192 x 8192 S2 scene with an S1 scene over its upper-left 60 % (warped onto the S2 grid as
the rows are read) must run within 1.3x the peak resident memory of a request of the same
width and 2048 rows. Each run is a fresh Python process (its VmHWM is its own peak); the model
is a cheap NDWI-and-backscatter rule taking a dict of modalities, 512 px patches side by side,
and the output a uint8 class map written to a file, so reading, warping and writing dominate.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import rasterio

from tests.multimodal_scenes import write_s1, write_s2

REPO = Path(__file__).resolve().parents[2]
WIDTH, SHORT = 8192, 2048
BAR = 1.3

RUN = textwrap.dedent(
    """
    import json, sys, time
    import torch
    from torch import nn
    from geoserve import (Engine, SegmentationReassembler, INPUT_REGISTRY, MODEL_REGISTRY,
                          OUTPUT_REGISTRY)
    from geoserve.processors.multimodal import Modality, MultimodalPatcher

    @MODEL_REGISTRY.register_model("mm-water-rule")
    @INPUT_REGISTRY.register_input_processor(MultimodalPatcher(
        modalities=(
            Modality("s2", bands=("B3", "B8"), scale_factor=1e-4),
            Modality("s1", bands=("VV",), required=False),  # gaps filled: every patch runs
        ),
        patch_size=512, blend="none"))
    @OUTPUT_REGISTRY.register_output_processor(SegmentationReassembler(classes=("land", "water")))
    class WaterRule(nn.Module):
        def forward(self, x):
            green, nir = x["s2"][:, :1], x["s2"][:, 1:2]
            wet = (green - nir) / (green + nir + 1e-6)
            if "s1" in x:
                wet = wet - 0.01 * (x["s1"] + 15.0)
            return torch.cat([-wet, wet], dim=1)

    s2, s1, dst = sys.argv[1:4]
    engine = Engine("mm-water-rule", max_batch_patches=16)
    t0 = time.perf_counter()
    engine.generate_image({"s2": s2, "s1": s1}, output_path=dst)
    wall = time.perf_counter() - t0
    peak = next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1]
    print(json.dumps({"peak_mb": int(peak) / 1024, "wall_s": wall}))
    """
)


@pytest.fixture(scope="session")
def scenes(tmp_path_factory: pytest.TempPathFactory, large_s2: Path) -> dict[str, Path]:
    """The S2 scene (8192 x 8192, shared with the streaming test of several kinds), its first
    2048 rows, and S1 over its upper-left 60 %."""
    root = tmp_path_factory.mktemp("mm-streaming")
    with rasterio.open(large_s2) as src:
        assert (src.width, src.height) == (WIDTH, WIDTH)
    return {
        "full": large_s2,
        "short": write_s2(root / "s2_short.tif", WIDTH, height=SHORT),
        "s1": write_s1(root / "s1.tif", WIDTH, cover=0.6),
    }


def _run(s2: Path, s1: Path, dst: Path) -> dict[str, float]:
    env = {**os.environ, "MALLOC_ARENA_MAX": "2", "OMP_NUM_THREADS": "2"}
    res = subprocess.run(
        [sys.executable, "-c", RUN, str(s2), str(s1), str(dst)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    result: dict[str, float] = json.loads(res.stdout.strip().splitlines()[-1])
    return result


def test_multimodal_request_memory_follows_width_not_area(scenes, tmp_path):
    t0 = time.perf_counter()
    short = _run(scenes["short"], scenes["s1"], tmp_path / "short.tif")
    full = _run(scenes["full"], scenes["s1"], tmp_path / "full.tif")
    figures = (
        f"peak RSS {full['peak_mb']:.0f} MB for {WIDTH}x{WIDTH}, {short['peak_mb']:.0f} MB for "
        f"{WIDTH}x{SHORT} (ratio {full['peak_mb'] / short['peak_mb']:.2f}, bar {BAR}); "
        f"runs {full['wall_s']:.1f} s and {short['wall_s']:.1f} s, "
        f"{time.perf_counter() - t0:.1f} s with start-up"
    )
    print(figures)
    for path, height in ((tmp_path / "full.tif", WIDTH), (tmp_path / "short.tif", SHORT)):
        with rasterio.open(path) as out:
            assert (out.count, out.height, out.width) == (1, height, WIDTH)
    assert full["peak_mb"] <= BAR * short["peak_mb"], figures
