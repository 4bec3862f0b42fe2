"""Trust figures for one source tree: load, a memory soak, and small uploads that cost a lot.

Runs a real ``geoserve serve`` subprocess on 127.0.0.1 from the tree named by ``--src`` (its
``src/`` and ``plugins/geoserve-prithvi`` go first on PYTHONPATH, so that tree's code is what
the server imports; the server reports ``geoserve.__file__``), and measures:

1. Load: ``--model bench-conv`` with ``bench.server``'s flags (batch 2, one torch thread,
   admission bound 100000, cross-request batching on); multipart uploads of the same 16 lake
   crops at 16, 32 and 64 clients, each level capped at 400 requests or 20 s. Per level:
   requests, req/s, p50/p99 latency, non-200 answers, server RSS before and after.
2. Soak: 2,000 more requests of the same crops from 8 clients on the same server; server RSS at
   the start, every 500 requests, and after a 3 s idle pause (room for an idle heap trim).
3. Amplification: a fresh server with ``--model identity`` and default limits receives
   uploads of 1 x 200,704 px, 13-band uint16 deflate GeoTIFFs (about 100 KB each; padded to
   whole patch rows they decode to gigabytes): 8 at once, then 8 more. Each answer's status,
   the server's RSS after start-up, before and after each wave, and its peak (VmHWM).
   A watchdog kills the server if its RSS passes ``--rss-cap-mb`` or the machine's
   MemAvailable falls under ``--min-available-mb``, and says so in the result.
4. Worst case: on that server, waves of the costliest strips the default bounds still admit
   (one at a time at 58,000 px, four at a time at 14,500 px); the server's peak RSS.

The benchmark model comes from this repository's ``bench`` package (on the server's PYTHONPATH
after the tree's own paths), so an older tree can be measured with today's harness.

Not a test: figures depend on the machine. Prints one JSON object and writes it to ``--out``.

    python -m bench.trust --src /path/to/tree --out trust.json
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from rasterio.errors import NotGeoreferencedWarning
from rasterio.io import MemoryFile

from bench.harness import ROOT, free_port, proc_mb, serve_command, wait_ready
from bench.scenes import LAKE, crops
from bench.server import FLAGS as BENCH_FLAGS

LEVELS = (16, 32, 64)
STRIP_WIDTH = 200_704  # 896 patches of 224 in one row: ~2.3 GB as padded float32 rows
STRIP_BANDS = 13


def strip(width: int = STRIP_WIDTH, bands: int = STRIP_BANDS) -> bytes:
    """A small upload (one row, deflate, ~100 KB) whose padded rows are huge.

    Mostly one value with 0.85% seeded noise, so that it deflates to about 100 KB rather than
    the few KB of a constant image; what it costs the server does not depend on the values.
    """
    rng = np.random.default_rng(0)
    data = np.full((bands, 1, width), 1000, np.uint16)
    noisy = rng.random(data.shape) < 0.0085
    data[noisy] = rng.integers(0, 4096, int(noisy.sum()))
    with MemoryFile() as mem, warnings.catch_warnings():
        warnings.simplefilter("ignore", NotGeoreferencedWarning)  # no transform: none needed
        with mem.open(
            driver="GTiff", width=width, height=1, count=bands, dtype="uint16", compress="deflate"
        ) as ds:
            ds.write(data)
        return bytes(mem.read())


def mem_available_mb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return float("inf")


def git_head(repo: Path) -> str:
    res = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return res.stdout.strip()


def git_dirty(repo: Path) -> bool:
    res = subprocess.run(
        ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
    )
    return bool(res.stdout.strip())


class Server:
    """``geoserve serve`` from one source tree, with an RSS watchdog."""

    def __init__(self, src: Path, args: list[str], log_path: Path, bench_model: bool) -> None:
        self.src, self.log_path = src, log_path
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = ["serve", "--host", "127.0.0.1", "--port", str(self.port), *args]
        self.bench_model = bench_model
        self.peak_rss_mb = 0.0
        self.killed: str | None = None
        self.startup_s: float | None = None
        self._stop = threading.Event()

    def start(self, rss_cap_mb: float, min_available_mb: float) -> None:
        # As bench.server.start_server: `import bench.models` registers bench-conv, then the
        # CLI's main(). The first log line says which geoserve ran.
        env = dict(os.environ)
        path = [str(self.src / "src"), str(self.src / "plugins" / "geoserve-prithvi"), str(ROOT)]
        if env.get("PYTHONPATH"):
            path.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(path)
        self.log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop())
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            serve_command(self.args, bench_models=self.bench_model),
            cwd=self.src,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        watch = threading.Thread(target=self._watch, args=(rss_cap_mb, min_available_mb))
        watch.daemon = True
        watch.start()
        try:
            wait_ready(self.url, self.proc, timeout_s=120, log=str(self.log_path))
        except RuntimeError:
            self.stop()
            raise
        self.startup_s = round(time.perf_counter() - t0, 2)

    def _watch(self, rss_cap_mb: float, min_available_mb: float) -> None:
        while not self._stop.is_set() and self.proc.poll() is None:
            rss = proc_mb(self.proc.pid)["VmRSS"] or 0.0
            self.peak_rss_mb = max(self.peak_rss_mb, rss)
            avail = mem_available_mb()
            if rss > rss_cap_mb or avail < min_available_mb:
                self.killed = (
                    f"watchdog SIGKILL: RSS {rss:.0f} MB (cap {rss_cap_mb:.0f}), "
                    f"MemAvailable {avail:.0f} MB (floor {min_available_mb:.0f})"
                )
                self.proc.send_signal(signal.SIGKILL)
                return
            time.sleep(0.05)

    def mem(self) -> dict[str, float | None]:
        return proc_mb(self.proc.pid)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> dict[str, Any]:
        """SIGTERM, wait up to 60 s, then SIGKILL; what happened, and the log's findings."""
        self._stop.set()
        notes = []
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                notes.append("server did not stop within 60 s of SIGTERM; killed")
        self.log.close()
        text = self.log_path.read_text(errors="replace")
        lines = text.splitlines()
        served = next((ln.split(" ", 1)[1] for ln in lines if ln.startswith("GEOSERVE_FILE ")), "")
        if not served.startswith(str(self.src)):
            notes.append(f"WARNING: server imported geoserve from {served!r}, not {self.src}")
        if "Traceback" in text:
            notes.append(f"server log contains a Traceback; see {self.log_path}")
        if self.killed:
            notes.append(self.killed)
        return {
            "args": self.args[5:],
            "geoserve_imported_from": served,
            "startup_s": self.startup_s,
            "exit_code": self.proc.returncode,
            "watchdog_peak_rss_mb": self.peak_rss_mb,
            "log": str(self.log_path),
            "notes": notes,
        }


