"""Multimodal alignment: pre-processing with S1 warped as it is read, against the same bands
pre-stacked on the S2 grid.

Inputs (seeded, ``tests/multimodal_scenes.py``): an S2-like scene (4096 x 4096, 10 m, EPSG:32633,
4 bands uint16, tiled 256, DEFLATE), an S1-like scene covering all of it (``cover=1.0``,
~20 m, EPSG:4326, 2 bands float32 dB, NaN nodata, about 2077 x 2082 px) and the pre-stacked
file: the same 4 + 2 bands already on the S2 grid in one GeoTIFF (float32, NaN nodata, tiled
256, DEFLATE), made once per run by warping S1 onto the S2 grid with geoserve's own warper, so
both requests carry the same values. The S2 and S1 files are cached under
``bench/results/scenes``.

1. Pre-processing alone (no model): ``identity``'s input processor reads every grid row of
   (a) ``{"s2": ..., "s1": ...}`` (``prepare_modalities``: S1 warped onto the S2 grid through a
   WarpedVRT, a band of rows at a time, then stacked) and (b) the pre-stacked file
   (``prepare``), with 1 and 2 threads (GDAL's decoding threads and the warper's
   ``NUM_THREADS``; the engine passes its ``read_workers``). Secondary rows: the exact warp
   alone (WarpedSource before its fast path) and the warp's error tolerance.
2. End to end: ``Engine("identity").generate_image`` of each request to a GeoTIFF (engine
   defaults); the two outputs are compared bit for bit.

Every case is run once to warm the page cache, then the cases take turns ``--repeats`` times;
the figures are medians (wall seconds and this process's CPU seconds: the machine is shared,
and CPU time moves less with the load). Ratio = aligned time / pre-stacked time.

    python -m bench.align [--size 4096] [--repeats 5] [--no-docs]
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
from tests.multimodal_scenes import write_s1, write_s2

from bench.harness import cli, machine, machine_line, publish, write_section
from bench.scenes import SCENES
from geoserve import Engine
from geoserve.processors import InputProcessor
from geoserve.raster import open_raster
from geoserve.raster.align import (
    WARP_TOLERANCE,
    StackedSource,
    TargetGrid,
    WarpedSource,
    stack_modalities,
)
from geoserve.raster.gdal_setup import limit_gdal_cache
from geoserve.raster.source import RasterSource

SIZE = 4096
REPEATS = 5
E2E_REPEATS = 3
GOAL = 1.5  # aligned at most 1.5x the pre-stacked input's time on the CPU
BANDS = ("B2", "B3", "B4", "B8", "VV", "VH")


# -- inputs ------------------------------------------------------------------------------------


def scenes(size: int) -> tuple[Path, Path]:
    """The S2 scene and the S1 scene covering all of it, cached under bench/results/scenes."""
    SCENES.mkdir(parents=True, exist_ok=True)
    s2, s1 = SCENES / f"mm_s2_{size}.tif", SCENES / f"mm_s1_full_{size}.tif"
    for path, write in ((s2, lambda p: write_s2(p, size)), (s1, lambda p: write_s1(p, size, 1.0))):
        if not path.exists():
            part = path.with_name(path.name + ".part")
            write(part)
            part.rename(path)
    return s2, s1


def write_stacked(s2: Path, s1: Path, path: Path) -> Path:
    """B2 B3 B4 B8 VV VH on the S2 grid in one float32 GeoTIFF (tiled 256, DEFLATE, as the S2
    file), S1 warped by geoserve's own warper, written 1024 rows at a time."""
    with open_raster(s2) as a, open_raster(s1) as b:
        (stack,) = stack_modalities({"s2": [a], "s1": [b]})
        info = stack.info
        profile = {
            "driver": "GTiff",
            "width": info.width,
            "height": info.height,
            "count": info.count,
            "dtype": "float32",
            "crs": info.crs,
            "transform": info.transform,
            "nodata": float("nan"),
            "tiled": True,
            "blockxsize": 256,
            "blockysize": 256,
            "compress": "deflate",
        }
        with rasterio.open(path, "w", **profile) as dst:
            for r0 in range(0, info.height, 1024):
                r1 = min(info.height, r0 + 1024)
                data = stack.read_rows(r0, r1, range(info.count))
                dst.write(data.astype(np.float32), window=((r0, r1), (0, info.width)))
            dst.descriptions = BANDS
        stack.close()
    return path


