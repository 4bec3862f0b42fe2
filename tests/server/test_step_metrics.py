"""``/metrics``' step series of a stepped model, by step kind, over a real uvicorn on 127.0.0.1.

``test-steps`` (tests/stub_models.py) takes a "draw" step, then three "add" steps, per patch.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import httpx
import numpy as np

from tests.conftest import write_geotiff
from tests.server.conftest import running_server

STEP_SERIES = (
    "geoserve_step_batches_total",
    "geoserve_patch_steps_total",
    "geoserve_step_seconds_total",
    "geoserve_step_batch_fill_ratio",
)
#: Whole 16-pixel patches, none blended: a 48 x 32 scene is 3 x 2 = 6 patches.
GRID = {"patch_size": 16, "stride": 16, "blend": "none", "warmup": False}


def step_samples(url: str) -> dict[tuple[str, str], float]:
    """``/metrics``' step series: (name, kind) -> value."""
    text = httpx.get(f"{url}/metrics").text
    found = re.findall(r'^(geoserve_(?:step|patch_step)\w*)\{kind="(\w+)"\} (\S+)$', text, re.M)
    return {(name, kind): float(value) for name, kind, value in found}


def post(url: str, path: Path) -> None:
    resp = httpx.post(f"{url}/v1/images", files={"file": ("s.tif", path.read_bytes())}, timeout=60)
    assert resp.status_code == 200, resp.text


def test_metrics_count_the_steps_of_each_kind(tmp_path):
    rng = np.random.default_rng(3)
    path = write_geotiff(tmp_path / "s.tif", rng.integers(1, 400, (2, 48, 32)).astype(np.uint16))
    n, cap = 6, 4
    with running_server(model="test-steps", max_batch_patches=cap, **GRID) as url:
        zero = step_samples(url)
        assert set(zero) == {(s, k) for s in STEP_SERIES for k in ("draw", "add")}
        assert all(v == 0 for v in zero.values())  # there from the start, at zero
        post(url, path)
        got = step_samples(url)
        post(url, path)
        twice = step_samples(url)
    assert got[("geoserve_patch_steps_total", "draw")] == n
    assert got[("geoserve_patch_steps_total", "add")] == 3 * n
    assert got[("geoserve_step_batches_total", "draw")] >= math.ceil(n / cap)
    assert got[("geoserve_step_batches_total", "add")] >= math.ceil(3 * n / cap)
    for kind in ("draw", "add"):
        assert got[("geoserve_step_seconds_total", kind)] > 0
        assert 0 < got[("geoserve_step_batch_fill_ratio", kind)] <= 1
    # counters: a second request adds its own steps
    assert twice[("geoserve_patch_steps_total", "draw")] == 2 * n
    assert twice[("geoserve_patch_steps_total", "add")] == 6 * n


def test_a_one_pass_model_has_no_step_series(tmp_path):
    path = write_geotiff(tmp_path / "s.tif", np.full((3, 40, 40), 7, np.uint16))
    with running_server(model="test-seg", warmup=False) as url:
        post(url, path)
        text = httpx.get(f"{url}/metrics").text
    assert re.search(r"^geoserve_batches_total [1-9]", text, re.M)  # the model did run
    assert not any(series in text for series in STEP_SERIES)
