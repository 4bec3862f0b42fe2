"""One windowed read for every kind of source: ``RasterSource.read`` and what is built on it.

Every source (a tiled or striped file, a window of a file, bytes, an array, a warped input, a
stack) reads a window exactly as the same slice of its whole array; reduced reads pick the
pixels GDAL picks; masks are GDAL's; lazy arrays are sliced, never loaded whole.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rasterio
from affine import Affine
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rasterio.enums import ColorInterp, Resampling
from rasterio.windows import Window

from geoserve import Engine, RasterArray
from geoserve.errors import InputError
from geoserve.raster.align import StackedSource, TargetGrid, WarpedSource
from geoserve.raster.source import NamedBytes, RasterSource, RasterWindow, open_raster
from geoserve.raster.thumbnail import read_thumbnail
from tests.conftest import UTM_TRANSFORM, write_geotiff

BANDS, HEIGHT, WIDTH = 3, 150, 130
PROFILE = {"crs": "EPSG:32633", "transform": UTM_TRANSFORM}
#: The window of the file a RasterWindow source shows (col, row, width, height).
CUT = Window(17, 9, 90, 120)


def _scene() -> np.ndarray:
    rng = np.random.default_rng(7)
    data = rng.integers(1, 60000, (BANDS, HEIGHT, WIDTH), dtype=np.uint16)
    data[:, :12, :20] = 0  # a nodata corner
    return data


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> tuple[np.ndarray, dict[str, Path]]:
    """The same pixels as a tiled and a striped GeoTIFF (nodata 0)."""
    root = tmp_path_factory.mktemp("windowed")
    data = _scene()
    tiled = write_geotiff(
        root / "tiled.tif", data, nodata=0, tiled=True, blockxsize=32, blockysize=32
    )
    striped = write_geotiff(root / "striped.tif", data, nodata=0, blockysize=7)
    return data, {"tiled": tiled, "striped": striped}


KINDS = ("tiled", "striped", "window", "bytes", "array", "warped", "stacked")


@contextlib.contextmanager
def opened(kind: str, scene: tuple[np.ndarray, dict[str, Path]]) -> Iterator[RasterSource]:
    """A source of ``kind`` over the scene."""
    data, paths = scene
    if kind in ("tiled", "striped"):
        src = open_raster(paths[kind])
    elif kind == "window":
        src = open_raster(RasterWindow(str(paths["tiled"]), CUT, "cut"))
    elif kind == "bytes":
        src = open_raster(NamedBytes(paths["tiled"].read_bytes(), "scene.tif"))
    elif kind == "array":
        src = open_raster(RasterArray(data, {**PROFILE, "nodata": 0}))
    elif kind == "warped":  # onto a grid at 15 m, shifted: every pixel resampled
        grid = TargetGrid(
            "EPSG:32633", UTM_TRANSFORM @ Affine.translation(3.3, 2.7) @ Affine.scale(1.5), 80, 90
        )
        src = WarpedSource(open_raster(paths["striped"]), grid, "bilinear")
    else:
        parts = [open_raster(paths["tiled"]), open_raster(RasterArray(data[::-1], PROFILE))]
        src = StackedSource(parts, "stack", bands=[[0, 2], None])
    with src:
        yield src


def whole(kind: str, src: RasterSource, data: np.ndarray) -> np.ndarray:
    """The source's whole array, as its rows read it."""
    if kind in ("tiled", "striped", "bytes", "array"):
        return data
    if kind == "window":
        return data[
            :, CUT.row_off : CUT.row_off + CUT.height, CUT.col_off : CUT.col_off + CUT.width
        ]
    return np.array(src.read_rows(0, src.info.height, range(src.info.count)))


def windows(height: int, width: int) -> st.SearchStrategy[Window]:
    return st.tuples(st.integers(0, height - 1), st.integers(0, width - 1)).flatmap(
        lambda rc: st.builds(
            Window,
            st.just(rc[1]),
            st.just(rc[0]),
            st.integers(1, width - rc[1]),
            st.integers(1, height - rc[0]),
        )
    )


SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.mark.parametrize("kind", KINDS)
def test_a_window_is_the_same_slice_of_the_whole_array(kind, scene):
    with opened(kind, scene) as src:
        full = whole(kind, src, scene[0])
        info = src.info

        @SETTINGS
        @given(data=st.data())
        def check(data: st.DataObject) -> None:
            window = data.draw(windows(info.height, info.width))
            bands = data.draw(st.lists(st.integers(0, info.count - 1), min_size=1, max_size=4))
            got = src.read(window, bands)
            r, c = int(window.row_off), int(window.col_off)
            want = full[bands, r : r + int(window.height), c : c + int(window.width)]
            assert got.dtype == np.dtype(info.dtype)
            np.testing.assert_array_equal(got, want)

        check()


@pytest.mark.parametrize("kind", ["warped", "stacked"])
def test_a_reduced_read_of_any_source_picks_gdals_nearest_samples(kind, scene):
    with opened(kind, scene) as src:
        full = whole(kind, src, scene[0])
        window = Window(5, 3, src.info.width - 9, src.info.height - 4)
        got = src.read(window, [0, 1], out_shape=(17, 29))
    # the pixels GDAL's nearest-neighbour read takes: floor((i + 0.5) * size / out)
    rows = 3 + np.floor((np.arange(17) + 0.5) * (window.height / 17) + 1e-10).astype(int)
    cols = 5 + np.floor((np.arange(29) + 0.5) * (window.width / 29) + 1e-10).astype(int)
    np.testing.assert_array_equal(got, full[[0, 1]][:, rows][:, :, cols])


def test_reduced_reads_equal_rasterios_for_a_file_and_an_array_alike(scene):
    data, paths = scene
    rng = np.random.default_rng(3)
    with (
        rasterio.open(paths["tiled"]) as ds,
        open_raster(paths["tiled"]) as file,
        open_raster(RasterArray(data, {**PROFILE, "nodata": 0})) as array,
    ):
        for _ in range(40):
            r, c = rng.integers(0, HEIGHT - 1), rng.integers(0, WIDTH - 1)
            h, w = rng.integers(1, HEIGHT - r + 1), rng.integers(1, WIDTH - c + 1)
            shape = (int(rng.integers(1, 2 * h + 1)), int(rng.integers(1, 2 * w + 1)))
            window = Window(int(c), int(r), int(w), int(h))
            ref = ds.read([2, 1], window=window, out_shape=(2, *shape), masked=True)
            for src in (file, array):
                got = src.read(window, [1, 0], out_shape=shape, masked=True)
                np.testing.assert_array_equal(got.data, ref.data)
                np.testing.assert_array_equal(np.ma.getmaskarray(got), np.ma.getmaskarray(ref))


@pytest.mark.parametrize("resampling", ["bilinear", "cubic", "average"])
def test_other_resamplings_are_gdals_for_an_array_too(tmp_path, resampling):
    rng = np.random.default_rng(5)
    data = rng.normal(100, 30, (2, 90, 110)).astype(np.float32)
    path = write_geotiff(tmp_path / "float.tif", data)  # no overviews
    window = Window(11, 7, 80, 66)
    with rasterio.open(path) as ds:
        ref = ds.read(window=window, out_shape=(2, 23, 31), resampling=Resampling[resampling])
    for src in (open_raster(path), open_raster(RasterArray(data, PROFILE))):
        with src:
            got = src.read(window, [0, 1], out_shape=(23, 31), resampling=resampling)
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-4)


