"""Temporary output names: one prefix, one suffix, whatever writes by way of what."""

from __future__ import annotations

import re

import numpy as np

from geoserve import Engine, RequestSpec
from geoserve.raster import tempfiles

#: ``.<target>.<host>-<pid>-<random>.tmp``, the target itself no temporary.
ONE_PREFIX = r"\.{name}\.[A-Za-z0-9]+-\d+-[0-9a-f]{{8}}\.tmp"


def test_a_temporary_of_a_temporary_is_named_after_the_final_target(tmp_path):
    target = tmp_path / "water_polygons.parquet"
    first = tempfiles.new_temporary(target)
    second = tempfiles.new_temporary(first)
    for tmp in (first, second):
        assert re.fullmatch(ONE_PREFIX.format(name=re.escape(target.name)), tmp.name), tmp.name
        tempfiles.release(tmp, remove=True)
    assert first != second


def test_a_polygons_output_being_written_has_single_prefix_temporaries(make_geotiff, tmp_path):
    """Its class map is written (by way of a temporary) to a temporary of the vector file."""
    blocks = np.random.default_rng(2).integers(1, 600, size=(3, 8, 8)).astype("uint16")
    data = blocks.repeat(32, axis=1).repeat(32, axis=2)  # regions a tracer takes in its stride
    scene = make_geotiff(data=data, name="scene.tif")
    out = tmp_path / "out"
    out.mkdir()
    target = out / "scene_polygons.parquet"
    seen: set[str] = set()
    with Engine("test-seg", output_kind="polygons", max_batch_patches=1, prefetch=False) as eng:
        eng.admit(eng.prepare_request(RequestSpec(scene, request_id="p", output_path=target)))
        while eng.has_unfinished():
            eng.step()
            seen |= {p.name for p in out.iterdir() if p.name.startswith(".")}
    assert seen, "no temporary was seen while the output was written"
    pattern = ONE_PREFIX.format(name=re.escape(target.name))
    assert all(re.fullmatch(pattern, name) for name in seen), sorted(seen)
    assert sorted(p.name for p in out.iterdir()) == [target.name]