# -- part 1: pre-processing alone --------------------------------------------------------------


def _read_all(proc: InputProcessor, sources: list[RasterSource], ctx: Any) -> int:
    n = 0
    try:
        for r in range(ctx.grid.rows):
            n += len(proc.read_row(sources, ctx, r).cols)
    finally:
        for src in sources:
            src.close()
    return n


def aligned(proc: InputProcessor, s2: Path, s1: Path, threads: int) -> int:
    """(a): the dict request, as the engine opens and plans it."""
    modalities = {
        "s2": [open_raster(s2, threads=threads)],
        "s1": [open_raster(s1, threads=threads)],
    }
    sources, ctx = proc.prepare_modalities(modalities, threads)
    return _read_all(proc, sources, ctx)


def aligned_with(
    proc: InputProcessor, s2: Path, s1: Path, threads: int, tolerance: float, fast: bool
) -> int:
    """(a) built by hand (as ``stack_modalities`` does): another warp tolerance, or the exact
    warp alone (``fast=False``: WarpedSource as it was before its fast path)."""
    a, b = open_raster(s2, threads=threads), open_raster(s1, threads=threads)
    warped = WarpedSource(b, TargetGrid.of(a.info), "bilinear", threads, tolerance)
    if not fast and warped._fast is not None:
        warped._fast.close()
        warped._fast = None
    stack = StackedSource([a, warped], "s2+s1")
    return _read_all(proc, [stack], proc.prepare([stack]))


def prestacked(proc: InputProcessor, path: Path, threads: int) -> int:
    """(b): the pre-stacked file, a single input."""
    src = open_raster(path, threads=threads)
    return _read_all(proc, [src], proc.prepare([src]))