def _masked_files(root: Path) -> dict[str, tuple[Path, list[int]]]:
    """Files whose missing pixels are told each way GDAL knows (and the bands to read)."""
    rng = np.random.default_rng(11)
    ints = rng.integers(1, 200, (3, 60, 70)).astype(np.uint8)
    hole = np.zeros((60, 70), bool)
    hole[10:30, 5:40] = True
    hole[45:, 50:] = True
    nodata = ints.copy()
    nodata[:, hole] = 0
    floats = rng.normal(0, 1, (2, 60, 70)).astype(np.float32)
    floats[0, hole] = np.nan
    floats[1, 20:50, 30:60] = np.nan
    out = {
        "nodata value": (write_geotiff(root / "nodata.tif", nodata, nodata=0), [0, 1, 2]),
        "nan nodata": (write_geotiff(root / "nan.tif", floats, nodata=float("nan")), [0, 1]),
    }
    masked = write_geotiff(root / "mask.tif", ints, tiled=True, blockxsize=16, blockysize=16)
    with rasterio.Env(GDAL_TIFF_INTERNAL_MASK=True), rasterio.open(masked, "r+") as dst:
        dst.write_mask(np.where(hole, 0, 255).astype(np.uint8))
    out["mask band"] = (masked, [0, 2])
    alpha = np.concatenate([ints, np.where(hole, 0, 255).astype(np.uint8)[None]])
    rgba = write_geotiff(root / "alpha.tif", alpha, photometric="RGB")
    with rasterio.open(rgba, "r+") as dst:
        dst.colorinterp = (ColorInterp.red, ColorInterp.green, ColorInterp.blue, ColorInterp.alpha)
    out["alpha band"] = (rgba, [0, 1, 2, 3])
    return out


@pytest.mark.parametrize("how", ["nodata value", "nan nodata", "mask band", "alpha band"])
def test_masks_are_the_ones_gdal_gives(tmp_path, how):
    path, bands = _masked_files(tmp_path)[how]
    with rasterio.open(path) as ds:
        flags = ds.mask_flag_enums[0]
        assert len(flags) == 1 or how == "alpha band", flags  # (the file is what it says)
        for window, shape in ((Window(0, 0, 70, 60), None), (Window(3, 8, 61, 45), (20, 27))):
            indexes = [b + 1 for b in bands]
            out = (len(bands), *shape) if shape else None
            ref = ds.read(indexes, window=window, out_shape=out, masked=True)
            with open_raster(path) as src:
                got = src.read(window, bands, out_shape=shape, masked=True)
            assert isinstance(got, np.ma.MaskedArray)
            assert np.ma.getmaskarray(ref).any()
            np.testing.assert_array_equal(np.ma.getmaskarray(got), np.ma.getmaskarray(ref))
            np.testing.assert_array_equal(got.filled(0), ref.filled(0))


def test_bad_windows_bands_shapes_and_resamplings_are_input_errors_naming_the_source(scene):
    for kind in ("tiled", "array"):
        with opened(kind, scene) as src:
            name = src.info.name
            good = Window(0, 0, 10, 10)
            bad_calls: list[tuple[Any, ...]] = [
                (Window(125, 0, 10, 10), [0], None, "nearest"),  # past the right edge
                (Window(-1, 0, 10, 10), [0], None, "nearest"),
                (Window(0, 0, 0, 10), [0], None, "nearest"),
                (Window(0.5, 0, 10, 10), [0], None, "nearest"),
                ((0, 0, 10, 10), [0], None, "nearest"),  # not a Window
                (good, [], None, "nearest"),
                (good, [3], None, "nearest"),
                (good, [-1], None, "nearest"),
                (good, [True], None, "nearest"),
                (good, "0", None, "nearest"),
                (good, [0], (0, 5), "nearest"),
                (good, [0], (-3, 5), "nearest"),
                (good, [0], (5,), "nearest"),
                (good, [0], (5, 5), "bogus"),
                (good, [0], (5, 5), "max"),  # a warper's resampling, not a read's
            ]
            for window, bands, shape, how in bad_calls:
                with pytest.raises(InputError) as caught:
                    src.read(window, bands, out_shape=shape, resampling=how)
                assert name in str(caught.value), (window, bands, shape, how)


class LazyArray:
    """An array-like that records every slice asked of it and refuses to be loaded whole."""

    def __init__(self, data: np.ndarray, chunks: tuple[int, ...] | None = None) -> None:
        self._data = data
        self.shape, self.dtype, self.ndim = data.shape, data.dtype, data.ndim
        if chunks is not None:
            self.chunks = chunks
        self.row_spans: list[int] = []

    def __getitem__(self, key: Any) -> np.ndarray:
        rows = key[self.ndim - 2]
        assert isinstance(rows, slice), key
        self.row_spans.append(len(range(*rows.indices(self.shape[-2]))))
        return self._data[key]

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise AssertionError("the whole array was loaded")


