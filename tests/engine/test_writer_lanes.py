"""Several requests' rows written at once: each request's in order, none held up by another's.

The writer runs one lane per request on a small pool (:mod:`geoserve.engine.lanes`). A model
registered here has an output processor whose ``finalize`` (run on the writer, once per band
of rows) records the band's first row, blocks for a request named ``slow*`` until the test
releases it, and fails for one named ``bad*``. Everything goes through the public engine.
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch import nn

from geoserve import (
    INPUT_REGISTRY,
    MODEL_REGISTRY,
    OUTPUT_REGISTRY,
    Engine,
    GeoTiffPatcher,
    RawReassembler,
)
from geoserve.errors import OutputWriteError
from tests.conftest import read, write_geotiff

RELEASE = threading.Event()
#: (input stem, first image row of the band, rows in it), in the order the writer saw them.
SEEN: list[tuple[str, int, int]] = []


class LaneProbe(RawReassembler):
    """Records each band it finalizes; blocks for ``slow*`` inputs, fails for ``bad*`` ones."""

    def finalize(self, data: Any, valid: Any, ctx: Any) -> Any:
        name = Path(ctx.names[0]).stem
        SEEN.append((name, int(data[0, 0, 0]), data.shape[1]))  # band 0 holds the row index
        if name.startswith("slow") and not RELEASE.wait(60):
            raise RuntimeError("never released")
        if name.startswith("bad"):
            raise RuntimeError("this output cannot be written (test)")
        return super().finalize(data, valid, ctx)


@MODEL_REGISTRY.register_model("test-lanes")
@INPUT_REGISTRY.register_input_processor(GeoTiffPatcher(patch_size=16, stride=16, blend="none"))
@OUTPUT_REGISTRY.register_output_processor(LaneProbe())
class Identity(nn.Module):
    def forward(self, x: Any) -> Any:
        return x


def _scene(tmp_path: Path, name: str, height: int, width: int = 40, seed: int = 0) -> Path:
    """Band 0: each pixel's row index; bands 1, 2: seeded noise, 0 in a corner."""
    rows = np.broadcast_to(np.arange(height, dtype=np.uint16)[:, None], (height, width))
    noise = np.random.default_rng(seed).integers(1, 60000, (height, width), dtype=np.uint16)
    data = np.stack([rows, noise, noise[::-1]])
    data[1, :5, :5] = 0
    return write_geotiff(tmp_path / f"{name}.tif", data)


def _run_together(engine: Engine, jobs: dict[str, tuple[Path, Path]]) -> dict[str, Any]:
    ids = {
        engine.add_request(src, request_id=name, output_path=out)
        for name, (src, out) in jobs.items()
    }
    done: dict[str, Any] = {}
    while engine.has_unfinished():
        for result in engine.step():
            done[result.request_id] = result
    assert set(done) == ids
    return done


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    SEEN.clear()
    RELEASE.clear()
    yield
    RELEASE.set()


def test_the_innocent_request_finishes_while_a_slow_write_still_runs(tmp_path):
    # 3 bands of rows for the slow request: under MAX_PENDING_WRITES, so the model loop
    # itself never waits for its blocked writer (back-pressure is per request)
    slow_src, fast_src = _scene(tmp_path, "slow", 48), _scene(tmp_path, "fast", 64, seed=1)
    with Engine("test-lanes", max_batch_patches=4, warmup=False) as engine:
        engine.add_request(slow_src, request_id="slow", output_path=tmp_path / "slow_out.tif")
        engine.add_request(fast_src, request_id="fast", output_path=tmp_path / "fast_out.tif")
        done: dict[str, Any] = {}
        deadline = time.monotonic() + 20
        try:
            while "fast" not in done and time.monotonic() < deadline:
                for result in engine.step():
                    done[result.request_id] = result
            assert "fast" in done, "the fast request waited for the slow request's writer"
            assert done["fast"].ok, done["fast"].error
            assert "slow" not in done  # its first band is still being written
            assert any(name == "slow" for name, _, _ in SEEN)
        finally:
            RELEASE.set()
        while engine.has_unfinished():
            for result in engine.step():
                done[result.request_id] = result
    assert done["slow"].ok, done["slow"].error
    for name, src in (("slow", slow_src), ("fast", fast_src)):
        out, profile = read(tmp_path / f"{name}_out.tif")
        expected, source = read(src)
        np.testing.assert_array_equal(out, expected.astype(np.float32))
        assert (profile["crs"], profile["transform"]) == (source["crs"], source["transform"])


