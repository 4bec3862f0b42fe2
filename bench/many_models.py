"""Many models, one server: a mixed load against one three-model server and three one-model ones.

    python -m bench.many_models         # prints JSON, updates docs/benchmarks.md

Three models (``demo-water``, ``ndwi-water`` and ``bench-conv``, a small convolutional head)
are served two ways on the same machine, all four servers up at once: one ``geoserve serve
--model A --model B --model C`` and three ``geoserve serve --model X``, each with the same
engine flags (batch 2, one torch thread). The load is multipart uploads of crops of the
bundled lake scene (1 to 4 patches of 224 px), N requests always outstanding, each request to
the next model in turn: to the one server naming its model, or to that model's own server.
The two ways alternate, REPEATS times, the median run kept. Memory is each server's resident
set (VmRSS) after the runs: the one server's against the three servers' sum.

A second load asks for the share one model gets when another is flooded: 64 clients on
``bench-conv`` and 4 on ``ndwi-water`` at once, against the one server; its p99 for
``ndwi-water`` beside ``ndwi-water``'s alone on the same server. Both loads also run against
the one server started with ``--device-turns`` (one model's batch at a time, as on an
accelerator), to show what the turns cost where the device is the CPU's cores.
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
    proc_mb,
    publish,
    start_serve,
    write_section,
)
from bench.scenes import crops
from geoserve.engine.cpu_inference import cpu_name

MODELS = ("demo-water", "ndwi-water", "bench-conv")
FLAGS = ["--batch-size", "2", "--max-queued-patches", "100000", "--threads", "1"]
LEVELS = (3, 12, 48)
REPEATS = 5


def start(models: tuple[str, ...], *extra: str) -> tuple[str, subprocess.Popen[str]]:
    args = ["serve", *[a for m in models for a in ("--model", m)], *FLAGS, *extra]
    return start_serve(args, bench_models=True, timeout_s=120)


async def load(
    targets: list[tuple[str, str | None]], bodies: list[bytes], concurrency: int, total: int
) -> dict[str, Any]:
    """``total`` requests, ``concurrency`` outstanding, request i to ``targets[i % n]``
    (a server's URL, and the model to name there or None)."""
    latencies: dict[str, list[float]] = {}
    counter = iter(range(total))

    async def worker(ac: httpx.AsyncClient) -> None:
        for i in counter:
            url, model = targets[i % len(targets)]
            data = {"model": model} if model else {}
            t0 = time.perf_counter()
            resp = await ac.post(
                f"{url}/v1/images", files={"file": ("s.tif", bodies[i % len(bodies)])}, data=data
            )
            resp.raise_for_status()
            latencies.setdefault(model or url, []).append(time.perf_counter() - t0)

    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=900, limits=limits) as ac:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(ac) for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    every = [x for v in latencies.values() for x in v]
    return {"req_per_s": round(total / wall, 2), "p99_ms": _p99(every), "wall_s": round(wall, 2)}


def _p99(values: list[float]) -> float:
    if len(values) < 2:
        return round(1000 * max(values, default=0.0), 1)
    return round(statistics.quantiles(values, n=100, method="inclusive")[98] * 1000, 1)


async def flooded(url: str, bodies: list[bytes], total_b: int) -> dict[str, float]:
    """64 clients on bench-conv while 4 ask ndwi-water for ``total_b`` requests: B's p99."""
    stop = asyncio.Event()
    b_times: list[float] = []

    async def flood(ac: httpx.AsyncClient) -> None:
        i = 0
        while not stop.is_set():
            files = {"file": ("s.tif", bodies[i % len(bodies)])}
            (
                await ac.post(f"{url}/v1/images", files=files, data={"model": "bench-conv"})
            ).raise_for_status()
            i += 1

    counter = iter(range(total_b))

    async def light(ac: httpx.AsyncClient) -> None:
        for i in counter:
            files = {"file": ("s.tif", bodies[i % len(bodies)])}
            t0 = time.perf_counter()
            (
                await ac.post(f"{url}/v1/images", files=files, data={"model": "ndwi-water"})
            ).raise_for_status()
            b_times.append(time.perf_counter() - t0)

    async with httpx.AsyncClient(timeout=900, limits=httpx.Limits(max_connections=80)) as ac:
        floods = [asyncio.create_task(flood(ac)) for _ in range(64)]
        await asyncio.sleep(2.0)  # the flood first
        await asyncio.gather(*(light(ac) for _ in range(4)))
        stop.set()
        await asyncio.gather(*floods)
    return {"p99_ms": _p99(b_times), "requests": len(b_times)}