@pytest.mark.parametrize("shape", [(2, 100, 90), (100, 90)])
def test_a_lazy_array_is_read_a_grid_row_at_a_time(shape):
    image = np.random.default_rng(1).integers(0, 5000, shape).astype(np.float32)
    lazy = LazyArray(image)
    engine = Engine("identity", patch_size=32, stride=16, blend="center", warmup=False)
    got = engine.generate_image(RasterArray(lazy, PROFILE), out_format="tensor")
    want = engine.generate_image(RasterArray(image, PROFILE), out_format="tensor")
    got.raise_for_error()
    np.testing.assert_array_equal(got.outputs.tensor.numpy(), want.outputs.tensor.numpy())
    np.testing.assert_array_equal(want.outputs.tensor.numpy().reshape(image.shape), image)
    assert lazy.row_spans  # it was read ...
    assert max(lazy.row_spans) <= 32  # ... never more rows than one grid row's patches


def test_a_lazy_arrays_thumbnail_reads_a_chunk_row_at_a_time_and_equals_the_files(tmp_path):
    data = _scene()
    path = write_geotiff(
        tmp_path / "scene.tif", data, nodata=0, tiled=True, blockysize=32, blockxsize=32
    )
    lazy = LazyArray(data, chunks=(1, 25, 130))
    with open_raster(RasterArray(lazy, {**PROFILE, "nodata": 0})) as src:
        assert src.block_rows == 25
        picture = read_thumbnail(src, [2, 0], 40)
    with open_raster(path) as file:
        ref = read_thumbnail(file, [2, 0], 40)
    assert picture.shape == (2, 40, 35)
    np.testing.assert_array_equal(picture.data, ref.data)
    np.testing.assert_array_equal(picture.mask, ref.mask)
    assert picture.mask[:, 0, 0].all()
    assert max(lazy.row_spans) <= 25  # one chunk row at a time


def test_a_thumbnail_of_bytes_reads_their_overview(tmp_path):
    data = _scene()
    path = write_geotiff(
        tmp_path / "ov.tif", data, nodata=0, tiled=True, blockxsize=32, blockysize=32
    )
    with rasterio.open(path, "r+") as dst:
        dst.build_overviews([2, 4], Resampling.nearest)
    with rasterio.open(path, overview_level=1) as ov:  # the 4x overview: 38 x 33
        want = ov.read([1, 3])
    for src in (open_raster(path), open_raster(path.read_bytes())):
        with src:
            picture = read_thumbnail(src, [0, 2], 38)
        assert picture.shape == want.shape
        np.testing.assert_array_equal(picture.data, want)


def test_a_source_without_a_gdal_dataset_is_refused_by_the_warper_naming_it(scene):
    with opened("warped", scene) as warped:
        grid = TargetGrid("EPSG:32633", UTM_TRANSFORM @ Affine.scale(2), 40, 40)
        with pytest.raises(InputError, match=r"cannot be warped"):
            WarpedSource(warped, grid)


def test_an_array_is_warped_like_the_same_file(scene):
    data, paths = scene
    grid = TargetGrid("EPSG:32633", UTM_TRANSFORM @ Affine.translation(0.4, 0.3), 100, 120)
    lazy = LazyArray(data)
    with (
        WarpedSource(open_raster(paths["tiled"]), grid) as file,
        WarpedSource(open_raster(RasterArray(lazy, {**PROFILE, "nodata": 0})), grid) as array,
    ):
        np.testing.assert_array_equal(
            array.read_rows(0, 120, [0, 2]), file.read_rows(0, 120, [0, 2])
        )
    assert max(lazy.row_spans) <= 256  # copied for the warper a band of rows at a time


def test_a_warped_inputs_rows_do_not_depend_on_how_they_are_read(scene):
    """GDAL warps a read of the whole grid in several bands in a pass of its own: the
    warper reads such a read band by band, so its values are those of any other read."""
    with opened("warped", scene) as src:
        height = src.info.height
        whole_grid = np.array(src.read_rows(0, height, [0, 1, 2]))
        by_row = np.concatenate([src.read_rows(r, r + 1, [0, 1, 2]) for r in range(height)], 1)
        np.testing.assert_array_equal(whole_grid, by_row)
        np.testing.assert_array_equal(src.read_rows(0, height, [1])[0], by_row[1])
