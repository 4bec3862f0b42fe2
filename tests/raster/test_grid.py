import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geoserve.errors import ConfigError
from geoserve.raster.grid import BLEND_MODES, PatchGrid, reflect_indices


@st.composite
def grids(draw):
    patch = draw(st.integers(1, 48))
    stride = draw(st.integers(1, patch))
    blend = draw(st.sampled_from(["center", "mean", "cosine"]))
    h = draw(st.integers(1, 130))
    w = draw(st.integers(1, 130))
    return PatchGrid(h, w, patch, stride, blend)


@settings(max_examples=200, deadline=None)
@given(grids())
def test_cores_cover_every_pixel_exactly_once(grid):
    count = np.zeros((grid.height, grid.width), dtype=int)
    for r, c in grid.indices():
        win = grid.core_window(r, c)
        assert win.height > 0
        assert win.width > 0
        count[win.row_off : win.row_off + win.height, win.col_off : win.col_off + win.width] += 1
    assert (count == 1).all()


@settings(max_examples=200, deadline=None)
@given(grids())
def test_core_lies_inside_its_patch_with_margin(grid):
    for r, c in grid.indices():
        win, core = grid.window(r, c), grid.core_window(r, c)
        assert core.row_off - win.row_off == grid.margin
        assert core.col_off - win.col_off == grid.margin
        assert core.row_off + core.height <= win.row_off + win.height
        assert core.col_off + core.width <= win.col_off + win.width


@pytest.mark.parametrize(
    ("h", "w"), [(224, 224), (223, 224), (225, 224), (1, 500), (500, 1), (1, 1), (100, 300)]
)
def test_edge_sizes_covered(h, w):
    grid = PatchGrid(h, w, 224, 192, "cosine")
    covered = np.zeros((h, w), dtype=bool)
    for r, c in grid.indices():
        win = grid.window(r, c)
        r0, c0 = max(win.row_off, 0), max(win.col_off, 0)
        covered[r0 : win.row_off + 224, c0 : win.col_off + 224] = True
    assert covered.all()


@pytest.mark.parametrize("blend", BLEND_MODES)
def test_weights_are_positive_where_used_and_partition_constant(blend):
    stride = 16 if blend == "none" else 12
    grid = PatchGrid(50, 47, 16, stride, blend)
    w = grid.weights()
    assert w.shape == (16, 16)
    assert w.dtype == np.float32
    assert not w.flags.writeable
    total = np.zeros((50, 47))
    for r, c in grid.indices():
        r0, c0 = grid.origin(r, c)
        rs, cs = max(r0, 0), max(c0, 0)
        total[rs : r0 + 16, cs : c0 + 16] += w[rs - r0 : 50 - r0, cs - c0 : 47 - c0][
            : min(16, 50 - rs, r0 + 16 - rs), : min(16, 47 - cs, c0 + 16 - cs)
        ]
    assert (total > 0).all()
    if blend in ("center", "none"):
        assert (total == 1).all()


def test_cosine_weights_taper_to_floor_not_zero():
    w = PatchGrid(100, 100, 32, 24, "cosine").weights()
    assert w.min() > 0
    assert w[16, 16] == pytest.approx(1.0)
    assert w[0, 16] < 0.05


@pytest.mark.parametrize(
    ("kwargs", "msg"),
    [
        ({"patch_size": 0, "stride": 1, "blend": "center"}, "patch_size"),
        ({"patch_size": 8, "stride": 9, "blend": "center"}, "stride"),
        ({"patch_size": 8, "stride": 4, "blend": "none"}, "blend 'none'"),
        ({"patch_size": 8, "stride": 4, "blend": "gauss"}, "invalid blend"),
    ],
)
def test_invalid_tiling_rejected(kwargs, msg):
    with pytest.raises(ConfigError, match=msg):
        PatchGrid(10, 10, **kwargs)


def test_reflect_indices_mirror_and_stay_in_range():
    assert reflect_indices(-3, 10, 5).tolist() == [3, 2, 1, 0, 1, 2, 3, 4, 3, 2]
    assert reflect_indices(0, 4, 1).tolist() == [0, 0, 0, 0]
    idx = reflect_indices(-50, 200, 7)
    assert idx.min() >= 0
    assert idx.max() <= 6
