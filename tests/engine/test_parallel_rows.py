"""Rows of one request read in parallel: the same patches and outputs, bit for bit.

The row reader fetches a row's raw pixels from the sources' rolling row buffers, reflecting the
edges by slice assignment, and the cuts of several rows of one request run at once. Checked
against an independent reference (``np.pad(mode="reflect")`` of the whole image, normalised the
same way) for every blend, several strides and image sizes, nodata and NaN, one and two dates;
and end to end: every reader thread count and read-ahead depth gives the outputs a sequential
read gives.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import rasterio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from geoserve import Engine, GeoTiffPatcher
from geoserve.engine.prefetch import RowPrefetcher
from geoserve.errors import ConfigError
from geoserve.raster import open_raster
from tests.conftest import write_geotiff

pytestmark = pytest.mark.filterwarnings("ignore::geoserve.errors.NotGeoreferencedWarning")


def reference_rows(proc: GeoTiffPatcher, dates: list[np.ndarray], nodata: float | None):
    """Every grid row's (cols, patches, core_valid) from the padded whole image."""
    c, h, w = dates[0].shape
    p, s = proc.patch_size, proc.stride
    m = (p - s) // 2
    rows, cols = -(-h // s), -(-w // s)
    pad = ((0, 0), (m, rows * s + p - h), (m, cols * s + p - w))
    padded = np.stack([_reflect(d, pad) for d in dates], 1)
    bad = ~np.isfinite(padded) if padded.dtype.kind == "f" else np.zeros(padded.shape, bool)
    if nodata is not None and not np.isnan(nodata):
        bad |= padded == nodata
    lead = (0, 1)
    invalid = bad.all(lead) if proc.per_band_nodata else bad.any(lead)
    x = padded.astype(np.float32)
    shape = (-1, 1, 1, 1)
    if proc.scale_factor != 1.0:
        x *= np.float32(proc.scale_factor)
    if proc.mean is not None:
        x -= np.asarray(proc.mean, np.float32).reshape(shape)
    if proc.std is not None:
        x /= np.asarray(proc.std, np.float32).reshape(shape)
    x[bad if proc.per_band_nodata else np.broadcast_to(invalid, x.shape)] = proc.fill
    if len(dates) == 1:
        x = x[:, 0]
    out = []
    for r in range(rows):
        keep, patches = [], []
        for col in range(cols):
            if invalid[r * s : r * s + p, col * s : col * s + p].all():
                continue
            keep.append(col)
            patches.append(x[..., r * s : r * s + p, col * s : col * s + p])
        core = ~invalid[r * s + m : r * s + m + min(s, h - r * s), m : m + w]
        out.append((tuple(keep), patches, None if core.all() else core))
    return out


def _reflect(d: np.ndarray, pad) -> np.ndarray:
    """np.pad's reflect, axis by axis; a one-pixel axis reflects onto itself."""
    for axis, width in enumerate(pad):
        if width != (0, 0):
            one = d.shape[axis] == 1
            widths = [(0, 0)] * d.ndim
            widths[axis] = width
            d = np.pad(d, widths, mode="edge" if one else "reflect")
    return d


def _image(rng, bands, h, w, dtype, nodata, holes):
    if dtype == "float32":
        data = rng.normal(1000, 300, (bands, h, w)).astype(np.float32)
        if holes:
            data[rng.random((bands, h, w)) < holes] = np.nan
    else:
        data = rng.integers(1, 5000, (bands, h, w)).astype(dtype)
        if holes and nodata is not None:
            data[rng.random((bands, h, w)) < holes] = nodata
    return data


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    h=st.integers(1, 70),
    w=st.integers(1, 70),
    patch=st.sampled_from([8, 12, 16]),
    frac=st.sampled_from([1.0, 0.75, 0.5, 0.3]),
    blend=st.sampled_from(["none", "center", "mean", "cosine"]),
    dtype=st.sampled_from(["uint16", "int16", "float32"]),
    holes=st.sampled_from([0.0, 0.05, 0.6]),
    dates=st.sampled_from([1, 2]),
    per_band=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_read_row_equals_padded_reference(
    tmp_path_factory, h, w, patch, frac, blend, dtype, holes, dates, per_band, seed
):
    stride = patch if blend == "none" else max(1, int(patch * frac))
    try:
        proc = GeoTiffPatcher(
            patch_size=patch,
            stride=stride,
            blend=blend,
            num_frames=dates,
            mean=(10.0, 20.0),
            std=(3.0, 7.0),
            scale_factor=1e-4 if seed % 3 else 0.5,
            fill=-1.5,
            per_band_nodata=per_band,
        )
    except ConfigError:
        return
    rng = np.random.default_rng(seed)
    nodata = None if dtype == "float32" else 0
    arrays = [_image(rng, 2, h, w, dtype, nodata, holes) for _ in range(dates)]
    tmp = tmp_path_factory.mktemp("rows")
    block = {"tiled": True, "blockxsize": 16, "blockysize": 16} if seed % 2 else {}
    paths = [
        write_geotiff(tmp / f"d{i}.tif", a, nodata=nodata, **block) for i, a in enumerate(arrays)
    ]
    sources = [open_raster(p, threads=1 + seed % 2) for p in paths]
    try:
        ctx = proc.prepare(sources)
        want = reference_rows(proc, arrays, nodata)
        for r, (cols, patches, core) in enumerate(want):
            got = proc.read_row(sources, ctx, r)
            assert got.cols == cols
            for a, b in zip(got.patches, patches, strict=True):
                np.testing.assert_array_equal(np.asarray(a), b)
            if core is None:
                assert got.core_valid is None or got.core_valid.all()
            else:
                np.testing.assert_array_equal(got.core_valid, core)
    finally:
        for s in sources:
            s.close()


def test_source_rows_equal_rasterio_for_any_forward_sequence(tmp_path):
    """The rolling row buffer gives the file's rows for reads that move down, jump, change
    bands and go back; views stay right until the next read."""
    rng = np.random.default_rng(3)
    data = rng.integers(0, 60000, (3, 300, 45)).astype("uint16")
    path = write_geotiff(tmp_path / "a.tif", data, tiled=True, blockxsize=16, blockysize=32)
    with open_raster(path) as src:
        start = 0
        for _ in range(200):
            if rng.random() < 0.1:
                start = int(rng.integers(0, 299))  # backwards or far ahead
            else:
                start = min(299, start + int(rng.integers(0, 40)))
            stop = min(300, start + int(rng.integers(1, 80)))
            bands = [0, 2] if rng.random() < 0.2 else [0, 1, 2]
            np.testing.assert_array_equal(
                src.read_rows(start, stop, bands), data[bands, start:stop]
            )


@pytest.mark.parametrize("blend", ["center", "mean", "cosine"])
@pytest.mark.parametrize("nodata", [False, True])
def test_outputs_identical_for_every_reader_count_and_depth(tmp_path, blend, nodata):
    rng = np.random.default_rng(7)
    data = rng.integers(1, 4000, (3, 157, 131)).astype("uint16")
    if nodata:
        data[:, 20:60, 30:100] = 0
        data[1, rng.random((157, 131)) < 0.02] = 0
    path = write_geotiff(
        tmp_path / "in.tif",
        data,
        nodata=0 if nodata else None,
        tiled=True,
        blockxsize=32,
        blockysize=32,
    )
    outs = {}
    for workers, depth, prefetch in [
        (1, 0, False),
        (1, 2, True),
        (2, 2, True),
        (3, 3, True),
        (2, 1, True),
    ]:
        with Engine(
            "identity",  # per pixel: its outputs cannot depend on how batches were made
            read_workers=workers,
            prefetch_rows=depth,
            prefetch=prefetch,
            patch_size=16,
            stride=12,
            blend=blend,
            max_batch_patches=5,
        ) as engine:
            res = engine.generate_image(path, output_path=tmp_path / f"o{workers}{depth}.tif")
            res.raise_for_error()
            outs[(workers, depth)] = {
                k: rasterio.open(o.path).read() for k, o in res.outputs_by_kind.items()
            }
    first = outs[(1, 0)]
    for key, got in outs.items():
        for kind in first:
            np.testing.assert_array_equal(got[kind], first[kind], err_msg=f"{key} {kind}")


class Steps:
    """fetch/cut callables that record concurrency."""

    def __init__(self, cut_delay=0.02, fail_fetch_at=None):
        self.lock = threading.Lock()
        self.fetching = self.cutting = self.most_fetching = self.most_cutting = 0
        self.fetched: list[int] = []
        self.cut_delay, self.fail_fetch_at = cut_delay, fail_fetch_at

    def fetch(self, row):
        with self.lock:
            self.fetching += 1
            self.most_fetching = max(self.most_fetching, self.fetching)
            self.fetched.append(row)
        time.sleep(0.002)
        with self.lock:
            self.fetching -= 1
        if row == self.fail_fetch_at:
            raise OSError(f"row {row} is corrupt")
        return row * 10

    def cut(self, row, fetched):
        with self.lock:
            self.cutting += 1
            self.most_cutting = max(self.most_cutting, self.cutting)
        time.sleep(self.cut_delay)
        with self.lock:
            self.cutting -= 1
        return fetched + 1


def test_fetches_in_order_one_at_a_time_while_cuts_overlap():
    steps = Steps()
    with ThreadPoolExecutor(3) as pool:
        rows = RowPrefetcher(steps.fetch, 12, pool, depth=3, cut=steps.cut, parallel=3)
        rows.start()
        got = [rows.next() for _ in range(12)]
    assert got == [r * 10 + 1 for r in range(12)]
    assert steps.fetched == list(range(12))  # each row fetched once, in order
    assert steps.most_fetching == 1  # the sources are never read by two threads
    assert steps.most_cutting >= 2  # but the rows' cuts ran at once


def test_parallel_one_reads_one_row_at_a_time():
    steps = Steps(cut_delay=0.005)
    with ThreadPoolExecutor(3) as pool:
        rows = RowPrefetcher(steps.fetch, 6, pool, depth=3, cut=steps.cut, parallel=1)
        rows.start()
        assert [rows.next() for _ in range(6)] == [r * 10 + 1 for r in range(6)]
    assert steps.most_cutting == 1


def test_a_failed_fetch_stops_the_rows_after_it():
    steps = Steps(cut_delay=0.001, fail_fetch_at=3)
    with ThreadPoolExecutor(3) as pool:
        rows = RowPrefetcher(steps.fetch, 10, pool, depth=3, cut=steps.cut, parallel=3)
        rows.start()
        assert [rows.next() for _ in range(3)] == [1, 11, 21]
        with pytest.raises(OSError, match="row 3 is corrupt"):
            rows.next()
        rows.close()
    assert max(steps.fetched) == 3  # nothing past the broken row was read


def test_close_while_rows_wait_for_their_turn_returns():
    gate = threading.Event()

    def fetch(row):
        if row == 0:
            gate.wait(5)
        return row

    with ThreadPoolExecutor(3) as pool:
        rows = RowPrefetcher(fetch, 10, pool, depth=3, parallel=3)
        rows.start()
        time.sleep(0.05)
        assert rows.reading
        closer = threading.Thread(target=rows.close)
        closer.start()
        time.sleep(0.05)
        gate.set()  # row 0 ends; rows 1 and 2 were waiting for their turn and give up
        closer.join(5)
        assert not closer.is_alive()
        assert not rows.reading


@pytest.mark.parametrize(
    "layout",
    [{}, {"tiled": True, "blockxsize": 16, "blockysize": 16}, {"blockysize": 1}],
    ids=["strips", "tiles16", "one-row-strips"],
)
@pytest.mark.parametrize(("patch", "stride", "blend"), [(48, 40, "cosine"), (24, 24, "none")])
def test_rows_across_decoded_chunks_equal_the_reference(tmp_path, layout, patch, stride, blend):
    """Tall images: a grid row's rows come from two decoded chunks of the row buffer."""
    rng = np.random.default_rng(11)
    data = rng.integers(1, 9000, (2, 301, 37)).astype("uint16")
    data[:, 100:140, 5:20] = 0
    path = write_geotiff(tmp_path / "tall.tif", data, nodata=0, **layout)
    proc = GeoTiffPatcher(patch_size=patch, stride=stride, blend=blend, mean=(5.0, 6.0))
    with open_raster(path) as src:
        ctx = proc.prepare([src])
        for r, (cols, patches, core) in enumerate(reference_rows(proc, [data], 0)):
            got = proc.read_row([src], ctx, r)
            assert got.cols == cols
            for a, b in zip(got.patches, patches, strict=True):
                np.testing.assert_array_equal(a, b)
            if core is not None:
                np.testing.assert_array_equal(got.core_valid, core)
        assert src.rows_decoded == 301  # every row (and block) decoded once


def test_a_stalled_fetch_holds_one_reader_thread_not_all():
    """Row r + 1 is submitted only once row r is fetched: a request whose input stalls never
    parks a second pool thread waiting for its turn, so another request reads on."""
    gate = threading.Event()

    def stalled(row):
        gate.wait(10)
        return row

    with ThreadPoolExecutor(2) as pool:
        slow = RowPrefetcher(stalled, 10, pool, depth=3, parallel=3)
        slow.start()
        other = RowPrefetcher(lambda r: r, 10, pool, depth=3, parallel=3)
        other.start()
        t0 = time.monotonic()
        assert [other.next() for _ in range(10)] == list(range(10))
        assert time.monotonic() - t0 < 5  # not held until the stalled input gives up
        gate.set()
        slow.close()


class _CountingRows(GeoTiffPatcher):
    """A plugin's patcher that reads rows its own way (here: counts them, doubles a band)."""

    def read_row(self, sources, ctx, row):  # type: ignore[no-untyped-def]
        seen.append(("row", row))
        out = super().read_row(sources, ctx, row)
        return dataclasses.replace(out, patches=np.asarray(out.patches) * 2)


class _CountingBand(GeoTiffPatcher):
    def read_band(self, sources, ctx, row):  # type: ignore[no-untyped-def]
        seen.append(("band", row))
        return super().read_band(sources, ctx, row)


seen: list[tuple[str, int]] = []


@pytest.mark.parametrize("cls", [_CountingRows, _CountingBand])
def test_a_subclass_reading_rows_its_own_way_is_honoured(tmp_path, cls, register_model):
    """The engine's fetch/cut split must not bypass a plugin patcher's read_row/read_band."""
    from geoserve import RawReassembler
    from tests.stub_models import SlowReadIdentity

    data = np.random.default_rng(1).integers(1, 100, (1, 40, 30)).astype("float32")
    path = write_geotiff(tmp_path / "in.tif", data)
    proc = cls(patch_size=16, stride=16, blend="none")
    model = type(f"Identity{cls.__name__}", (SlowReadIdentity,), {})  # (a factory of its own)
    name = register_model(f"counting-{cls.__name__}", model, proc, RawReassembler())
    seen.clear()
    with Engine(name, read_workers=2, warmup=False) as engine:
        out = engine.generate_image(path, out_format="tensor").raise_for_error()
    kind = "row" if cls is _CountingRows else "band"
    assert sorted(r for k, r in seen if k == kind) == [0, 1, 2]  # every row, its own way
    want = data * 2 if cls is _CountingRows else data
    np.testing.assert_array_equal(out.outputs.tensor.numpy(), want)


def test_dates_of_different_types_match_nodata_each_in_its_own(tmp_path):
    """A float32 date's nodata 0.1 is float32(0.1) in it, though the row holds both dates as
    float64: the pixel is still nodata (as when each date was read alone)."""
    a = np.full((1, 20, 20), 7.0, np.float64)  # the first date: nodata 0.1 exactly
    b = np.full((1, 20, 20), 5.0, np.float32)
    b[0, 3, 4] = np.float32(0.1)
    paths = [
        write_geotiff(tmp_path / "a.tif", a, nodata=0.1),
        write_geotiff(tmp_path / "b.tif", b, nodata=0.1),
    ]
    proc = GeoTiffPatcher(patch_size=8, stride=8, blend="none", num_frames=2)
    sources = [open_raster(p) for p in paths]
    try:
        ctx = proc.prepare(sources)
        row = proc.read_row(sources, ctx, 0)
        assert row.core_valid is not None
        assert not row.core_valid[3, 4]  # nodata in date 1 (float32)
        assert row.core_valid.sum() == row.core_valid.size - 1
    finally:
        for s in sources:
            s.close()


def test_a_source_restricted_after_reads_reads_the_window(tmp_path):
    data = np.random.default_rng(4).integers(0, 9000, (2, 300, 37)).astype("uint16")
    path = write_geotiff(tmp_path / "w.tif", data, tiled=True, blockxsize=16, blockysize=16)
    from rasterio.windows import Window

    with open_raster(path) as src:
        src.read_rows(0, 200, [0, 1])  # chunks of the full width, then a spare
        src.read_rows(150, 290, [0, 1])
        src.restrict(Window(5, 10, 20, 250), "window")
        np.testing.assert_array_equal(src.read_rows(0, 250, [0, 1]), data[:, 10:260, 5:25])
