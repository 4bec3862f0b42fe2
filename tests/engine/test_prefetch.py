"""The row prefetcher: in order, bounded, one read at a time per request, clean close."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from geoserve import Engine
from geoserve.engine.prefetch import RowPrefetcher
from geoserve.errors import ConfigError


class Recorder:
    def __init__(self, delay: float = 0.0, fail_at: int | None = None) -> None:
        self.delay, self.fail_at = delay, fail_at
        self.active = self.most_active = 0
        self.started: list[int] = []
        self.lock = threading.Lock()

    def __call__(self, row: int) -> int:
        with self.lock:
            self.active += 1
            self.most_active = max(self.most_active, self.active)
            self.started.append(row)
        time.sleep(self.delay)
        with self.lock:
            self.active -= 1
        if row == self.fail_at:
            raise OSError(f"row {row} is corrupt")
        return row * 10


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_rows_arrive_in_order_one_read_at_a_time(depth):
    read = Recorder(delay=0.002)
    with ThreadPoolExecutor(4) as pool:
        rows = RowPrefetcher(read, 20, pool, depth)
        rows.start()
        got = [rows.next() for _ in range(20)]
    assert got == [r * 10 for r in range(20)]
    assert read.started == list(range(20))  # each row read once, in order
    assert read.most_active == 1  # never two reads of one request at once


def test_reads_ahead_up_to_depth_while_the_consumer_is_busy():
    read = Recorder()
    with ThreadPoolExecutor(2) as pool:
        rows = RowPrefetcher(read, 10, pool, depth=3)
        rows.start()
        deadline = time.monotonic() + 5
        while rows.ready < 3 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert rows.ready == 3
        time.sleep(0.02)
        assert read.started == [0, 1, 2]  # bounded: no more than depth rows ahead
        assert rows.next() == 0
        deadline = time.monotonic() + 5
        while len(read.started) < 4 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert read.started == [0, 1, 2, 3]
        rows.close()


def test_a_failed_read_reaches_the_consumer_and_stops_reading():
    read = Recorder(fail_at=2)
    with ThreadPoolExecutor(2) as pool:
        rows = RowPrefetcher(read, 10, pool, depth=4)
        rows.start()
        assert [rows.next(), rows.next()] == [0, 10]
        with pytest.raises(OSError, match="row 2 is corrupt"):
            rows.next()
        time.sleep(0.02)
        assert max(read.started) == 2


def test_close_waits_for_the_read_in_progress():
    read = Recorder(delay=0.05)
    with ThreadPoolExecutor(2) as pool:
        rows = RowPrefetcher(read, 10, pool, depth=2)
        rows.start()
        time.sleep(0.01)
        rows.close()
        assert read.active == 0
        started = len(read.started)
        time.sleep(0.1)
        assert len(read.started) == started


@pytest.mark.parametrize(("knob", "value"), [("read_workers", 0), ("prefetch_rows", -1)])
def test_bad_pipeline_knobs_are_config_errors(knob, value):
    with pytest.raises(ConfigError, match=knob):
        Engine("identity", **{knob: value})


@pytest.mark.parametrize(("workers", "depth"), [(1, 0), (1, 1), (3, 4)])
def test_results_do_not_depend_on_pipeline_knobs(make_geotiff, workers, depth):
    paths = [make_geotiff(bands=3, height=90 + 7 * i, width=61) for i in range(3)]
    with Engine("test-seg", max_batch_patches=7) as ref_engine:
        ref = [o.outputs.tensor for o in ref_engine.generate_image(paths, out_format="tensor")]
    with Engine(
        "test-seg", max_batch_patches=7, read_workers=workers, prefetch_rows=depth
    ) as engine:
        out = [o.outputs.tensor for o in engine.generate_image(paths, out_format="tensor")]
    for a, b in zip(ref, out, strict=True):
        assert a.equal(b)
