"""Several output kinds stream like one: peak memory for three kinds within 1.3x of one kind.

An 8192 x 8192 S2-like scene (a water disc, :mod:`tests.multimodal_scenes`) through a cheap
NDWI rule in 512 px patches, written as ``classes`` alone, then as ``classes``, ``confidence``
and ``polygons`` from the same pass. Each run is a fresh Python process (its VmHWM is its own
peak). The polygons are traced from the finished class map on disk, block by block.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyogrio
import pytest
import rasterio

REPO = Path(__file__).resolve().parents[2]
SIZE = 8192
BAR = 1.3

RUN = textwrap.dedent(
    """
    import json, sys, time
    import torch
    from torch import nn
    from geoserve import (Engine, GeoTiffPatcher, SegmentationReassembler, INPUT_REGISTRY,
                          MODEL_REGISTRY, OUTPUT_REGISTRY)

    @MODEL_REGISTRY.register_model("water-rule")
    @INPUT_REGISTRY.register_input_processor(GeoTiffPatcher(
        bands=("B3", "B8"), scale_factor=1e-4, patch_size=512, stride=512, blend="none"))
    @OUTPUT_REGISTRY.register_output_processor(SegmentationReassembler(classes=("land", "water")))
    class WaterRule(nn.Module):
        def forward(self, x):
            green, nir = x[:, :1], x[:, 1:2]
            wet = 20 * (green - nir) / (green + nir + 1e-6)
            return torch.cat([-wet, wet], dim=1)

    src, dst, kinds = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
    engine = Engine("water-rule", output_kind=kinds, max_batch_patches=16)
    t0 = time.perf_counter()
    result = engine.generate_image(src, output_path=dst)
    wall = time.perf_counter() - t0
    peak = next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1]
    paths = {k: str(o.path) for k, o in result.outputs_by_kind.items()}
    print(json.dumps({"peak_mb": int(peak) / 1024, "wall_s": wall, "paths": paths}))
    """
)


@pytest.fixture(scope="module")
def scene(large_s2: Path) -> Path:
    """The S2-like scene, 8192 x 8192 (shared with the multimodal streaming test)."""
    with rasterio.open(large_s2) as src:
        assert (src.width, src.height) == (SIZE, SIZE)
    return large_s2


def _run(src: Path, dst: Path, kinds: str) -> dict:
    env = {**os.environ, "MALLOC_ARENA_MAX": "2", "OMP_NUM_THREADS": "2"}
    res = subprocess.run(
        [sys.executable, "-c", RUN, str(src), str(dst), kinds],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    result: dict = json.loads(res.stdout.strip().splitlines()[-1])
    return result


def test_three_kinds_stream_within_1_3x_of_one_kind(scene, tmp_path):
    one = _run(scene, tmp_path / "one.tif", "classes")
    three = _run(scene, tmp_path / "three", "classes,confidence,polygons")
    figures = (
        f"peak RSS {three['peak_mb']:.0f} MB for 3 kinds, {one['peak_mb']:.0f} MB for one "
        f"(ratio {three['peak_mb'] / one['peak_mb']:.2f}, bar {BAR}); runs "
        f"{three['wall_s']:.1f} s and {one['wall_s']:.1f} s"
    )
    print(figures)
    with rasterio.open(one["paths"]["classes"]) as a, rasterio.open(three["paths"]["classes"]) as b:
        assert (b.count, b.height, b.width) == (1, SIZE, SIZE)
        for _, window in a.block_windows(1):  # block by block: equal maps
            assert (a.read(1, window=window) == b.read(1, window=window)).all()
    _, _, _, (_, class_names) = pyogrio.raw.read(three["paths"]["polygons"])  # (GeoPackage)
    assert "water" in class_names.tolist()
    assert three["peak_mb"] <= BAR * one["peak_mb"], figures
