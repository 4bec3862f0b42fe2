"""Stage timings say where a request's time went, thread by thread (issue: a GPU run's
timings were blind: ``read`` counted only the main thread's wait, the readers' work nowhere)."""

from __future__ import annotations

import numpy as np
import pytest

from geoserve import Engine, StageTimings
from tests.conftest import write_geotiff

pytestmark = pytest.mark.filterwarnings("ignore::geoserve.errors.NotGeoreferencedWarning")


@pytest.mark.parametrize("prefetch", [True, False])
def test_readers_writer_and_main_thread_are_each_timed(tmp_path, prefetch):
    data = np.random.default_rng(0).integers(1, 4000, (3, 150, 140)).astype("uint16")
    path = write_geotiff(tmp_path / "in.tif", data)
    with Engine("test-seg", prefetch=prefetch, read_workers=2) as engine:
        t = engine.generate_image(path, output_path=tmp_path / "o.tif").raise_for_error().timings
    assert set(vars(t)) == set(StageTimings.STAGES)
    # the rows were read (fetched and cut) by someone, the writer made class maps of them
    for stage in ("read_busy", "finalize", "write", "stitch", "model"):
        assert getattr(t, stage) > 0, stage
    assert t.device == 0.0  # a CPU run has no CUDA events
    if not prefetch:  # read on the main thread: all of its reading is waiting for rows
        assert t.read >= t.read_busy * 0.99
    assert t.total == pytest.approx(
        t.read + t.model + t.device_wait + t.stitch + t.finalize + t.write
    )