def test_a_failing_writer_fails_its_request_alone(tmp_path):
    bad, good = _scene(tmp_path, "bad", 64), _scene(tmp_path, "good", 80, seed=2)
    with Engine("test-lanes", max_batch_patches=4, warmup=False) as engine:
        done = _run_together(
            engine,
            {"bad": (bad, tmp_path / "bad_out.tif"), "good": (good, tmp_path / "good_out.tif")},
        )
    assert isinstance(done["bad"].error, OutputWriteError)
    assert "bad.tif" in str(done["bad"].error)  # names the input
    assert done["good"].ok, done["good"].error
    assert not (tmp_path / "bad_out.tif").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.tif", "good.tif", "good_out.tif"]
    np.testing.assert_array_equal(read(tmp_path / "good_out.tif")[0], read(good)[0])


@pytest.mark.parametrize(
    ("model", "kwargs"),
    [
        ("test-lanes", {}),
        ("identity", {"blend": "cosine", "patch_size": 16, "stride": 12}),
        ("test-seg", {"max_batch_patches": 1}),  # (one patch a batch: the same convolutions)
    ],
)
def test_requests_written_together_equal_each_written_alone(tmp_path, model, kwargs):
    kwargs = {"max_batch_patches": 4, "warmup": False, **kwargs}
    scenes = {f"s{i}": _scene(tmp_path, f"s{i}", 40 + 24 * i, 30 + 7 * i, seed=i) for i in range(4)}
    alone, together = tmp_path / "alone", tmp_path / "together"
    alone.mkdir()
    together.mkdir()
    for name, src in scenes.items():
        with Engine(model, **kwargs) as engine:
            engine.generate_image(src, output_path=alone / f"{name}.tif").raise_for_error()
    with Engine(model, **kwargs) as engine:
        done = _run_together(
            engine, {name: (src, together / f"{name}.tif") for name, src in scenes.items()}
        )
    assert all(r.ok for r in done.values()), [r.error for r in done.values()]
    for name in scenes:
        a, profile_a = read(alone / f"{name}.tif")
        b, profile_b = read(together / f"{name}.tif")
        np.testing.assert_array_equal(a, b)  # bit for bit
        assert profile_a == profile_b  # georeferencing, dtype, nodata, layout


def test_each_requests_rows_reach_the_writer_in_order(tmp_path):
    scenes = {f"o{i}": _scene(tmp_path, f"o{i}", 96 + 16 * i, seed=i) for i in range(3)}
    with Engine("test-lanes", max_batch_patches=2, warmup=False) as engine:
        done = _run_together(
            engine, {name: (src, tmp_path / f"{name}_out.tif") for name, src in scenes.items()}
        )
    assert all(r.ok for r in done.values())
    for name, src in scenes.items():
        bands = [(row, n) for seen, row, n in SEEN if seen == name]
        starts = [row for row, _ in bands]
        assert starts[0] == 0
        assert all(row + n == nxt for (row, n), nxt in zip(bands, starts[1:], strict=False))
        assert sum(n for _, n in bands) == read(src)[0].shape[1]


def test_lanes_keep_each_keys_order_skip_cancelled_tasks_and_carry_errors():
    from geoserve.engine.lanes import Lanes

    lanes = Lanes(3, "test-lanes")
    gate = threading.Event()
    order: dict[str, list[int]] = {"a": [], "b": []}

    def task(key: str, i: int) -> int:
        if key == "a" and i == 0:
            assert gate.wait(30)
        if i == 3:
            raise ValueError(f"{key} {i}")
        order[key].append(i)
        return i

    futs = {key: [lanes.submit(key, task, key, i) for i in range(6)] for key in order}
    assert futs["a"][2].cancel()  # waits behind a's blocked first task: skipped, not run
    for fut in futs["b"]:  # b's lane runs while a's first task still blocks
        with pytest.raises(ValueError) if fut is futs["b"][3] else contextlib.nullcontext():
            fut.result(timeout=30)
    assert not futs["a"][0].done()
    gate.set()
    lanes.close()  # waits for every queued task
    assert order == {"a": [0, 1, 4, 5], "b": [0, 1, 2, 4, 5]}
    assert futs["a"][5].result() == 5
    with pytest.raises(RuntimeError, match="closed"):
        lanes.submit("a", task, "a", 9)