def run() -> dict[str, Any]:
    bodies = crops()
    started: list[subprocess.Popen[str]] = []
    try:
        one_url, one = start(MODELS)
        started.append(one)
        turns_url, turns = start(MODELS, "--device-turns")
        started.append(turns)
        singles: dict[str, tuple[str, subprocess.Popen[str]]] = {}
        for m in MODELS:
            singles[m] = start((m,))
            started.append(singles[m][1])
        ways = {
            "one": [(one_url, m) for m in MODELS],
            "turns": [(turns_url, m) for m in MODELS],
            "three": [(singles[m][0], None) for m in MODELS],
        }
        for targets in ways.values():
            asyncio.run(load(targets, bodies, 3, 6))  # warm-up: every model once
        levels = []
        for c in LEVELS:
            runs: dict[str, list[dict[str, Any]]] = {k: [] for k in ways}
            for _ in range(REPEATS):
                for way, targets in ways.items():
                    runs[way].append(asyncio.run(load(targets, bodies, c, max(120, 8 * c))))
            med = {k: sorted(v, key=lambda r: r["req_per_s"])[len(v) // 2] for k, v in runs.items()}
            levels.append({"concurrency": c, **med})
        alone = asyncio.run(load([(one_url, "ndwi-water")], bodies, 4, 24))
        beside = asyncio.run(flooded(one_url, bodies, 24))
        beside_turns = asyncio.run(flooded(turns_url, bodies, 24))
        memory = {
            "one_mb": proc_mb(one.pid)["VmRSS"],
            "three_mb": round(sum(proc_mb(p.pid)["VmRSS"] or 0 for _, p in singles.values()), 1),
        }
    finally:
        for proc in started:  # (those that did start, also when another did not)
            proc.terminate()
            proc.wait(timeout=60)
    return {
        "models": list(MODELS),
        "levels": levels,
        "memory": memory,
        "ndwi_alone": alone,
        "ndwi_beside_flood": beside,
        "ndwi_beside_flood_turns": beside_turns,
        "machine": machine(),
        "cpu": cpu_name(),
    }


def write_markdown(report: dict[str, Any]) -> None:
    m = report["machine"]
    lines = [
        f"{machine_line(m, 'torch')} CPU: {report.get('cpu', '?')}. One `geoserve serve "
        "--model demo-water --model ndwi-water "
        "--model bench-conv` against three one-model servers, all four up at once, the same "
        "engine flags (batch 2, one torch thread); multipart uploads of lake-scene crops (1 to 4 "
        f"patches of 224 px), each request to the next model in turn; median of {REPEATS} "
        "alternating runs.",
        "",
        "| concurrent requests | one server: req/s | p99 (ms) | three servers: req/s | p99 (ms) "
        "| one / three | one server with `--device-turns`: req/s | p99 (ms) | turns / three |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for lv in report["levels"]:
        one, three, turns = lv["one"], lv["three"], lv["turns"]
        ratio = one["req_per_s"] / three["req_per_s"] if three["req_per_s"] else 0
        t_ratio = turns["req_per_s"] / three["req_per_s"] if three["req_per_s"] else 0
        lines.append(
            f"| {lv['concurrency']} | {one['req_per_s']} | {one['p99_ms']} | "
            f"{three['req_per_s']} | {three['p99_ms']} | {ratio:.2f} | "
            f"{turns['req_per_s']} | {turns['p99_ms']} | {t_ratio:.2f} |"
        )
    mem = report["memory"]
    alone, beside = report["ndwi_alone"], report["ndwi_beside_flood"]
    lines += [
        "",
        f"Resident memory after the runs: the one server {mem['one_mb']} MB, the three "
        f"{mem['three_mb']} MB together. `ndwi-water`'s p99 on the one server: "
        f"{alone['p99_ms']} ms with 4 clients alone, {beside['p99_ms']} ms with the same 4 "
        "clients while 64 others flood `bench-conv` (each model has its own engine and "
        "batches, their torch threads side by side on the cores), "
        f"{report['ndwi_beside_flood_turns']['p99_ms']} ms with `--device-turns` (one model's "
        "batch at a time, the default on an accelerator: on the CPU it leaves cores idle).",
    ]
    write_section("many_models", "Many models, one server", lines)


def main() -> None:
    args = cli(__doc__).parse_args()
    publish("many_models", run(), write_markdown, docs=not args.no_docs)


if __name__ == "__main__":
    main()
