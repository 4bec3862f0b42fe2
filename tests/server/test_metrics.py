"""What ``/metrics`` counts from finished requests, over a real uvicorn on 127.0.0.1."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import numpy as np

from geoserve import Engine
from tests.conftest import write_geotiff
from tests.server.conftest import running_server


def nan_scene(path: Path, broken: int) -> Path:
    """A scene for "test-nan": the model returns NaN for its first ``broken`` pixels."""
    data = np.full((1, 20, 20), 5.0, np.float32)
    data.reshape(-1)[:broken] = 5e5
    return write_geotiff(path, data)


def nonfinite(url: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    return float(re.search(r"^geoserve_nonfinite_output_pixels (\S+)$", text, re.M).group(1))


def test_each_outcome_counts_its_own_nan_pixels_and_the_kinds_count_a_pixel_once(tmp_path):
    scenes = [str(nan_scene(tmp_path / f"{n}.tif", n)) for n in (6, 11)]
    out = tmp_path / "out"
    out.mkdir()
    with Engine("test-nan", output_kind="classes,polygons,confidence") as eng:
        results = eng.generate_image(scenes, output_path=out)  # (together, one engine)
        clean = eng.generate_image(str(nan_scene(tmp_path / "0.tif", 0)), output_path=out)
    assert [r.nonfinite_pixels for r in results] == [6, 11]
    assert clean.nonfinite_pixels == 0


def test_metrics_sum_the_nan_pixels_of_this_servers_requests(tmp_path):
    def post(url: str, broken: int) -> None:
        path = nan_scene(tmp_path / f"s{broken}.tif", broken)
        resp = httpx.post(f"{url}/v1/images", files={"file": ("s.tif", path.read_bytes())})
        assert resp.status_code == 200, resp.text

    with running_server(model="test-nan", warmup=False) as first:
        assert nonfinite(first) == 0
        post(first, 6)
        post(first, 11)
        assert nonfinite(first) == 17
    with running_server(model="test-nan", warmup=False) as second:
        post(second, 3)
        assert nonfinite(second) == 3  # its own requests' pixels, not the process's