async def drive(
    url: str,
    bodies: list[bytes],
    concurrency: int,
    max_requests: int,
    max_seconds: float,
    on_done: Callable[[int], None] | None = None,
    timeout: float = 300,
) -> dict[str, Any]:
    """``concurrency`` clients posting ``bodies`` in turn until the count or the time runs out."""
    latencies: list[float] = []
    statuses: collections.Counter[str] = collections.Counter()
    samples: list[str] = []
    counter = iter(range(max_requests))
    deadline = time.perf_counter() + max_seconds

    async def worker(ac: httpx.AsyncClient) -> None:
        for i in counter:
            if time.perf_counter() >= deadline:
                return
            t0 = time.perf_counter()
            try:
                resp = await ac.post(
                    "/v1/images", files={"file": ("s.tif", bodies[i % len(bodies)])}
                )
            except httpx.HTTPError as exc:
                statuses[type(exc).__name__] += 1
                if len(samples) < 5:
                    samples.append(repr(exc))
            else:
                statuses[str(resp.status_code)] += 1
                if resp.status_code == 200:
                    latencies.append(time.perf_counter() - t0)
                elif len(samples) < 5:
                    samples.append(f"{resp.status_code}: {resp.text[:300]}")
            if on_done is not None:
                on_done(sum(statuses.values()))

    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as ac:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(ac) for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    sent = sum(statuses.values())
    ok = statuses.get("200", 0)
    res: dict[str, Any] = {
        "concurrency": concurrency,
        "requests": sent,
        "ok": ok,
        "errors": sent - ok,
        "statuses": dict(statuses),
        "wall_s": round(wall, 2),
        "req_per_s": round(ok / wall, 2) if wall else None,
    }
    if len(latencies) >= 2:
        q = statistics.quantiles(latencies, n=100, method="inclusive")
        res["p50_ms"] = round(q[49] * 1000, 1)
        res["p99_ms"] = round(q[98] * 1000, 1)
    if samples:
        res["error_samples"] = samples
    return res


