"""A whole Sentinel-2-sized scene on one GPU: geoserve end to end against the model alone.

For a machine with one CUDA GPU (sized for an H200-class card); run there by
``bench/gpu_run.sh`` (which installs the wheels ``bench/gpu_prepare.sh`` fetched, then runs the
CUDA checks and this). A synthetic 10980 x 10980 x 6 band uint16 scene (tiled 256, DEFLATE,
like a Sentinel-2 L2A stack) is written to local disk (several scenes are hard links of it, one
request each), then, phase by phase:

- ``reader``: the engine end to end with a no-op model (its logits are a slice of its input):
  what the host side (decode, upload, cut, stitch, write) can feed, 1 and N scenes;
- ``eager``: the Prithvi-EO-2.0-300M-TL shape (1 frame, UperNet head, random weights), bf16
  autocast, end to end (patches cut on the device, ``preprocess="device"``), and the same
  module alone on random patches already on the GPU at the engine's batch size;
- ``compiled``: the same with ``torch.compile``;
- ``profile``: a short ``torch.profiler`` trace of the last engine on a small scene
  (``trace.json.gz``, ``profile.txt``).

``gpu.json`` in the output directory (``--out-dir``, default ``$OUT``, else
``bench/results/gpu``) is rewritten after every phase, so a phase that fails or runs out of time
loses only itself; a failed phase records its error and the next one runs.

The goal is >= 3,000 patches/s end to end (a whole tile in about a second) and a ratio of end-to-
end to model-only throughput >= 0.9.

    bash bench/gpu_run.sh                        # on the GPU machine
    python -m bench.gpu --device cpu --size 600 --variant prithvi_eo_v2_tiny_tl \
        --dtype fp32 --batch 4 --compile-backend eager --scenes 1,2   # CPU smoke run
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from bench.harness import throughput, timed
from bench.host import STAGES, NoOp, engine_run, scene_links
from bench.models import SIX, register
from bench.scenes import write_scene
from geoserve import MODEL_REGISTRY, Engine
from geoserve.models.prithvi import PrithviSegmentation, encoder_kwargs

PRITHVI, NOOP = "bench-gpu-prithvi", "bench-gpu-noop"
PHASES = ("reader", "eager", "compiled", "profile")


def register_models(variant: str) -> None:
    kw = {**encoder_kwargs(variant), "num_frames": 1}
    depth = kw["depth"]
    features = tuple(depth * (i + 1) // 4 - 1 for i in range(4))
    if NOOP not in MODEL_REGISTRY:
        register(NOOP, SIX, description="no-op model (GPU benchmark)")(
            type("BenchGpuNoOp", (NoOp,), {})
        )
    if PRITHVI in MODEL_REGISTRY:
        return

    @register(PRITHVI, SIX, description="Prithvi shape, random weights (GPU benchmark)")
    class BenchPrithvi(PrithviSegmentation):  # type: ignore[misc]
        def __init__(self) -> None:
            torch.manual_seed(0)
            super().__init__(num_classes=2, feature_indices=features, **kw)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def model_only(engine: Engine, patches: int) -> float:
    """Patches/s of the engine's (compiled, autocast) module on random on-device patches."""
    device, batch = engine.device, engine.max_batch_patches
    x = torch.randn(batch, 6, 224, 224, device=device)
    with torch.inference_mode(), engine.runner.autocast():
        return throughput(
            lambda: engine.model(x).float(),
            per_call=batch,
            reps=max(1, math.ceil(patches / batch)),
            warmup=3 if device.type == "cuda" else 1,
            sync=lambda: sync(device),
        )


def end_to_end(engine: Engine, scenes: Sequence[Path], out_dir: Path) -> dict[str, Any]:
    """One ``generate_image`` over ``scenes`` (one request each): rate and stage seconds."""
    sync(engine.device)
    run = engine_run(engine, scenes, out_dir)
    wall = run["wall"]
    return {
        "scenes": len(scenes),
        "patches": run["patches"],
        "seconds": round(wall, 3),
        "patches_per_s": round(run["patches"] / wall, 1),
        "cpu_cores_busy": round(run["cpu"] / wall, 2),
        "stages_s": {k: round(run[k], 3) for k in STAGES},
    }


