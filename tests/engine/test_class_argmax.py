"""The class map's argmax: the same classes as numpy's, ties to the first, nodata at NaN/inf."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from geoserve import SegmentationReassembler
from geoserve.processors.base import RasterContext
from geoserve.raster.grid import PatchGrid


def _ctx(h: int, w: int) -> RasterContext:
    return RasterContext(
        grid=PatchGrid(h, w, 8, 8, "none"),
        names=("x",),
        bands=(0,),
        band_names=("b",),
        profile={},
        has_nodata=False,
        model_kwargs={},
    )


@settings(max_examples=80, deadline=None)
@given(
    classes=st.sampled_from([1, 2, 3, 7, 254, 256]),
    h=st.integers(1, 9),
    w=st.integers(1, 9),
    levels=st.sampled_from([3, 1000]),  # few levels: many ties
    holes=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_class_map_equals_numpy_argmax(classes, h, w, levels, holes, seed):
    rng = np.random.default_rng(seed)
    x = (rng.integers(0, levels, (classes, h, w)) / 7).astype(np.float32)
    x[rng.random(x.shape) < 0.1] *= -0.0 if levels == 3 else 1  # -0.0 ties 0.0
    if holes:
        x[rng.random(x.shape) < 0.1] = rng.choice([np.nan, np.inf, -np.inf])
    proc = SegmentationReassembler(classes=tuple(f"c{i}" for i in range(classes)))
    out = proc.finalize(x, None, _ctx(h, w))
    dtype = np.uint8 if classes < 255 else np.uint16
    nodata = np.iinfo(dtype).max
    want = x.argmax(axis=0).astype(dtype)
    want[~np.isfinite(x).all(axis=0)] = nodata
    assert out.data.dtype == dtype
    np.testing.assert_array_equal(out.data[0], want)
