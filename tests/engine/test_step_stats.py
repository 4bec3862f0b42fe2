"""Step statistics of a stepped model, per step kind: batches, patch-steps, seconds, fill.

``test-steps`` (tests/stub_models.py) takes a "draw" step, then three "add" steps, per patch.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from geoserve import Engine
from geoserve.engine.stepping import StepKindStats, StepStats

#: Whole 16-pixel patches, none blended: a 48 x 32 scene is 3 x 2 = 6 patches.
GRID = {"patch_size": 16, "stride": 16, "blend": "none"}


def _scene(make_geotiff, height: int, width: int):
    rng = np.random.default_rng(height * 1000 + width)
    return make_geotiff(data=rng.integers(1, 400, (2, height, width)).astype(np.uint16))


def test_a_request_of_n_patches_counts_each_kind_of_its_plan(make_geotiff):
    path = _scene(make_geotiff, 48, 32)
    with Engine("test-steps", max_batch_patches=4, **GRID) as engine:
        stats = engine.step_stats
        assert stats is not None
        before = stats.snapshot()
        assert list(before) == ["draw", "add"]  # the plan's kinds, in order, at zero
        assert all(k == StepKindStats() for k in before.values())  # the warm-up is not counted
        out = engine.generate_image(path, out_format="tensor", seed=5)
        kinds = stats.snapshot()
    n = out.num_patches
    assert n == 6
    cap = 4
    assert kinds["draw"].patch_steps == n
    assert kinds["add"].patch_steps == 3 * n
    assert sum(k.patch_steps for k in kinds.values()) == len(("draw", "add", "add", "add")) * n
    assert kinds["draw"].batches >= math.ceil(n / cap)
    assert kinds["add"].batches >= math.ceil(3 * n / cap)
    for k in kinds.values():
        assert 0 < k.mean_fill <= 1
        assert k.seconds > 0
        assert k.steps_per_second == pytest.approx(k.patch_steps / k.seconds)
        # a batch holds at most the cap, and at least one patch
        assert k.patch_steps / cap <= k.batches <= k.patch_steps
        assert k.mean_fill == pytest.approx(k.fill / k.batches)


def test_counts_add_up_over_requests_batched_together(make_geotiff):
    paths = [_scene(make_geotiff, 16 * (i + 1), 32) for i in range(3)]  # 2, 4 and 6 patches
    with Engine("test-steps", max_batch_patches=8, **GRID) as engine:
        outs = engine.generate_image(paths, out_format="tensor")
        kinds = engine.step_stats.snapshot()  # type: ignore[union-attr]
    n = sum(o.num_patches for o in outs)
    assert n == 12
    assert (kinds["draw"].patch_steps, kinds["add"].patch_steps) == (n, 3 * n)
    for k in kinds.values():
        assert math.ceil(k.patch_steps / 8) <= k.batches <= k.patch_steps
        # each batch's fill is its own size over the cap: they sum to patch-steps / cap
        assert k.fill == pytest.approx(k.patch_steps / 8)


def test_a_batch_of_one_fills_one_cap_exactly(make_geotiff):
    path = _scene(make_geotiff, 16, 16)
    with Engine("test-steps", max_batch_patches=1, **GRID) as engine:
        engine.generate_image(path, out_format="tensor")
        kinds = engine.step_stats.snapshot()  # type: ignore[union-attr]
    assert kinds["draw"] == StepKindStats(1, 1, kinds["draw"].seconds, 1.0)
    assert (kinds["add"].batches, kinds["add"].patch_steps, kinds["add"].mean_fill) == (3, 3, 1.0)


def test_a_failed_step_counts_nothing(make_geotiff):
    # a patch over 1e5 makes test-steps' step at index 2 raise: that request fails alone
    poisoned = make_geotiff(data=np.full((2, 16, 16), 2e5, np.float32))
    with Engine("test-steps", max_batch_patches=4, **GRID) as engine:
        out = engine.generate_image([poisoned], out_format="tensor")[0]
        kinds = engine.step_stats.snapshot()  # type: ignore[union-attr]
    assert out.error is not None
    assert kinds["draw"].patch_steps == 1
    assert kinds["add"].patch_steps == 1  # the step at index 1 ran; the one at 2 failed


def test_a_one_pass_model_has_no_step_stats(make_geotiff):
    path = make_geotiff(bands=3, height=40, width=40)
    with Engine("test-seg", max_batch_patches=4) as engine:
        engine.generate_image(path, out_format="tensor")
        assert engine.step_stats is None
        assert engine.runner.step_stats is None


def test_step_stats_are_read_whole_while_recorded():
    stats = StepStats(("a", "b"))
    stats.record("a", 3, 0.5, 4)
    stats.record("a", 4, 0.5, 4)
    snap = stats.snapshot()
    stats.record("a", 1, 1.0, 4)  # a snapshot does not move with later steps
    assert snap["a"] == StepKindStats(2, 7, 1.0, 0.75 + 1.0)
    assert snap["a"].steps_per_second == 7.0
    assert snap["a"].mean_fill == pytest.approx(0.875)
    assert snap["b"] == StepKindStats()
    assert (snap["b"].steps_per_second, snap["b"].mean_fill) == (0.0, 0.0)