def log(obj: Any) -> None:
    print(json.dumps(obj), file=sys.stderr, flush=True)


def run_load(server: Server, bodies: list[bytes], a: argparse.Namespace) -> list[dict[str, Any]]:
    asyncio.run(drive(server.url, bodies, 4, 8, 60))  # warm-up, as bench.server
    levels = []
    for c in LEVELS:
        before = server.mem()
        r = asyncio.run(drive(server.url, bodies, c, a.max_requests, a.max_seconds))
        after = server.mem()
        r["rss_before_mb"], r["rss_after_mb"] = before["VmRSS"], after["VmRSS"]
        r["rss_peak_mb"] = after["VmHWM"]
        levels.append(r)
        log({"load": r})
        if not server.alive():
            break
    return levels


def run_soak(server: Server, bodies: list[bytes], a: argparse.Namespace) -> dict[str, Any]:
    rss: list[dict[str, Any]] = [{"requests": 0, "rss_mb": server.mem()["VmRSS"]}]

    def on_done(n: int) -> None:
        if n % 500 == 0:
            rss.append({"requests": n, "rss_mb": server.mem()["VmRSS"]})

    r = asyncio.run(drive(server.url, bodies, a.soak_clients, a.soak_requests, 1e9, on_done))
    time.sleep(3.0)  # idle: room for the server's idle-time heap trim
    rss.append({"requests": r["requests"], "after_idle_s": 3.0, "rss_mb": server.mem()["VmRSS"]})
    r["rss"] = rss
    r["rss_peak_mb"] = server.mem()["VmHWM"]
    log({"soak": r})
    return r


async def wave(url: str, body: bytes, n: int, timeout: float) -> list[dict[str, Any]]:
    async def one(ac: httpx.AsyncClient) -> dict[str, Any]:
        t0 = time.perf_counter()
        try:
            resp = await ac.post("/v1/images", files={"file": ("strip.tif", body)})
        except httpx.HTTPError as exc:
            return {"status": type(exc).__name__, "s": round(time.perf_counter() - t0, 2)}
        out: dict[str, Any] = {"status": resp.status_code, "s": round(time.perf_counter() - t0, 2)}
        if resp.status_code != 200:
            out["message"] = resp.text[:240]
        return out

    limits = httpx.Limits(max_connections=n + 4)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as ac:
        return list(await asyncio.gather(*(one(ac) for _ in range(n))))


def run_amplification(server: Server, a: argparse.Namespace) -> dict[str, Any]:
    body = strip()
    res: dict[str, Any] = {
        "upload": f"1 x {STRIP_WIDTH} px, {STRIP_BANDS} bands uint16, deflate",
        "upload_bytes": len(body),
        "rss_after_startup_mb": server.mem()["VmRSS"],
        "waves": [],
    }
    for _ in range(2):
        if not server.alive():
            res["waves"].append({"skipped": f"server gone (rc={server.proc.returncode})"})
            continue
        before = server.mem()
        t0 = time.perf_counter()
        answers = asyncio.run(wave(server.url, body, a.amp_requests, a.amp_timeout))
        after = server.mem()
        w = {
            "requests": len(answers),
            "statuses": dict(collections.Counter(str(x["status"]) for x in answers)),
            "wall_s": round(time.perf_counter() - t0, 2),
            "rss_before_mb": before["VmRSS"],
            "rss_after_mb": after["VmRSS"],
            "rss_peak_mb": after["VmHWM"],
            "answers": [[x["status"], x["s"]] for x in answers],
            "messages": sorted({x["message"] for x in answers if "message" in x})[:3],
        }
        res["waves"].append(w)
        log({"amplification_wave": {k: v for k, v in w.items() if k != "messages"}})
    res["rss_peak_mb"] = server.mem()["VmHWM"]
    res["watchdog_peak_rss_mb"] = server.peak_rss_mb
    return res


