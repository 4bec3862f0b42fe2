"""A whole Sentinel-2-sized scene on one GPU: geoserve end to end against the model alone.

Made for a lent H200 (see docs/performance.md for the one command that carries the wheels and
runs it); it installs nothing and finishes in a few minutes. A synthetic 10980 x 10980 x 6 band
uint16 scene (tiled 256, DEFLATE, like a Sentinel-2 L2A stack) is written to local disk, then:

- model only: the Prithvi-EO-2.0-300M-TL shape (1 frame, UperNet head, random weights), bf16
  autocast, ``torch.compile``, on random patches already on the GPU, at the engine's batch size;
- end to end: ``Engine.generate_image`` from the GeoTIFF to a class-map GeoTIFF with the same
  model, batch, dtype and compilation, cutting patches on the device (``preprocess="device"``).

The goal is >= 3,000 patches/s end to end (a whole tile in about a second) and a ratio of end-to-
end to model-only throughput >= 0.9. Prints one JSON object (also written to $OUT if set).

    python bench/bench_gpu.py                     # on the GPU machine
    python bench/bench_gpu.py --device cpu --size 600 --variant prithvi_eo_v2_tiny_tl \
        --no-compile --dtype fp32 --batch 4       # a smoke run of the same code on a CPU
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _scenes import write_scene  # noqa: E402

from geoserve import (  # noqa: E402
    INPUT_REGISTRY,
    MODEL_REGISTRY,
    OUTPUT_REGISTRY,
    Engine,
    GeoTiffPatcher,
    SegmentationReassembler,
)
from geoserve.models.prithvi import PrithviSegmentation, encoder_kwargs  # noqa: E402


def register(variant: str) -> str:
    kw = {**encoder_kwargs(variant), "num_frames": 1}
    depth = kw["depth"]
    features = tuple(depth * (i + 1) // 4 - 1 for i in range(4))

    @MODEL_REGISTRY.register_model("bench-gpu-prithvi")
    @INPUT_REGISTRY.register_input_processor(
        GeoTiffPatcher(
            bands=(0, 1, 2, 3, 4, 5),
            scale_factor=1e-4,
            mean=(0.1,) * 6,
            std=(0.05,) * 6,
            patch_size=224,
            stride=192,
            blend="center",
        )
    )
    @OUTPUT_REGISTRY.register_output_processor(SegmentationReassembler(classes=("land", "water")))
    class BenchPrithvi(PrithviSegmentation):  # type: ignore[misc]
        def __init__(self) -> None:
            torch.manual_seed(0)
            super().__init__(num_classes=2, feature_indices=features, **kw)

    return "bench-gpu-prithvi"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def model_only(engine: Engine, patches: int, batch: int) -> float:
    """Patches/s of the engine's (compiled, autocast) module on random on-device patches."""
    device = engine.device
    x = torch.randn(batch, 6, 224, 224, device=device)
    autocast = engine.runner.autocast  # the very same autocast the engine uses
    with torch.inference_mode(), autocast():
        for _ in range(3):
            engine.model(x)
        sync(device)
        t0 = time.perf_counter()
        done = 0
        while done < patches:
            engine.model(x).float()
            done += batch
        sync(device)
    return done / (time.perf_counter() - t0)


def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=10980)
    parser.add_argument("--variant", default="prithvi_eo_v2_300_tl")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--batch", default="128")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1))
    parser.add_argument("--prefetch", type=int, default=4)
    args = parser.parse_args()
    name = register(args.variant)
    report: dict[str, Any] = {"args": vars(args), "torch": torch.__version__}
    if torch.cuda.is_available():
        report["gpu"] = torch.cuda.get_device_name(0)
    with tempfile.TemporaryDirectory() as tmp:
        scene = Path(tmp) / "scene.tif"
        t0 = time.perf_counter()
        write_scene(scene, args.size)
        report["scene_write_s"] = round(time.perf_counter() - t0, 1)
        t0 = time.perf_counter()
        engine = Engine(
            name,
            device=args.device,
            dtype=None if args.dtype == "fp32" else args.dtype,
            compile=not args.no_compile,
            max_batch_patches=args.batch if args.batch == "auto" else int(args.batch),
            read_workers=args.workers,
            prefetch_rows=args.prefetch,
        )
        report["startup_s"] = round(time.perf_counter() - t0, 1)
        report["batch"] = engine.max_batch_patches
        report["preprocess"] = engine.preprocess
        engine.generate_image(scene, output_path=Path(tmp) / "warm.tif")  # compile every shape
        t0 = time.perf_counter()
        out = engine.generate_image(scene, output_path=Path(tmp) / "out.tif")
        wall = time.perf_counter() - t0
        n = out.num_patches
        t = out.timings
        report["end_to_end"] = {
            "patches": n,
            "seconds": round(wall, 3),
            "patches_per_s": round(n / wall, 1),
            "stages_s": {k: round(getattr(t, k), 3) for k in ("read", "model", "stitch", "write")},
        }
        rate = model_only(engine, n, engine.max_batch_patches)
        report["model_only_patches_per_s"] = round(rate, 1)
        report["ratio"] = round(n / wall / rate, 3)
        engine.close()
    return report


if __name__ == "__main__":
    result = main()
    text = json.dumps(result, indent=2)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "bench_gpu.json").write_text(text)