class Bench:
    """The phases, sharing one report that is written out after each."""

    def __init__(self, args: argparse.Namespace, out_dir: Path, tmp: Path) -> None:
        self.args, self.out_dir, self.tmp = args, out_dir, tmp
        self.device = torch.device(args.device)
        self.report: dict[str, Any] = {
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "cpu_count": os.cpu_count(),
            "phases": {},
        }
        self.scenes: list[Path] = []
        self.last: Engine | None = None

    def save(self) -> None:
        path = self.out_dir / "gpu.json"
        part = path.with_suffix(".json.part")
        part.write_text(json.dumps(self.report, indent=2) + "\n")
        part.replace(path)

    def phase(self, name: str, fn: Callable[[], dict[str, Any]]) -> None:
        t0 = time.perf_counter()
        print(f"== phase {name}", flush=True)
        try:
            result = fn()
        except Exception as exc:  # recorded; the next phase still runs
            traceback.print_exc()
            result = {"error": f"{type(exc).__name__}: {exc}"}
        result["phase_s"] = round(time.perf_counter() - t0, 1)
        self.report["phases"][name] = result
        self.save()
        print(json.dumps({name: result}), flush=True)

    def write_scenes(self) -> dict[str, Any]:
        scene = self.tmp / "scene.tif"
        seconds = timed(lambda: write_scene(scene, self.args.size))[0]
        links = self.tmp / "links"
        links.mkdir()
        self.scenes = scene_links(scene, max(self.args.scenes), links)
        return {"size": self.args.size, "write_s": round(seconds, 1)}

    def engine(self, model: str, compiled: bool) -> tuple[float, Engine]:
        a = self.args
        if self.last is not None:
            self.last.close()
            self.last = None
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        seconds, engine = timed(
            lambda: Engine(
                model,
                device=a.device,
                dtype=None if a.dtype == "fp32" else a.dtype,
                compile=compiled,
                compile_backend=a.compile_backend,
                max_batch_patches=a.batch if a.batch == "auto" else int(a.batch),
                read_workers=a.workers,
                prefetch_rows=a.prefetch,
            )
        )
        self.last = engine
        return seconds, engine

    def runs(self, model: str, compiled: bool, alone: bool) -> dict[str, Any]:
        startup, engine = self.engine(model, compiled)
        out = self.tmp / "out"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        warm = end_to_end(engine, self.scenes[:1], out)  # compiles every shape, warms caches
        result: dict[str, Any] = {
            "startup_s": round(startup, 1),
            "batch": engine.max_batch_patches,
            "preprocess": engine.preprocess,
            "warm_s": warm["seconds"],
            "end_to_end": [end_to_end(engine, self.scenes[:n], out) for n in self.args.scenes],
        }
        if self.device.type == "cuda":
            result["max_memory_gb"] = round(torch.cuda.max_memory_allocated(self.device) / 1e9, 1)
        if alone:
            n = result["end_to_end"][0]["patches"]
            rate = model_only(engine, n)
            result["model_only_patches_per_s"] = round(rate, 1)
            for r in result["end_to_end"]:
                r["ratio_to_model"] = round(r["patches_per_s"] / rate, 3)
        return result

    def profile(self) -> dict[str, Any]:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        if self.last is None:
            return {"skipped": "no engine ran"}
        small = write_scene(self.tmp / "small.tif", min(self.args.size, 1344), seed=1)
        out = self.tmp / "profile.tif"
        self.last.generate_image(small, output_path=out)  # warm for this size
        activities = [ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        with torch_profile(activities=activities) as prof:
            self.last.generate_image(small, output_path=out)
            sync(self.device)
        trace = self.tmp / "trace.json"
        prof.export_chrome_trace(str(trace))
        with trace.open("rb") as src, gzip.open(self.out_dir / "trace.json.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        sort = "self_cuda_time_total" if self.device.type == "cuda" else "self_cpu_time_total"
        table = prof.key_averages().table(sort_by=sort, row_limit=40)
        (self.out_dir / "profile.txt").write_text(table + "\n")
        size = (self.out_dir / "trace.json.gz").stat().st_size
        return {"trace_gz_mb": round(size / 1e6, 2), "files": ["trace.json.gz", "profile.txt"]}

    def run(self) -> dict[str, Any]:
        register_models(self.args.variant)
        self.phase("scene", self.write_scenes)
        todo = {
            "reader": lambda: self.runs(NOOP, compiled=False, alone=False),
            "eager": lambda: self.runs(PRITHVI, compiled=False, alone=True),
            "compiled": lambda: self.runs(PRITHVI, compiled=True, alone=True),
            "profile": self.profile,
        }
        for name in self.args.phases:
            self.phase(name, todo[name])
        if self.last is not None:
            self.last.close()
        return self.report


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )

    def names(text: str) -> list[str]:
        out = [v for v in text.split(",") if v]
        bad = sorted(set(out) - set(PHASES))
        if bad:
            raise argparse.ArgumentTypeError(f"unknown phase(s) {bad}; known: {PHASES}")
        return out

    parser.add_argument("--size", type=int, default=10980, help="scene side in pixels")
    parser.add_argument("--variant", default="prithvi_eo_v2_300_tl")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bf16", help="bf16, fp16 or fp32")
    parser.add_argument("--batch", default="128", help="patches per batch, or auto")
    parser.add_argument("--compile-backend", default="inductor")
    parser.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1))
    parser.add_argument("--prefetch", type=int, default=4)
    parser.add_argument(
        "--scenes", type=lambda s: [int(v) for v in s.split(",") if v], default=[1, 4]
    )
    parser.add_argument("--phases", type=names, default=list(PHASES), help=",".join(PHASES))
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=Path(os.environ.get("OUT") or "bench/results/gpu"),
        help="where gpu.json (rewritten after every phase) and the trace go (default: $OUT)",
    )
    parser.add_argument("--tmp", type=Path, help="scratch directory (default: a temporary one)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        report = Bench(args, args.out_dir, Path(tmp)).run()
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
