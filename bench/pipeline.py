"""The pipeline benchmark suite: pre-processing rate, peak memory vs scene size, and TerraTorch.

One command runs every part, writes ``bench/results/pipeline.json``, a plot
(``bench/results/pipeline.png``) and the ``pipeline`` section of docs/benchmarks.md; it also
reruns ``bench.engine`` (engine end to end vs the pure model) so the figures come from one run:

    python -m bench.pipeline [--quick] [--no-docs] [--parts preprocessing,memory,peers,engine]

Parts:

1. Pre-processing alone on a synthetic 4096 x 4096 x 6 band uint16 scene (tiled 256, DEFLATE +
   predictor): patches per second delivered by a naive baseline (one 224 px window read per
   patch, cast and normalised in numpy) against geoserve's row reader (block-aligned cached
   row bands, patches cut in memory), with 1 and 2 GDAL decoding threads, and geoserve's torch
   cutting path on CPU tensors.
2. Peak RSS of a whole run (GeoTIFF in, GeoTIFF out) against scene size, 6 bands, squares of
   2k to 16k pixels: geoserve streaming, geoserve holding the whole output (``streaming=False``)
   and TerraTorch's ``tiled_inference`` (which needs the scene and its output as tensors).
   Every run is its own process; the model is a seeded 1x1 convolution so I/O and memory, not
   arithmetic, dominate.
3. Against TerraTorch's ``tiled_inference`` with the same weights (``bench-conv``), scene, patch
   224, stride 192 and the same crop of 16 px per side (``delta=16`` there, ``center`` blend
   here): wall time and peak RSS ratios, and the largest absolute difference of the logits.

TerraTorch comes from its PyPI wheel (``pip download --no-deps``, cached in ``.cache/``): the
full package pulls Lightning and more, and ``tiled_inference`` needs only torch and tqdm.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
import torch
from torch import nn

from bench import engine as engine_bench
from bench.harness import (
    RESULTS,
    ROOT,
    best_of,
    cli,
    machine,
    machine_line,
    peak_rss_mb,
    timed,
    write_section,
)
from bench.models import (
    BANDS,
    MEAN,
    PATCH,
    SCALE,
    SIX,
    STD,
    STRIDE,
    BenchConv,
    Pointwise,
    bench_patcher,
    register_conv6,
)
from bench.scenes import LAKE, synthetic_scene
from geoserve import Engine

SIZES = (2048, 4096, 8192, 10980, 16384)
TERRATORCH_MAX = 8192  # larger scenes would need >10 GB as tensors on this 24 GB machine


# -- part 1: pre-processing alone --------------------------------------------------------------


def _naive(path: Path, threads: int) -> int:
    """One window read per patch, cast and normalised in numpy (a dataset per thread)."""
    with rasterio.open(path) as ds:
        h, w = ds.height, ds.width
    origins = [(r, c) for r in range(0, h, PATCH) for c in range(0, w, PATCH)]
    mean = np.asarray(MEAN, np.float32)[:, None, None]
    std = np.asarray(STD, np.float32)[:, None, None]

    def work(chunk: list[tuple[int, int]]) -> int:
        with rasterio.open(path) as ds:
            for r, c in chunk:
                inside = r + PATCH <= h and c + PATCH <= w  # boundless reads go through a VRT
                window = ((r, r + PATCH), (c, c + PATCH))
                raw = ds.read(window=window, boundless=not inside)
                _ = (raw.astype(np.float32) * np.float32(SCALE) - mean) / std
        return len(chunk)

    chunks = [origins[i::threads] for i in range(threads)]
    with ThreadPoolExecutor(threads) as pool:
        return sum(pool.map(work, chunks))


def _geoserve_rows(path: Path, threads: int, on_torch: bool) -> int:
    from geoserve.raster import open_raster

    proc = bench_patcher(SIX).replace(blend="none")  # patches side by side, no overlap
    n = 0
    with open_raster(path, threads=threads) as src:
        ctx = proc.prepare([src])
        for r in range(ctx.grid.rows):
            if on_torch:
                row = proc.read_row_on([src], ctx, r, torch.device("cpu"))
            else:
                row = proc.read_row([src], ctx, r)
            n += len(row.cols)
    return n


def preprocessing(quick: bool) -> list[dict[str, Any]]:
    from geoserve.raster.gdal_setup import limit_gdal_cache

    limit_gdal_cache()  # 64 MB, as in every engine
    path = synthetic_scene(2048 if quick else 4096)
    cases: list[tuple[str, int, Callable[[], int]]] = [
        ("naive: window read per patch", 1, lambda: _naive(path, 1)),
        ("naive: window read per patch", 2, lambda: _naive(path, 2)),
        ("geoserve: cached row bands, numpy cut", 1, lambda: _geoserve_rows(path, 1, False)),
        ("geoserve: cached row bands, numpy cut", 2, lambda: _geoserve_rows(path, 2, False)),
        ("geoserve: cached row bands, torch cut", 2, lambda: _geoserve_rows(path, 2, True)),
    ]
    out = []
    for name, threads, fn in cases:
        best, n = best_of(fn, 3)  # after a call that warms the page cache and GDAL's caches
        rate = n / best
        out.append(
            {
                "how": name,
                "threads": threads,
                "patches": n,
                "seconds": round(best, 3),
                "patches_per_s": round(rate, 1),
                "per_thread": round(rate / threads, 1),
            }
        )
        print(out[-1], flush=True)
    return out


# -- children: one measured run per process ----------------------------------------------------


def child(mode: str, src: str, dst: str, model: str) -> dict[str, Any]:
    """Run one scene end to end in this process; report wall time and peak RSS."""
    torch.set_num_threads(os.cpu_count() or 1)
    if mode in ("streaming", "whole"):
        engine = Engine(
            model,
            max_batch_patches=8,
            streaming=mode == "streaming",
            output_kind="raw" if dst.endswith(".npy") else None,
        )

        def run() -> None:
            if dst.endswith(".npy"):
                out = engine.generate_image(src, out_format="tensor").raise_for_error()
                np.save(dst, out.outputs.tensor.numpy())
            else:
                engine.generate_image(src, output_path=dst).raise_for_error()

    else:
        from tests.models.prithvi.reference import load_tiled_inference

        tiled = load_tiled_inference()
        net = (Pointwise() if model == "bench-1x1" else BenchConv()).eval()

        def run() -> None:
            _terratorch(src, dst, model, tiled, net)

    wall, _ = timed(run)
    return {"mode": mode, "wall_s": round(wall, 2), "peak_rss_mb": round(peak_rss_mb(), 1)}


def _terratorch(src: str, dst: str, model_name: str, tiled: Any, model: nn.Module) -> None:
    """What a TerraTorch user writes: read the scene, normalise, tiled_inference, write."""
    bands = BANDS if model_name == "bench-conv" and Path(src).name == LAKE.name else None
    with rasterio.open(src) as ds:
        raw = ds.read([b + 1 for b in bands] if bands else None)
        profile = ds.profile
    x = torch.from_numpy(raw.astype(np.float32))
    del raw
    x = (x * SCALE - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None]
    with torch.inference_mode():
        y = tiled.tiled_inference(
            model,
            x[None],
            crop=PATCH,
            stride=STRIDE,
            delta=(PATCH - STRIDE) // 2,
            average_patches=True,
            blend_overlaps=True,
            batch_size=8,
            padding="reflect",
        )[0]
    del x
    if dst.endswith(".npy"):
        np.save(dst, y.numpy())
        return
    classes = y.argmax(0).to(torch.uint8).numpy()[None]
    profile.update(count=1, dtype="uint8", tiled=True, blockxsize=256, blockysize=256)
    profile.update(compress="deflate", predictor=2, nodata=None, BIGTIFF="IF_SAFER")
    with rasterio.open(dst, "w", **profile) as out:
        out.write(classes)


def run_child(mode: str, src: Path, dst: Path, model: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.pipeline", "--child", mode, str(src), str(dst), model]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, cwd=ROOT)
    if res.returncode != 0:
        return {"mode": mode, "error": res.stderr.strip().splitlines()[-1][:200]}
    result: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    return result


# -- part 2: memory vs scene size --------------------------------------------------------------


def memory(quick: bool) -> list[dict[str, Any]]:
    rows = []
    for size in SIZES[:2] if quick else SIZES:
        scene = synthetic_scene(size)
        with tempfile.TemporaryDirectory() as tmp:
            for mode in ("streaming", "whole", "terratorch"):
                if mode == "terratorch" and size > TERRATORCH_MAX:
                    continue
                r = run_child(mode, scene, Path(tmp) / f"{mode}.tif", "bench-1x1")
                r["size"] = size
                rows.append(r)
                print(r, flush=True)
    return rows


# -- part 3: against TerraTorch ----------------------------------------------------------------


def peers(quick: bool) -> list[dict[str, Any]]:
    scenes = [("lake scene 1536x768", LAKE)]
    if not quick:
        scenes.append(("synthetic 4096x4096", synthetic_scene(4096)))
    out = []
    for label, scene in scenes:
        model = "bench-conv" if scene == LAKE else "bench-conv-6"
        if model == "bench-conv-6":
            register_conv6()
        with tempfile.TemporaryDirectory() as tmp:
            g = run_child("streaming", scene, Path(tmp) / "g.npy", model)
            t = run_child("terratorch", scene, Path(tmp) / "t.npy", "bench-conv")
            a, b = np.load(Path(tmp) / "g.npy"), np.load(Path(tmp) / "t.npy")
        diff = float(np.abs(a - b).max())
        agree = float((a.argmax(0) == b.argmax(0)).mean())
        m = PATCH // 2
        inner = float(np.abs(a - b)[:, m:-m, m:-m].max())
        row = {
            "scene": label,
            "geoserve": g,
            "terratorch": t,
            "wall_ratio": round(t["wall_s"] / g["wall_s"], 2),
            "rss_ratio": round(t["peak_rss_mb"] / g["peak_rss_mb"], 2),
            "max_abs_diff": diff,
            "max_abs_diff_interior": inner,
            "class_agreement": round(agree, 6),
        }
        print(row, flush=True)
        out.append(row)
    return out


# -- report ------------------------------------------------------------------------------------


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for mode, style in (("streaming", "o-"), ("whole", "s--"), ("terratorch", "^:")):
        pts = [r for r in report["memory"] if r.get("mode") == mode and "peak_rss_mb" in r]
        if pts:
            left.plot(
                [r["size"] for r in pts],
                [r["peak_rss_mb"] / 1024 for r in pts],
                style,
                label={"whole": "geoserve, whole output"}.get(mode, mode),
            )
    left.set(xlabel="scene side (px), 6 bands", ylabel="peak RSS (GiB)", title="Memory vs size")
    left.legend()
    pre = report["preprocessing"]
    labels = [
        f"{p['how'].split(':')[0]}\n{p['how'].split(': ')[1]}\n{p['threads']} thr" for p in pre
    ]
    right.barh(range(len(pre)), [p["patches_per_s"] for p in pre])
    right.set_yticks(range(len(pre)), labels, fontsize=7)
    right.set(xlabel="patches / s (224 px, 6 bands)", title="Pre-processing alone")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_markdown(report: dict[str, Any]) -> None:
    lines = [
        "One command: pre-processing rate, peak memory against scene size, and TerraTorch's "
        "`tiled_inference` side by side; JSON in `bench/results/pipeline.json`, the plot below "
        "in `docs/pipeline.png`. " + machine_line(report["machine"], "python", "torch", "gdal"),
        "",
        "![Peak memory against scene size; pre-processing rates](pipeline.png)",
        "",
        "**Pre-processing alone** (synthetic 6-band uint16 scene, tiled 256, DEFLATE; 224 px "
        "patches without overlap, cast and normalised; GDAL block cache 64 MB, geoserve's "
        "default; best of 3). With a working block cache one window read per patch mostly "
        "hits decoded tiles, so on a scene this size it comes close to geoserve's row bands; "
        "what geoserve's reading buys is memory that stays flat (next table), not a faster "
        "cut. GDAL's own default cache (5 % of RAM) would hold the whole decoded scene:",
        "",
        "| how | threads | patches | patches/s | per thread |",
        "| --- | --- | --- | --- | --- |",
    ]
    for p in report["preprocessing"]:
        lines.append(
            f"| {p['how']} | {p['threads']} | {p['patches']} | {p['patches_per_s']} | "
            f"{p['per_thread']} |"
        )
    lines += [
        "",
        "**Peak RSS against scene size** (whole process, GeoTIFF in to GeoTIFF out, 6 bands, "
        "seeded 1x1 convolution, patch 224, stride 192, batch 8):",
        "",
        "| side (px) | mode | wall s | peak RSS MB |",
        "| --- | --- | --- | --- |",
    ]
    for r in report["memory"]:
        value = r.get("peak_rss_mb", r.get("error"))
        lines.append(f"| {r['size']} | {r['mode']} | {r.get('wall_s', '-')} | {value} |")
    lines += [
        "",
        f"TerraTorch is run up to {TERRATORCH_MAX} px: it holds the scene and its output as "
        "float32 tensors (16384 px x 6 bands is 6 GiB before any copy).",
        "",
        "**Against TerraTorch `tiled_inference`** (same `bench-conv` weights, patch 224, stride "
        "192, 16 px cropped per side in both; geoserve streams, TerraTorch keeps all in memory):",
        "",
        "| scene | geoserve s | TerraTorch s | time TT/geoserve | geoserve MB | TerraTorch MB | "
        "RSS TT/geoserve | max abs diff (all / interior) | same class |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in report["peers"]:
        g, t = r["geoserve"], r["terratorch"]
        lines.append(
            f"| {r['scene']} | {g['wall_s']} | {t['wall_s']} | {r['wall_ratio']} | "
            f"{g['peak_rss_mb']} | {t['peak_rss_mb']} | {r['rss_ratio']} | "
            f"{r['max_abs_diff']:.3g} / {r['max_abs_diff_interior']:.3g} | "
            f"{100 * r['class_agreement']:.4f} % |"
        )
    write_section("pipeline", "Pipeline", lines)


def main() -> None:
    parser = cli(__doc__)
    parser.add_argument("--quick", action="store_true", help="small scenes only (a smoke run)")
    parser.add_argument(
        "--parts",
        default="preprocessing,memory,peers,engine",
        help="comma-separated parts to run; the others keep their last results",
    )
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        if args.child[3] == "bench-conv-6":
            register_conv6()
        print(json.dumps(child(*args.child)))
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    previous = RESULTS / "pipeline.json"
    report: dict[str, Any] = json.loads(previous.read_text()) if previous.exists() else {}
    report["machine"] = machine()
    parts = set(args.parts.split(","))
    for name, part in (("preprocessing", preprocessing), ("memory", memory), ("peers", peers)):
        if name in parts:
            report[name] = part(args.quick)
    if "engine" in parts:
        engine_report = engine_bench.run()
        report["engine"] = engine_report
        if not args.no_docs:
            engine_bench.write_markdown(engine_report)
    (RESULTS / "pipeline.json").write_text(json.dumps(report, indent=2))
    plot(report, RESULTS / "pipeline.png")
    if not args.no_docs:
        plot(report, ROOT / "docs" / "pipeline.png")
        write_markdown(report)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
