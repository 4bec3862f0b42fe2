"""Server load: requests/s and latency percentiles at 1, 4, 16 and 64 concurrent clients.

A bounded loopback load generator (asyncio + httpx, N requests always outstanding) against
``geoserve serve`` with cross-request batching on, and against the same server with it off
(each batch holds one request's patches). Requests are multipart uploads of crops of the
bundled lake scene, mixed sizes (1 to 4 patches of 224 px), model ``bench-conv``.

    .venv/bin/python bench/bench_server.py           # prints JSON, updates docs/benchmarks.md
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import rasterio
from rasterio.io import MemoryFile
from rasterio.windows import Window

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _docs import update_section  # noqa: E402
from bench_engine import SCENE  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LEVELS = (1, 4, 16, 64)
SIZES = (192, 192, 300, 384)  # 1, 1, 4, 4 patches at patch 224 / stride 192
BATCH = 2  # the fastest per patch for bench-conv on this CPU (see model_ms_per_patch)


def crops(scene: Path = SCENE) -> list[bytes]:
    """16 crops of ``scene`` (seed 0), 192 to 384 px, as GeoTIFF bytes."""
    out = []
    with rasterio.open(scene) as src:
        rng = np.random.default_rng(0)
        for i in range(16):
            size = SIZES[i % len(SIZES)]
            r = int(rng.integers(0, src.height - size))
            c = int(rng.integers(0, src.width - size))
            win = Window(c, r, size, size)
            profile = {
                **src.profile,
                "width": size,
                "height": size,
                "transform": src.window_transform(win),
            }
            with MemoryFile() as mem:
                with mem.open(**profile) as dst:
                    dst.write(src.read(window=win))
                    dst.descriptions = src.descriptions
                out.append(bytes(mem.read()))
    return out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(port: int, cross: bool) -> subprocess.Popen[str]:
    args = [
        "serve",
        "--model",
        "bench-conv",
        "--port",
        str(port),
        "--batch-size",
        str(BATCH),
        "--max-queued-patches",
        "100000",
        "--threads",
        str(THREADS),
    ]
    if not cross:
        args.append("--no-cross-request-batching")
    code = (
        f"import sys; sys.path.insert(0, 'bench'); import bench_engine; "
        f"from geoserve.cli import main; sys.exit(main({args!r}))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        text=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(600):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health/ready").status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("server did not start")


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


REPEATS = 3
# One torch thread per server: with two, OpenMP's barrier stalls whenever the reader or the
# HTTP threads take a core, and per-patch model time swings 8-15 ms at random, which swamps
# the effect measured here. The model-only timings below use the same setting.
THREADS = 1


def run_both(bodies: list[bytes]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Both servers up at once; at each level the modes alternate, so drift hits both."""
    ports = {True: free_port(), False: free_port()}
    procs = {cross: start_server(port, cross) for cross, port in ports.items()}
    urls = {cross: f"http://127.0.0.1:{port}" for cross, port in ports.items()}
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
    from bench_engine import BenchConv

    torch.set_num_threads(THREADS)
    model = BenchConv().eval()
    out = {}
    with torch.inference_mode():
        for b in (1, 2, 4, 8, 16):
            x = torch.randn(b, 6, 224, 224)
            model(x)
            reps = max(2, 32 // b)
            t0 = time.perf_counter()
            for _ in range(reps):
                model(x)
            out[b] = round(1000 * (time.perf_counter() - t0) / (b * reps), 2)
    return out


def main() -> dict[str, Any]:
    bodies = crops()
    per_patch = model_ms_per_patch()
    time.sleep(1.0)  # let the measuring process's own torch threads settle
    on, off = run_both(bodies)
    return {
        "model": "bench-conv",
        "batch": BATCH,
        "sizes": SIZES,
        "batching_on": on,
        "model_ms_per_patch": per_patch,
        "batching_off": off,
        "machine": {
            "cores": os.cpu_count(),
            "cpu": platform.machine(),
            "python": sys.version.split()[0],
            "date": time.strftime("%Y-%m-%d"),
        },
    }


def write_markdown(report: dict[str, Any]) -> None:
    m = report["machine"]
    lines = [
        "## Server under load (`bench/bench_server.py`)",
        "",
        "Loopback load generator (N requests always outstanding, asyncio + httpx) against "
        f"`geoserve serve --model bench-conv --batch-size {report['batch']}`, with "
        "cross-request batching on "
        "and off (`--no-cross-request-batching`: one request's patches per batch). Requests: "
        "multipart uploads of crops of the lake scene, 192 to 384 px (1 to 4 patches). Both "
        f"servers run side by side; at each level the modes alternate, {REPEATS} runs each, "
        "and the median run (by req/s) is shown. "
        f"Machine: {m['cores']} cores ({m['cpu']}), no GPU, Python {m['python']}, {m['date']}.",
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
        "On a GPU the curve goes the other way (101 vs 2,182 patches/s at batch 1 vs 128 on an "
        "H200, ../shared/reference/hardware_limits.md): that is where cross-request batching "
        "pays, and this benchmark's GPU run needs a lent GPU machine (none was lent to this "
        "task).",
    ]
    update_section("server", "\n".join(lines))


if __name__ == "__main__":
    report = main()
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "server.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    if "--no-docs" not in sys.argv:
        write_markdown(report)