def _clock(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """Wall and CPU seconds of one call, and its result."""
    w0, c0 = time.perf_counter(), time.process_time()
    result = fn()
    return time.perf_counter() - w0, time.process_time() - c0, result


def preprocessing(s2: Path, s1: Path, stacked: Path, repeats: int) -> list[dict[str, Any]]:
    proc = Engine("identity").in_proc
    cases: list[tuple[str, str, int, Callable[[], int]]] = []
    for threads in (1, 2):
        cases += [
            ("aligned", "{s2, s1}: S1 warped as read", threads,
             lambda t=threads: aligned(proc, s2, s1, t)),
            ("prestacked", "pre-stacked file", threads,
             lambda t=threads: prestacked(proc, stacked, t)),
            ("exact", "{s2, s1}: exact warp only (before the fast path)", threads,
             lambda t=threads: aligned_with(proc, s2, s1, t, WARP_TOLERANCE, fast=False)),
        ]  # fmt: skip
    for tol in (0.5, 0.01):
        cases.append(
            ("tolerance", f"{{s2, s1}}: warp tolerance {tol} px", 1,
             lambda t=tol: aligned_with(proc, s2, s1, 1, t, fast=True))
        )  # fmt: skip
    walls: dict[int, list[float]] = {i: [] for i in range(len(cases))}
    cpus: dict[int, list[float]] = {i: [] for i in range(len(cases))}
    patches: dict[int, int] = {}
    for i, case in enumerate(cases):  # warm the page cache and GDAL
        patches[i] = case[3]()
    for rep in range(repeats):  # interleaved, so drift in the load hits every case alike
        for i, case in enumerate(cases):
            wall, cpu, n = _clock(case[3])
            assert n == patches[i]
            walls[i].append(wall)
            cpus[i].append(cpu)
        print(f"repeat {rep + 1}/{repeats} done", flush=True)
    rows = []
    for i, (kind, how, threads, _) in enumerate(cases):
        wall, cpu = statistics.median(walls[i]), statistics.median(cpus[i])
        rows.append(
            {
                "kind": kind,
                "how": how,
                "threads": threads,
                "patches": patches[i],
                "wall_s": round(wall, 3),
                "cpu_s": round(cpu, 3),
                "patches_per_s": round(patches[i] / wall, 1),
                "walls_s": [round(w, 3) for w in walls[i]],
            }
        )
        print(rows[-1], flush=True)
    pre = {r["threads"]: r for r in rows if r["kind"] == "prestacked"}
    for r in rows:
        base = pre[r["threads"]]
        r["ratio_wall"] = round(r["wall_s"] / base["wall_s"], 2)
        r["ratio_cpu"] = round(r["cpu_s"] / base["cpu_s"], 2)
    return rows


# -- part 2: end to end ------------------------------------------------------------------------


def _same_rasters(a: Path, b: Path) -> bool:
    with rasterio.open(a) as x, rasterio.open(b) as y:
        if (x.count, x.height, x.width, x.dtypes) != (y.count, y.height, y.width, y.dtypes):
            return False
        for r0 in range(0, x.height, 512):
            window = ((r0, min(x.height, r0 + 512)), (0, x.width))
            if not np.array_equal(x.read(window=window), y.read(window=window), equal_nan=True):
                return False
    return True


def end_to_end(s2: Path, s1: Path, stacked: Path, repeats: int) -> dict[str, Any]:
    engine = Engine("identity")
    requests = {"aligned": {"s2": s2, "s1": s1}, "prestacked": stacked}
    runs: dict[str, list[tuple[float, float, dict[str, float]]]] = {k: [] for k in requests}
    patches = {}
    with tempfile.TemporaryDirectory() as tmp:
        outs = {k: Path(tmp) / f"{k}.tif" for k in requests}
        for kind, request in requests.items():  # warm
            patches[kind] = engine.generate_image(request, output_path=outs[kind]).num_patches
        same = _same_rasters(outs["aligned"], outs["prestacked"])
        for _ in range(repeats):
            for kind, request in requests.items():
                wall, cpu, out = _clock(
                    lambda r=request, k=kind: engine.generate_image(r, output_path=outs[k])
                )
                t = out.timings
                stages = {"read": t.read, "model": t.model, "stitch": t.stitch, "write": t.write}
                runs[kind].append((wall, cpu, stages))
                print(f"end to end, {kind}: {wall:.2f} s wall, {cpu:.2f} s CPU", flush=True)
    engine.close()
    result: dict[str, Any] = {
        "read_workers": engine.read_workers,
        "max_batch_patches": engine.max_batch_patches,
        "outputs_identical": same,
    }
    for kind, rs in runs.items():
        wall = statistics.median(r[0] for r in rs)
        result[kind] = {
            "patches": patches[kind],
            "wall_s": round(wall, 2),
            "cpu_s": round(statistics.median(r[1] for r in rs), 2),
            "patches_per_s": round(patches[kind] / wall, 1),
            "stages_s": {k: round(statistics.median(r[2][k] for r in rs), 2) for k in rs[0][2]},
        }
    result["ratio_wall"] = round(result["aligned"]["wall_s"] / result["prestacked"]["wall_s"], 2)
    result["ratio_cpu"] = round(result["aligned"]["cpu_s"] / result["prestacked"]["cpu_s"], 2)
    return result


# -- report ------------------------------------------------------------------------------------


def run(size: int = SIZE, repeats: int = REPEATS, e2e_repeats: int = E2E_REPEATS) -> dict[str, Any]:
    limit_gdal_cache()  # 64 MB, as in every engine
    load_before = os.getloadavg()
    s2, s1 = scenes(size)
    with tempfile.TemporaryDirectory() as tmp:
        stacked = write_stacked(s2, s1, Path(tmp) / "stacked.tif")
        with rasterio.open(s1) as ds:
            s1_shape = f"{ds.width}x{ds.height}"
        sizes_mb = {p.name: round(p.stat().st_size / 2**20, 1) for p in (s2, s1, stacked)}
        pre = preprocessing(s2, s1, stacked, repeats)
        e2e = end_to_end(s2, s1, stacked, e2e_repeats)
    return {
        "size": size,
        "s1_size": s1_shape,
        "file_mb": sizes_mb,
        "repeats": repeats,
        "e2e_repeats": e2e_repeats,
        "goal_ratio": GOAL,
        "load_average": [round(x, 2) for x in (*load_before, *os.getloadavg())],
        "machine": machine(),
        "preprocessing": pre,
        "end_to_end": e2e,
    }


def write_markdown(report: dict[str, Any]) -> None:
    size, e2e = report["size"], report["end_to_end"]
    load = report["load_average"]
    lines = [
        f'A request of two modalities, `{{"s2": ..., "s1": ...}}`, against the same bands '
        f"pre-stacked on one grid. S2-like scene {size} x {size} (10 m, EPSG:32633, 4 bands "
        f"uint16), S1-like scene over all of it ({report['s1_size']} px, ~20 m, EPSG:4326, "
        "VV/VH float32, NaN nodata), both tiled 256 with DEFLATE (`tests/multimodal_scenes.py`); "
        "the pre-stacked file holds the same 4 + 2 bands on the S2 grid in one float32 GeoTIFF "
        "(same tiling and compression), S1 warped once by geoserve's own warper. `identity`'s "
        "input processor: patch 224, stride 196, `center` blend. Ratio = aligned time / "
        f"pre-stacked time (goal: <= {report['goal_ratio']}). Medians of "
        f"{report['repeats']} interleaved runs; CPU = this process's CPU seconds (the machine "
        f"is shared: load average {load[0]} before, {load[3]} after the run).",
        "",
        machine_line(report["machine"], "python", "torch", "gdal"),
        "",
        "**Pre-processing alone** (no model: every grid row read, normalised and cut; "
        "threads = GDAL's decoding threads and the warper's `NUM_THREADS`, what the engine's "
        "`read_workers` sets):",
        "",
        "| input | threads | patches | wall s | CPU s | patches/s | ratio (wall) | ratio (CPU) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in report["preprocessing"]:
        lines.append(
            f"| {r['how']} | {r['threads']} | {r['patches']} | {r['wall_s']} | {r['cpu_s']} | "
            f"{r['patches_per_s']} | {r['ratio_wall']} | {r['ratio_cpu']} |"
        )
    lines += [
        "",
        "S1 is warped by GDAL's WarpedVRT (bilinear, 512 x 128 blocks). A destination nodata "
        "value makes GDAL's warper track which output pixels are valid and leaves it on its "
        "general kernel, about 3x the cost of its fast ones; so a float input (NaN as missing "
        "values) is warped without one first, and the pixels that warp leaves at 0 or NaN are "
        "read again from the exact warp, in whole block columns: bit for bit the exact warp's "
        "values (`tests/raster/test_align_fast_warp.py`). *Exact warp only* is the warper as it "
        "was before. With 2 threads the pre-stacked file decodes its tiles on both cores while "
        "the warp stays on one (with the warp option `NUM_THREADS=2` a read of the VRT alone "
        "still takes as much CPU time as wall time: GDAL 3.10 does not spread these blocks "
        "over threads), hence the wider wall-time ratio; the warp's error tolerance does not "
        "matter (the approximate transformer is not where the time goes).",
        "",
        f'**End to end** (`Engine("identity").generate_image` to a GeoTIFF, engine defaults: '
        f"{e2e['read_workers']} read workers, batch {e2e['max_batch_patches']}; medians of "
        f"{report['e2e_repeats']}; outputs bit for bit identical: "
        f"{'yes' if e2e['outputs_identical'] else 'NO'}):",
        "",
        "| request | patches | wall s | CPU s | patches/s | read s | model s | stitch s | "
        "write s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for kind, label in (("aligned", "{s2, s1}"), ("prestacked", "pre-stacked file")):
        r = e2e[kind]
        s = r["stages_s"]
        lines.append(
            f"| {label} | {r['patches']} | {r['wall_s']} | {r['cpu_s']} | {r['patches_per_s']} "
            f"| {s['read']} | {s['model']} | {s['stitch']} | {s['write']} |"
        )
    lines += [
        "",
        f"End-to-end ratio: {e2e['ratio_wall']} (wall), {e2e['ratio_cpu']} (CPU).",
    ]
    write_section("align", "Multimodal alignment", lines)


def main() -> None:
    parser = cli(__doc__)
    parser.add_argument("--size", type=int, default=SIZE, help="S2 scene side in pixels")
    parser.add_argument("--repeats", type=int, default=REPEATS, help="pre-processing runs")
    parser.add_argument("--e2e-repeats", type=int, default=E2E_REPEATS, help="end-to-end runs")
    args = parser.parse_args()
    report = run(args.size, args.repeats, args.e2e_repeats)
    publish("align", report, write_markdown, docs=not args.no_docs)


if __name__ == "__main__":
    main()
