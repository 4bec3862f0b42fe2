"""The output writer: Mpx/s per core and file size by codec, for class maps and float outputs.

    python -m bench.writer             # prints JSON, updates docs/benchmarks.md
    python -m bench.writer --no-docs   # JSON only

Each output is 4096 x 4096, written the way the engine writes it: through the real sink
(:func:`geoserve.raster.sinks.make_sink`, a :class:`~geoserve.raster.write.RowWriter` under
it) a band of 192 rows at a time (a grid row at stride 192), then committed (file closed,
checked, renamed into place). Outputs: uint8 class maps of 2 and 10 classes, smooth (large
blobs: a seeded smooth noise field, thresholded) and noisy (every pixel drawn at random),
and a float32 probability band, smooth and noisy. Codecs: DEFLATE levels 1 and 6 with and
without the predictor, ZSTD levels 1 and 9, LZW and PACKBITS, each at 1 GDAL thread; the
candidates also at 2. Mpx/s per core is pixels over the process's CPU seconds (every thread,
GDAL's included), the best of two runs; each written file is read back with rasterio and
must equal what was written, bit for bit.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
from affine import Affine
from numpy.typing import NDArray
from rasterio.crs import CRS

from bench.harness import cli, machine, machine_line, publish, write_section
from geoserve.raster.codecs import DEFAULT_COMPRESSION, Codec
from geoserve.raster.sinks import make_sink
from geoserve.raster.write import OutputRaster

SIZE = 4096
BAND_ROWS = 192  # one grid row's finished rows at patch 224 / stride 192
REPEATS = 2
PROFILE = {"crs": CRS.from_epsg(32633), "transform": Affine(10, 0, 500000, 0, -10, 5200000)}

#: (label, codec) for the class maps; the first is what geoserve wrote before (DEFLATE 6).
CLASS_CODECS: list[tuple[str, Codec]] = [
    ("DEFLATE 6 + predictor (old default)", Codec("deflate", 6, True, 1)),
    ("DEFLATE 6", Codec("deflate", 6, False, 1)),
    ("DEFLATE 1 + predictor", Codec("deflate", 1, True, 1)),
    ("DEFLATE 1", Codec("deflate", 1, False, 1)),
    ("ZSTD 1 + predictor", Codec("zstd", 1, True, 1)),
    ("ZSTD 1 (new default)", Codec("zstd", 1, False, 1)),
    ("ZSTD 9", Codec("zstd", 9, False, 1)),
    ("LZW", Codec("lzw", None, False, 1)),
    ("PACKBITS", Codec("packbits", None, None, 1)),
]
#: (label, codec) for the float outputs (always with the floating-point predictor).
FLOAT_CODECS: list[tuple[str, Codec]] = [
    ("DEFLATE 1 + predictor (old default)", Codec("deflate", 1, None, 1)),
    ("DEFLATE 6 + predictor", Codec("deflate", 6, None, 1)),
    ("ZSTD 1 + predictor (new default)", Codec("zstd", 1, None, 1)),
    ("ZSTD 9 + predictor", Codec("zstd", 9, None, 1)),
]
#: Codecs measured again at 2 GDAL threads, on the outputs named.
THREADED = ["DEFLATE 6 + predictor (old default)", "ZSTD 1 (new default)", "DEFLATE 1"]
THREADED_OUTPUTS = ["smooth, 2 classes", "noisy, 10 classes"]


def smooth_field(rng: np.random.Generator, n: int) -> NDArray[np.float32]:
    """A seeded smooth noise field: coarse random grids interpolated bilinearly, two scales."""
    field = np.zeros((n, n), np.float32)
    for cells, weight in ((8, 1.0), (64, 0.3)):
        coarse = rng.standard_normal((cells + 1, cells + 1)).astype(np.float32)
        x = np.linspace(0, cells, n, dtype=np.float32)
        i = np.minimum(x.astype(np.int64), cells - 1)
        f = (x - i)[None, :]
        rows = coarse[:, i] * (1 - f) + coarse[:, i + 1] * f  # (cells+1, n)
        g = f.T
        field += weight * (rows[i] * (1 - g) + rows[i + 1] * g)
    return field


def outputs(rng: np.random.Generator) -> dict[str, NDArray[Any]]:
    """The outputs written, by label."""
    field = smooth_field(rng, SIZE)
    quantiles = np.quantile(field[::16, ::16], np.linspace(0, 1, 11)[1:-1])
    return {
        "smooth, 2 classes": (field > 0).astype(np.uint8)[None],
        "smooth, 10 classes": np.digitize(field, quantiles).astype(np.uint8)[None],
        "noisy, 2 classes": rng.integers(0, 2, (1, SIZE, SIZE), dtype=np.uint8),
        "noisy, 10 classes": rng.integers(0, 10, (1, SIZE, SIZE), dtype=np.uint8),
        "smooth, float32": (1 / (1 + np.exp(-3 * field))).astype(np.float32)[None],
        "noisy, float32": rng.random((1, SIZE, SIZE), dtype=np.float32),
    }


def write_once(data: NDArray[Any], codec: Codec, path: Path) -> tuple[float, float, int]:
    """CPU and wall seconds of writing ``data`` through a sink, and the file's size."""
    classes = data.dtype.kind != "f"
    colormap = {i: (i * 20, 255 - i * 20, 128, 255) for i in range(10)} if classes else None
    sink = make_sink("path", path, PROFILE, SIZE, SIZE, codec=codec)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for row in range(0, SIZE, BAND_ROWS):
        band = data[:, row : row + BAND_ROWS]
        sink.write(row, OutputRaster(band, nodata=255 if classes else None, colormap=colormap))
    sink.commit("path")
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    with rasterio.open(path) as ds:  # reads back bit for bit, georeferenced as written
        if not np.array_equal(ds.read(), data, equal_nan=True):
            raise AssertionError(f"{path}: read back differs from what was written ({codec})")
        if ds.transform != PROFILE["transform"] or ds.crs != PROFILE["crs"]:
            raise AssertionError(f"{path}: georeferencing differs ({codec})")
    return cpu, wall, path.stat().st_size


