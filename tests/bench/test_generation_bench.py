"""``bench.generation``: the seam measure on arrays whose seams are known, and its ``--quick``
mode end to end (a subprocess: the bench sets torch's thread count for its process).

The quick mode runs the toy ``test-generate`` through real engines and GeoTIFFs; the JSON it
writes must have every field the docs section reads, with counts that follow from the plan
(one token pass per output, then the denoising steps) and rates that are positive.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.generation_seams import border_mask, control_mask, seam_stats

ROOT = Path(__file__).resolve().parents[2]


def test_border_pairs_sit_on_the_core_boundaries() -> None:
    # pairs (i, i + 1) of 10 pixels at stride 4: borders where i + 1 is 4 or 8
    assert np.flatnonzero(border_mask(10, 4)).tolist() == [3, 7]
    # grid-matched control at token 2: i + 1 even but no border
    assert np.flatnonzero(control_mask(10, 4, token=2)).tolist() == [1, 5]
    with pytest.raises(ValueError, match="stride"):
        border_mask(10, 0)


def test_a_blocky_product_has_a_seam_ratio_above_one_and_a_smooth_one_does_not() -> None:
    rng = np.random.default_rng(0)
    size, stride = 128, 32
    noise = rng.normal(0, 0.1, (2, size, size))
    blocks = np.kron(rng.normal(0, 1, (4, 4)), np.ones((stride, stride)))  # one level a patch
    seamed = seam_stats(blocks[None] + noise, stride)
    assert seamed["ratio"] > 3
    assert seamed["ratio_grid"] > 3
    assert seamed["ratio_h"] > 3
    assert seamed["ratio_v"] > 3
    smooth = seam_stats(noise, stride)
    assert 0.9 < smooth["ratio"] < 1.1
    assert 0.9 < smooth["ratio_grid"] < 1.1
    # a class map split along one vertical border only: every change is at a border
    classes = np.zeros((size, size), dtype=np.uint8)
    classes[:, 64:] = 1
    split = seam_stats(classes, stride, classes=True)
    assert split["inside"] == 0
    assert split["ratio"] == math.inf
    assert split["border"] == pytest.approx(1 / 6, abs=1e-4)  # 1 of 3 borders, 1 axis of 2


def test_a_scene_without_a_border_is_refused() -> None:
    with pytest.raises(ValueError, match="no patch border"):
        seam_stats(np.zeros((1, 32, 32)), 32)


def test_the_quick_mode_writes_sane_figures(tmp_path: Path) -> None:
    out = tmp_path / "generation.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.generation", "--quick", "--no-docs", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["run"]["quick"] is True
    assert report["machine"]["cpu_model"]

    plan = {"tokens-s1grd", "tokens-lulc", "denoise-s1grd"}
    for row in report["throughput"]:
        assert row["model"] == "test-generate"
        assert row["patches"] >= 1
        assert row["patches_per_s"] > 0
        assert row["patch_steps_per_s"] > 0
        assert set(row["kinds"]) == plan
        # 2 token passes, then steps=2 runs 2 UNet calls: 4 patch-steps a patch
        assert row["patch_steps"] == row["patches"] * (2 + row["steps"])
        assert row["kinds"]["denoise-s1grd"]["patch_steps"] == row["patches"] * row["steps"]
    assert [r["px"] for r in report["throughput"]] == [64, 224]
    assert report["throughput"][0]["patches"] == 4  # 64 x 64 at stride 32

    chip = report["chip"]
    assert chip["steps"] == 50
    assert chip["seconds_per_chip"] > 0
    assert chip["seconds_per_chip"] == pytest.approx(
        chip["token_s_per_patch"] + 50 * chip["denoise_s_per_patch_step"], abs=0.1
    )

    batching = report["batching"]
    assert batching["requests"] == 8
    assert batching["concurrent"]["patches"] == batching["sequential"]["patches"] == 32
    assert 0 < batching["ratio"] < math.inf
    assert batching["same_bytes"] is True
    for kind, fill in batching["mean_fill"].items():
        # 32 patches at a cap of 16 fill the concurrent batches; one request's 4 a quarter
        assert fill["concurrent"] >= 0.5, kind
        assert 0 < fill["sequential"] <= 0.25, kind

    rows = report["seams"]["rows"]
    assert {(r["blend"], r["product"]) for r in rows} == {
        (b, p) for b in ("cosine", "center", "none") for p in ("s1grd", "lulc")
    }
    for r in rows:
        assert 0 < r["ratio"] < math.inf, r
        assert 0 < r["ratio_grid"] < math.inf, r
        assert r["border_pairs"] > 0
        assert r["stride"] == (64 if r["blend"] == "none" else 32)
