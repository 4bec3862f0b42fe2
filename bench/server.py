"""Server load: requests/s and latency percentiles at 1, 4, 16 and 64 concurrent clients.

A bounded loopback load generator (asyncio + httpx, N requests always outstanding) against
``geoserve serve`` with cross-request batching on, and against the same server with it off
(each batch holds one request's patches). Requests are multipart uploads of crops of the
bundled lake scene, mixed sizes (1 to 4 patches of 224 px), model ``bench-conv``, on the CPU.

    python -m bench.server              # prints JSON, updates docs/benchmarks.md
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import time
from typing import Any

import httpx

from bench.harness import (
    cli,
    machine,
    machine_line,
    publish,
    start_serve,
    throughput,
    write_section,
)
from bench.scenes import CROP_SIZES, crops

LEVELS = (1, 4, 16, 64)
BATCH = 2  # the fastest per patch for bench-conv on this CPU (see model_ms_per_patch)
REPEATS = 3
# One torch thread per server: with two, OpenMP's barrier stalls whenever the reader or the
# HTTP threads take a core, and per-patch model time swings 8-15 ms at random, which swamps
# the effect measured here. The model-only timings below use the same setting.
THREADS = 1
#: ``geoserve serve`` flags shared with ``bench.trust``'s load part.
FLAGS = ["--batch-size", str(BATCH), "--max-queued-patches", "100000", "--threads", str(THREADS)]


def start_server(cross: bool) -> tuple[str, subprocess.Popen[str]]:
    args = ["serve", "--model", "bench-conv", *FLAGS]
    if not cross:
        args.append("--no-cross-request-batching")
    return start_serve(args, bench_models=True)


async def load(url: str, bodies: list[bytes], concurrency: int, total: int) -> dict[str, Any]:
    latencies: list[float] = []
    counter = iter(range(total))

    async def worker(ac: httpx.AsyncClient) -> None:
        for i in counter:
            body = bodies[i % len(bodies)]
            t0 = time.perf_counter()
            resp = await ac.post("/v1/images", files={"file": ("s.tif", body)})
            resp.raise_for_status()
            latencies.append(time.perf_counter() - t0)

    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as ac:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(ac) for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    q = statistics.quantiles(latencies, n=100, method="inclusive")
    return {
        "concurrency": concurrency,
        "requests": total,
        "wall_s": round(wall, 2),
        "req_per_s": round(total / wall, 2),
        "p50_ms": round(q[49] * 1000, 1),
        "p90_ms": round(q[89] * 1000, 1),
        "p99_ms": round(q[98] * 1000, 1),
    }


def run_both(bodies: list[bytes]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Both servers up at once; at each level the modes alternate, so drift hits both."""
    started = {cross: start_server(cross) for cross in (True, False)}
    procs = {cross: proc for cross, (_, proc) in started.items()}
    urls = {cross: url for cross, (url, _) in started.items()}
    results: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    try:
        for url in urls.values():
            asyncio.run(load(url, bodies, 4, 8))  # warm-up
        for c in LEVELS:
            runs: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
            for _ in range(REPEATS):
                for cross in (True, False):
                    runs[cross].append(asyncio.run(load(urls[cross], bodies, c, max(32, 2 * c))))
            for cross in (True, False):
                ordered = sorted(runs[cross], key=lambda r: r["req_per_s"])
                results[cross].append(ordered[len(ordered) // 2])  # the median run
    finally:
        for proc in procs.values():
            proc.terminate()
            proc.wait(timeout=60)
    return results[True], results[False]


def model_ms_per_patch() -> dict[int, float]:
    """The bare model's cost per patch at each batch size (same process, same run)."""
    import torch

    from bench.models import BenchConv

    torch.set_num_threads(THREADS)
    model = BenchConv().eval()
    out = {}
    with torch.inference_mode():
        for b in (1, 2, 4, 8, 16):
            x = torch.randn(b, 6, 224, 224)
            rate = throughput(lambda x=x: model(x), per_call=b, reps=max(2, 32 // b))
            out[b] = round(1000 / rate, 2)
    return out


def run() -> dict[str, Any]:
    bodies = crops()
    per_patch = model_ms_per_patch()
    time.sleep(1.0)  # let the measuring process's own torch threads settle
    on, off = run_both(bodies)
    return {
        "model": "bench-conv",
        "batch": BATCH,
        "sizes": CROP_SIZES,
        "batching_on": on,
        "model_ms_per_patch": per_patch,
        "batching_off": off,
        "machine": machine(),
    }


def write_markdown(report: dict[str, Any]) -> None:
    lines = [
        "Loopback load generator (N requests always outstanding, asyncio + httpx) against "
        f"`geoserve serve --model bench-conv --batch-size {report['batch']}`, with "
        "cross-request batching on "
        "and off (`--no-cross-request-batching`: one request's patches per batch). Requests: "
        "multipart uploads of crops of the lake scene, 192 to 384 px (1 to 4 patches). Both "
        f"servers run side by side; at each level the modes alternate, {REPEATS} runs each, "
        "and the median run (by req/s) is shown. " + machine_line(report["machine"], "python"),
        "",
        "| clients | batching | requests | req/s | p50 ms | p90 ms | p99 ms |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for on, off in zip(report["batching_on"], report["batching_off"], strict=True):
        for label, r in (("on", on), ("off", off)):
            lines.append(
                f"| {r['concurrency']} | {label} | {r['requests']} | {r['req_per_s']} | "
                f"{r['p50_ms']} | {r['p90_ms']} | {r['p99_ms']} |"
            )
    lines += ["", "| clients | throughput on/off | p90 off/on |", "| --- | --- | --- |"]
    for on, off in zip(report["batching_on"], report["batching_off"], strict=True):
        lines.append(
            f"| {on['concurrency']} | {on['req_per_s'] / off['req_per_s']:.2f}x | "
            f"{off['p90_ms'] / on['p90_ms']:.2f}x |"
        )
    per = report["model_ms_per_patch"]
    lines += [
        "",
        f"The bare model in the same run ({THREADS} thread), ms per patch by batch size: "
        + ", ".join(f"{b}: {v}" for b, v in per.items())
        + ". At 1 client both modes do exactly the same work, so the on/off ratio in that row "
        "measures this shared machine's run-to-run noise (seen between 0.6x and 1.7x). The "
        "rows for 4 to 64 clients stay inside that band: on this CPU cross-request batching "
        "makes no measurable difference, because the model's cost per patch does not fall "
        "with batch size (it rises past a few patches, out of cache). An earlier run with a "
        "cap of 16 and two torch threads lost about a third of the throughput to cache misses "
        "and OpenMP stalls, so on CPU keep `--batch-size` small and consider `--threads 1`. "
        + GPU_NOTE,
    ]
    write_section("server", "Server under load", lines)


#: Where the GPU figures come from, and the command for the ones still missing.
GPU_NOTE = (
    "On a GPU the curve goes the other way (101 vs 2,182 patches/s at batch 1 vs 128 for the "
    "300M shape in bf16, measured 2026-11-30 on one NVIDIA H200, torch 2.11, CUDA 13: a "
    "Prithvi-shaped timm encoder with a small segmentation head alone, random weights and "
    "input, no I/O): that is where cross-request batching pays. This benchmark runs its "
    "servers on the CPU and has no GPU figures yet; on a machine with a CUDA GPU, "
    "`python -m bench.gpu` measures the engine end to end there (see docs/performance.md)."
)


def main() -> None:
    args = cli(__doc__).parse_args()
    publish("server", run(), write_markdown, docs=not args.no_docs)


if __name__ == "__main__":
    main()
