"""What every benchmark shares: timing, memory, the machine line, results and docs/benchmarks.md.

- timing: :func:`timed` (one call), :func:`best_of` (the fastest of N after a warm call),
  :func:`throughput` (items per second of a repeated call);
- memory: :func:`proc_mb` (VmRSS / VmHWM of a process), :func:`peak_rss_mb` (this process);
- the machine: :func:`machine` (a dict for the JSON) and :func:`machine_line` (the sentence
  each section of docs/benchmarks.md carries);
- output: :func:`cli` (the common flags), :func:`publish` (``bench/results/NAME.json``, the
  JSON on stdout, then the docs section), :func:`write_section` (one named section of
  docs/benchmarks.md, the others left alone);
- servers: :func:`free_port`, :func:`serve_command` and :func:`wait_ready` for benchmarks that
  run ``geoserve serve`` in a subprocess.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
DOC = ROOT / "docs" / "benchmarks.md"
HEADER = (
    "# Benchmarks\n\nFigures are written by the modules of the `bench` package (`python -m "
    "bench.NAME` from the repository root); rerun them after changes that move them. Each "
    "section names its command and the machine it ran on.\n"
)


# -- timing ------------------------------------------------------------------------------------


def timed(fn: Callable[[], T]) -> tuple[float, T]:
    """Wall seconds of one call of ``fn``, and what it returned."""
    t0 = time.perf_counter()
    result = fn()
    return time.perf_counter() - t0, result


def best_of(fn: Callable[[], T], n: int = 3, warm: bool = True) -> tuple[float, T]:
    """The fastest of ``n`` calls (after one untimed call when ``warm``), and its result."""
    if warm:
        fn()
    best, result = timed(fn)
    for _ in range(n - 1):
        seconds, result = timed(fn)
        best = min(best, seconds)
    return best, result


def throughput(
    fn: Callable[[], object],
    per_call: int,
    reps: int,
    warmup: int = 1,
    sync: Callable[[], None] = lambda: None,
) -> float:
    """Items per second of ``reps`` calls of ``fn``, each handling ``per_call`` items.

    ``warmup`` untimed calls go first; ``sync`` waits for queued work (a CUDA device) before
    the clock starts and before it stops.
    """
    for _ in range(warmup):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return per_call * reps / (time.perf_counter() - t0)


# -- memory ------------------------------------------------------------------------------------


def proc_mb(pid: int | str = "self") -> dict[str, float | None]:
    """VmRSS and VmHWM (peak) of a process, in MB (None once it is gone)."""
    vals: dict[str, float | None] = {"VmRSS": None, "VmHWM": None}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key = line.split(":", 1)[0]
            if key in vals:
                vals[key] = round(int(line.split()[1]) / 1024, 1)
    except (OSError, ValueError):
        pass
    return vals


def peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM: unlike ru_maxrss, not inherited on exec)."""
    peak = proc_mb()["VmHWM"]
    if peak is not None:
        return peak
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- the machine -------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    """CPU, cores, GPU (None without one), Python, torch and GDAL versions, today's date."""
    import rasterio
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "gpu": gpu,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "gdal": rasterio.__gdal_version__,
        "date": time.strftime("%Y-%m-%d"),
    }


def machine_line(m: dict[str, Any], *versions: str, prefix: str = "Machine: ") -> str:
    """``Machine: 2 cores (x86_64), no GPU, Python 3.11.7, torch 2.4.1, 2026-11-30.``

    ``versions`` picks which of ``python``, ``torch`` and ``gdal`` to name, in that order.
    """
    names = {"python": "Python", "torch": "torch", "gdal": "GDAL"}
    parts = [f"{m['cores']} cores ({m['cpu']})", f"GPU {m['gpu']}" if m.get("gpu") else "no GPU"]
    parts += [f"{names[k]} {m[k]}" for k in names if k in versions]
    return f"{prefix}{', '.join(parts)}, {m['date']}."


# -- output ------------------------------------------------------------------------------------


def cli(doc: str | None) -> argparse.ArgumentParser:
    """A parser with the module docstring's first line and ``--no-docs``."""
    parser = argparse.ArgumentParser(
        description=doc.strip().splitlines()[0] if doc else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--no-docs", action="store_true", help="do not touch docs/benchmarks.md")
    return parser


def publish(
    name: str,
    report: dict[str, Any],
    write_markdown: Callable[[dict[str, Any]], None] | None = None,
    *,
    docs: bool = True,
    echo: Any = None,
) -> None:
    """Write ``bench/results/NAME.json``, print it (or ``echo``), then the docs section."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report if echo is None else echo, indent=2))
    if docs and write_markdown is not None:
        write_markdown(report)


def write_section(name: str, title: str, lines: Sequence[str]) -> None:
    """Rewrite section ``name`` of docs/benchmarks.md: a heading naming the command, then
    ``lines``. The other sections are left as they are; a missing one is appended."""
    heading = f"## {title} (`python -m bench.{name}`)"
    update_section(name, "\n".join([heading, "", *lines]))


def update_section(name: str, body: str) -> None:
    """Replace what stands between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``."""
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    text = DOC.read_text() if DOC.exists() else HEADER
    block = f"{start}\n{body.rstrip()}\n{end}"
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), flags=re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else f"{text}\n{block}\n"
    DOC.write_text(text)


# -- servers -----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve_command(args: Sequence[str], *, bench_models: bool) -> list[str]:
    """``geoserve serve ARGS`` as a Python subprocess; with ``bench_models``, the benchmark
    models (``bench-conv`` ...) are registered first, which needs this repository's root on the
    subprocess's path (its working directory, or PYTHONPATH). The first line on stderr names
    the geoserve that was imported."""
    register = "import bench.models; " if bench_models else ""
    code = (
        f"import sys; {register}import geoserve; "
        "print('GEOSERVE_FILE', geoserve.__file__, file=sys.stderr, flush=True); "
        f"from geoserve.cli import main; sys.exit(main({list(args)!r}))"
    )
    return [sys.executable, "-c", code]


def start_serve(
    args: Sequence[str], *, bench_models: bool, timeout_s: float = 60
) -> tuple[str, subprocess.Popen[str]]:
    """``geoserve serve ARGS --port P`` on a free port (see :func:`serve_command`), ready.

    Returns its base URL and process (killed if it does not become ready).
    """
    port = free_port()
    proc = subprocess.Popen(
        serve_command([*args, "--port", str(port)], bench_models=bench_models),
        cwd=ROOT,
        text=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, timeout_s=timeout_s)
    except RuntimeError:
        proc.kill()
        raise
    return url, proc


def wait_ready(url: str, proc: subprocess.Popen[Any], timeout_s: float, log: str = "") -> None:
    """Poll ``URL/health/ready`` until it answers 200; raise if the server exits or times out.

    The caller stops the process on error."""
    import httpx

    where = f"; see {log}" if log else ""
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited rc={proc.returncode}{where}")
        try:
            if httpx.get(f"{url}/health/ready").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"server did not start{where}")
