"""WarpedSource's fast warp gives the exact warp's values, bit for bit.

A float input is warped first without a destination nodata value (GDAL's fast kernels), and
the pixels that warp leaves at 0 or NaN are read again from the exact warp (destination nodata
NaN). The reference here is a plain WarpedVRT with the exact warp's settings, read in the same
full-width bands of rows as the engine reads them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import rasterio
from rasterio.vrt import WarpedVRT
from rasterio.windows import Window

from geoserve.raster import open_raster
from geoserve.raster.align import (
    RESAMPLINGS,
    WARP_TOLERANCE,
    TargetGrid,
    WarpedSource,
    resampling_of,
    source_nodata,
)
from tests.multimodal_scenes import S2_CRS, s2_transform, write_s1

SIZE = 1100  # the S2 grid: three block columns of the warper (512 px), the last one partial


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """S1 over 60 % of the grid; with NaN holes; without a nodata tag and with zeros; and an
    int16 input with a nodata value (which takes the exact warp alone)."""
    root = tmp_path_factory.mktemp("fastwarp")
    s1 = write_s1(root / "s1.tif", SIZE, cover=0.6)
    with rasterio.open(s1) as src:
        profile, data = src.profile, src.read()
    holes = data.copy()
    holes[:, 100:160, 200:270] = np.nan
    holes[0, 300:306, :] = np.nan  # one band only
    holes[:, :, 5] = np.nan
    with rasterio.open(root / "holes.tif", "w", **profile) as dst:
        dst.write(holes)
    zeros = np.nan_to_num(holes, nan=0.0)
    zeros[:, 400:420, :] = 0.0
    with rasterio.open(root / "zeros.tif", "w", **{**profile, "nodata": None}) as dst:
        dst.write(zeros)
    dem = np.round(data[:1] * 10).astype(np.int16)
    dem[:, 50:70, 40:90] = -32768
    with rasterio.open(
        root / "dem.tif", "w", **{**profile, "count": 1, "dtype": "int16", "nodata": -32768}
    ) as dst:
        dst.write(dem)
    return {
        "s1": s1,
        "holes": root / "holes.tif",
        "zeros": root / "zeros.tif",
        "dem": root / "dem.tif",
    }


def _grids(path: Path) -> dict[str, TargetGrid]:
    with open_raster(path) as src:
        info = src.info
    return {
        "s2": TargetGrid(S2_CRS, s2_transform(), SIZE, SIZE),
        "laea-17m": TargetGrid.covering(info, "EPSG:3035", 17.0),
    }


def _exact(
    path: Path, grid: TargetGrid, resampling: str, rows: list[tuple[int, int]]
) -> np.ndarray:
    """The exact warp (destination nodata NaN), as WarpedSource read before the fast path."""
    with open_raster(path) as src:
        nodata = source_nodata(src.info)
    with (
        rasterio.open(path) as ds,
        WarpedVRT(
            ds,
            crs=grid.crs,
            transform=grid.transform,
            width=grid.width,
            height=grid.height,
            resampling=resampling_of(resampling),
            src_nodata=nodata,
            nodata=np.nan,
            dtype="float32",
            tolerance=WARP_TOLERANCE,
            warp_extras={"NUM_THREADS": 1},
        ) as vrt,
    ):
        bands = list(range(1, ds.count + 1))
        return np.concatenate(
            [vrt.read(bands, window=Window(0, a, grid.width, b - a)) for a, b in rows], axis=1
        )


def _row_bands(height: int) -> list[tuple[int, int]]:
    """Overlapping bands of 224 rows every 196 (the engine's reads), then single rows."""
    bands = [(r, min(height, r + 224)) for r in range(0, height, 196)]
    return bands + [(0, 1), (height // 2, height // 2 + 1), (height - 1, height)]


CASES = [("holes", r) for r in RESAMPLINGS] + [
    (name, r) for name in ("s1", "zeros", "dem") for r in ("bilinear", "nearest")
]


@pytest.mark.parametrize(("name", "resampling"), CASES)
def test_warped_source_equals_the_exact_warp_bitwise(inputs, name, resampling):
    path = inputs[name]
    for label, grid in _grids(path).items():
        rows = _row_bands(grid.height)
        src = WarpedSource(open_raster(path), grid, resampling)
        try:
            assert (src._fast is not None) == (name != "dem")  # floats take the fast warp
            bands = list(range(src.info.count))
            got = np.concatenate([src.read_rows(a, b, bands) for a, b in rows], axis=1)
        finally:
            src.close()
        want = _exact(path, grid, resampling, rows)
        assert np.isnan(want).any(), label  # the input's edges are inside the grid
        assert not np.isnan(want).all(), label
        np.testing.assert_array_equal(got, want, err_msg=f"{name} {resampling} on {label}")