def measure(
    label: str, data: NDArray[Any], codec_label: str, codec: Codec, tmp: Path
) -> dict[str, Any]:
    """One output written with one codec: the best of :data:`REPEATS` runs."""
    best: tuple[float, float, int] | None = None
    for i in range(REPEATS):
        path = tmp / f"out{i}.tif"
        run = write_once(data, codec, path)
        path.unlink()
        if best is None or run[0] < best[0]:
            best = run
    assert best is not None
    cpu, wall, size = best
    mpx = data.shape[1] * data.shape[2] / 1e6
    row = {
        "output": label,
        "codec": codec_label,
        "gdal_threads": codec.threads,
        "mpx_per_core_s": round(mpx / cpu, 1),
        "mpx_per_s": round(mpx / wall, 1),
        "mb": round(size / 1e6, 2),
        "bits_per_px": round(8 * size / (mpx * 1e6), 3),
    }
    print(row, flush=True)
    return row


def run() -> list[dict[str, Any]]:
    default = Codec(threads=1)  # (the rows labelled "new default" are the default's options)
    for codecs in (CLASS_CODECS, FLOAT_CODECS):
        dtype = np.dtype(np.float32 if codecs is FLOAT_CODECS else np.uint8)
        (labelled,) = [c for name, c in codecs if "new default" in name]
        assert labelled.gtiff_options(dtype) == default.gtiff_options(dtype), labelled
    data = outputs(np.random.default_rng(0))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, values in data.items():
            codecs = FLOAT_CODECS if values.dtype.kind == "f" else CLASS_CODECS
            for codec_label, codec in codecs:
                rows.append(measure(label, values, codec_label, codec, Path(tmp)))
        for label in THREADED_OUTPUTS:
            for codec_label, codec in CLASS_CODECS:
                if codec_label in THREADED:
                    two = Codec(codec.compression, codec.level, codec.predictor, 2)
                    rows.append(measure(label, data[label], codec_label, two, Path(tmp)))
    return rows


def write_markdown(report: dict[str, Any]) -> None:
    rows = report["rows"]
    old = {r["output"]: r for r in rows if "old default" in r["codec"] and r["gdal_threads"] == 1}
    lines = [
        f"4096 x 4096 outputs written through the engine's sink a band of {BAND_ROWS} rows at "
        "a time, committed and read back (every file equals what was written). Mpx/s per core: "
        "pixels over the process's CPU seconds (GDAL's threads included), best of "
        f"{REPEATS}; size relative to the old default (DEFLATE 6 + predictor for class maps, "
        f"DEFLATE 1 + predictor for floats). Default now: `{DEFAULT_COMPRESSION}` (level 1). "
        f"{machine_line(report['machine'], 'gdal')} The CPU is an AMD EPYC (AVX2) whose 2 "
        "cores other work shared: wall figures vary from run to run, per-core ones less (two "
        "runs differed by up to 1.5x on the noisy maps).",
        "",
        "| output | codec | GDAL threads | Mpx/s per core | Mpx/s wall | MB | vs old size |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        ref = old[r["output"]]["mb"]
        lines.append(
            f"| {r['output']} | {r['codec']} | {r['gdal_threads']} | {r['mpx_per_core_s']} | "
            f"{r['mpx_per_s']} | {r['mb']} | {r['mb'] / ref:.2f}x |"
        )
    write_section("writer", "The output writer by codec", lines)


def main() -> None:
    args = cli(__doc__).parse_args()
    report = {"rows": run(), "machine": machine()}
    publish("writer", report, write_markdown, docs=not args.no_docs)


if __name__ == "__main__":
    main()