#: Strip widths whose estimate just fits the default 1024 MB bound: one at a time, and four.
WORST = ((58_000, 8), (14_500, 16))


def run_worst(server: Server, a: argparse.Namespace) -> dict[str, Any]:
    """Waves of the costliest strips the default bounds still admit: the worst case they allow."""
    res: dict[str, Any] = {"rss_before_mb": server.mem()["VmRSS"], "waves": []}
    for width, n in WORST:
        if not server.alive():
            break
        answers = asyncio.run(wave(server.url, strip(width), n, a.amp_timeout))
        res["waves"].append(
            {
                "upload": f"1 x {width} px, {STRIP_BANDS} bands uint16",
                "requests": n,
                "statuses": dict(collections.Counter(str(x["status"]) for x in answers)),
                "rss_after_mb": server.mem()["VmRSS"],
                "rss_peak_mb": server.mem()["VmHWM"],
            }
        )
        log({"worst_wave": res["waves"][-1]})
    res["rss_peak_mb"] = server.mem()["VmHWM"]
    return res


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--src", type=Path, default=ROOT, help="geoserve source tree (default: this)")
    ap.add_argument("--out", type=Path, help="also write the JSON here")
    ap.add_argument("--max-requests", type=int, default=400, help="per load level")
    ap.add_argument("--max-seconds", type=float, default=20.0, help="per load level")
    ap.add_argument("--soak-requests", type=int, default=2000)
    ap.add_argument("--soak-clients", type=int, default=8)
    ap.add_argument("--amp-requests", type=int, default=8, help="strips per wave (two waves)")
    ap.add_argument("--amp-timeout", type=float, default=150.0, help="client timeout per strip")
    ap.add_argument("--rss-cap-mb", type=float, default=16_000.0, help="watchdog: server RSS")
    ap.add_argument("--min-available-mb", type=float, default=2_500.0, help="watchdog: machine")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: load,soak,amp,worst")
    return ap.parse_args()


def main() -> dict[str, Any]:
    a = parse_args()
    src = a.src.resolve()
    skip = set(filter(None, a.skip.split(",")))
    logs = a.out.with_suffix("") if a.out else Path("/tmp/bench_trust")
    t_start = time.perf_counter()
    report: dict[str, Any] = {
        "src": str(src),
        "src_commit": git_head(src),
        "src_dirty": git_dirty(src),
        "script": str(Path(__file__).resolve()),
        "script_repo_commit": git_head(ROOT),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "cores": os.cpu_count(),
    }
    if not skip >= {"load", "soak"}:
        bodies = crops(src / "data" / LAKE.name)
        server = Server(
            src, ["--model", "bench-conv", *BENCH_FLAGS], Path(f"{logs}.load.log"), True
        )
        server.start(a.rss_cap_mb, a.min_available_mb)
        try:
            report["load_rss_after_startup_mb"] = server.mem()["VmRSS"]
            if "load" not in skip:
                report["load"] = run_load(server, bodies, a)
            if "soak" not in skip and server.alive():
                report["soak"] = run_soak(server, bodies, a)
        finally:
            report["load_server"] = server.stop()
    if "amp" not in skip:
        server = Server(src, ["--model", "identity"], Path(f"{logs}.amp.log"), False)
        server.start(a.rss_cap_mb, a.min_available_mb)
        try:
            report["amplification"] = run_amplification(server, a)
            if "worst" not in skip:
                report["worst_case"] = run_worst(server, a)
        finally:
            report["amp_server"] = server.stop()
    report["total_s"] = round(time.perf_counter() - t_start, 1)
    report["script_repo_commit_at_end"] = git_head(ROOT)
    if a.out:
        a.out.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
