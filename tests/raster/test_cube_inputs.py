"""xarray DataArrays as inputs (the ``xarray`` extra): real models on real scenes.

A DataArray (band, [time,] y, x) with its CRS and transform set the rioxarray way gives the
same outputs as the GeoTIFF of the same pixels; its ``band`` coord names bands as a GeoTIFF's
descriptions do; its ``time`` coord gives a multi-date model its dates; a Dask-backed one is
computed only chunk row by chunk row, never whole.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import rasterio
import rioxarray
import xarray as xr

from geoserve import Engine
from geoserve.errors import BandMismatchError, InputError
from geoserve.raster.source import open_raster
from tests.conftest import UTM_TRANSFORM
from tests.cubes import REPO, dataarray, lazy_cube, scene_cube, write_scene_corner


@pytest.fixture(scope="module")
def ndwi():
    with Engine("ndwi-water") as eng:
        yield eng


def test_a_dataarray_gives_what_its_geotiff_gives(ndwi, tmp_path):
    cube = scene_cube()
    tif = write_scene_corner(tmp_path / "corner.tif")
    from_cube = ndwi.generate_image(cube, output_path=tmp_path / "cube.tif")
    from_file = ndwi.generate_image(tif, output_path=tmp_path / "file.tif")
    with rasterio.open(from_cube.outputs.path) as a, rasterio.open(from_file.outputs.path) as b:
        assert a.crs == b.crs
        assert a.transform == b.transform
        got, want = a.read(), b.read()
    assert (got == want).all()
    assert 0 < (want == 1).sum() < want.size  # (water and land both: a real comparison)


def test_band_names_come_from_the_band_coord_or_rioxarrays_long_name(ndwi, tmp_path):
    tif = write_scene_corner(tmp_path / "corner.tif")
    want = ndwi.generate_image(tif, out_format="tensor").outputs.tensor.numpy()
    opened = rioxarray.open_rasterio(tif)  # band coord 1..13, names in long_name
    assert opened.coords["band"].values.tolist() == list(range(1, 14))
    got = ndwi.generate_image(opened, out_format="tensor").outputs.tensor.numpy()
    assert (got == want).all()
    # neither: numbered bands only, and ndwi-water reads B3 and B8 by name
    nameless = scene_cube().assign_coords(band=list(range(1, 14)))
    with pytest.raises(BandMismatchError, match="B3"):
        ndwi.generate_image(nameless, out_format="tensor")


def test_a_dask_cube_computes_only_the_chunks_a_row_needs():
    calls: list[tuple[int, int, int]] = []
    cube = lazy_cube(2, 2048, 1536, chunk=256, calls=calls)
    with open_raster(cube) as src:
        assert src.block_rows == 256
        rows = src.read_rows(300, 420, [0, 1])
    assert sorted(calls) == [(0, 256, c) for c in range(0, 1536, 256)]  # one chunk row
    assert rows.shape == (2, 120, 1536)
    assert (rows == cube.values[:, 300:420]).all()


def test_a_dask_cube_runs_a_grid_row_at_a_time_and_equals_its_numpy_twin():
    calls: list[tuple[int, int, int]] = []
    cube = lazy_cube(1, 1024, 512, chunk=128, calls=calls)
    with Engine("test-box", max_batch_patches=64) as eng:
        lazy = eng.generate_image(cube, out_format="tensor").outputs.tensor.numpy()
        total_chunks = len(calls)
        eager = eng.generate_image(cube.compute(), out_format="tensor").outputs.tensor.numpy()
    assert (lazy == eager).all()
    per_chunk = {c: calls[:total_chunks].count(c) for c in set(calls[:total_chunks])}
    assert len(per_chunk) == (1024 // 128) * (512 // 128)  # every chunk, ...
    # ... each computed only for the grid rows that overlap it (32 px patches, stride 24):
    # at most 128 / 24 + 2 of them, never once for the whole cube
    assert max(per_chunk.values()) <= 128 // 24 + 2


def test_time_coord_gives_a_multi_date_model_its_dates():
    days = np.array(["2021-05-01T10:20:00", "2021-06-01"], dtype="datetime64[ns]")
    data = np.ones((1, 2, 16, 16), np.int16)
    cube = xr.DataArray(
        data,
        dims=("band", "time", "y", "x"),
        coords={
            "time": days,
            "x": UTM_TRANSFORM.c + 10 * (np.arange(16) + 0.5),
            "y": UTM_TRANSFORM.f - 10 * (np.arange(16) + 0.5),
        },
    ).rio.write_crs("EPSG:32633")
    with Engine("test-coords") as eng:
        t = eng.generate_image(cube, out_format="tensor").outputs.tensor.numpy()
        seen = [(int(t[2, 0, 0]), int(t[3, 0, 0])), (int(t[4, 0, 0]), int(t[5, 0, 0]))]
        assert seen == [(2021, 121), (2021, 152)]
        # explicit dates still win over the cube's
        t = eng.generate_image(cube, out_format="tensor", dates=["2020-01-02", "2020-01-03"])
        assert int(t.outputs.tensor[3, 0, 0]) == 2


@pytest.mark.parametrize(
    ("cube", "message"),
    [
        (
            xr.DataArray(np.ones((2, 1, 8, 8)), dims=("band", "level", "y", "x")),
            "expected \\(band, \\[time,\\] y, x\\), not 'level'",
        ),
        (xr.DataArray(np.ones((2, 8, 8)), dims=("band", "row", "col")), "no spatial dims"),
        (
            xr.DataArray(np.ones((2, 8, 8), dtype=bool), dims=("band", "y", "x")),
            "data type bool is not supported",
        ),
    ],
)
def test_bad_cubes_are_refused_by_name(ndwi, cube, message):
    with pytest.raises(InputError, match=message):
        ndwi.generate_image(cube.rename("scene"), out_format="tensor")


def test_a_time_series_cube_inside_a_list_is_refused(ndwi):
    cube = scene_cube(32, 32).expand_dims(time=np.array(["2020-01-01", "2020-02-01"], "M8[ns]"))
    cube = cube.transpose("band", "time", "y", "x")
    with pytest.raises(InputError, match="2 dates on its time dim inside a list"):
        ndwi.generate_image([[cube]], out_format="tensor")[0].raise_for_error()


def test_geoserve_imports_no_xarray():
    code = (
        "import sys, numpy as np, warnings\n"
        "import geoserve\n"
        "from geoserve import Engine, RasterArray\n"
        "import geoserve.engine, geoserve.raster.source, geoserve.schemas, geoserve.cli\n"
        "warnings.simplefilter('ignore')\n"
        "out = Engine('identity').generate_image(RasterArray(np.ones((1, 8, 8), 'f4')),"
        " out_format='tensor')\n"
        "assert out.ok\n"
        "print(sorted(m for m in ('xarray', 'rioxarray', 'dask') if m in sys.modules))\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "[]"


def test_the_cubes_crs_transform_and_band_names_are_read():
    names = scene_cube().band.values
    cube = dataarray(np.ones((13, 32, 32), np.uint16), UTM_TRANSFORM, bands=names)
    with open_raster(cube) as src:
        assert src.info.transform == UTM_TRANSFORM
        assert src.info.crs == rasterio.crs.CRS.from_epsg(32633)
        assert src.info.descriptions[2] == "B3"


def test_a_cube_is_a_modality_of_a_dict_request(tmp_path):
    tif = write_scene_corner(tmp_path / "corner.tif", 96, 128)
    with Engine("s1s2-water") as eng:
        want = eng.generate_image({"s2": tif}, out_format="tensor").outputs.tensor.numpy()
        got = eng.generate_image({"s2": scene_cube(96, 128)}, out_format="tensor")
    assert (got.outputs.tensor.numpy() == want).all()
