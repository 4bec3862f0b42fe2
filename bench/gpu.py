"""A whole Sentinel-2-sized scene on one GPU: geoserve end to end against the model alone.

For a machine with one CUDA GPU (sized for an H200-class card) and geoserve installed; it
installs nothing and finishes in a few minutes (docs/performance.md, "On a GPU"). A synthetic
10980 x 10980 x 6 band uint16 scene (tiled 256, DEFLATE, like a Sentinel-2 L2A stack) is
written to local disk, then:

- model only: the Prithvi-EO-2.0-300M-TL shape (1 frame, UperNet head, random weights), bf16
  autocast, ``torch.compile``, on random patches already on the GPU, at the engine's batch size;
- end to end: ``Engine.generate_image`` from the GeoTIFF to a class-map GeoTIFF with the same
  model, batch, dtype and compilation, cutting patches on the device (``preprocess="device"``).

The goal is >= 3,000 patches/s end to end (a whole tile in about a second) and a ratio of end-to-
end to model-only throughput >= 0.9. Prints one JSON object (also written to ``--out``).

    python -m bench.gpu --out gpu.json          # on a machine with a CUDA GPU
    python -m bench.gpu --device cpu --size 600 --variant prithvi_eo_v2_tiny_tl \
        --no-compile --dtype fp32 --batch 4     # a smoke run of the same code on a CPU
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from bench.harness import throughput, timed
from bench.models import SIX, register
from bench.scenes import write_scene
from geoserve import Engine
from geoserve.models.prithvi import PrithviSegmentation, encoder_kwargs


def register_prithvi(variant: str) -> str:
    kw = {**encoder_kwargs(variant), "num_frames": 1}
    depth = kw["depth"]
    features = tuple(depth * (i + 1) // 4 - 1 for i in range(4))

    @register("bench-gpu-prithvi", SIX)
    class BenchPrithvi(PrithviSegmentation):  # type: ignore[misc]
        def __init__(self) -> None:
            torch.manual_seed(0)
            super().__init__(num_classes=2, feature_indices=features, **kw)

    return "bench-gpu-prithvi"


def model_only(engine: Engine, patches: int, batch: int) -> float:
    """Patches/s of the engine's (compiled, autocast) module on random on-device patches."""
    device = engine.device
    x = torch.randn(batch, 6, 224, 224, device=device)
    autocast = engine.runner.autocast  # the very same autocast the engine uses

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    with torch.inference_mode(), autocast():
        return throughput(
            lambda: engine.model(x).float(),
            per_call=batch,
            reps=math.ceil(patches / batch),
            warmup=3,
            sync=sync,
        )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", type=int, default=10980, help="scene side in pixels")
    parser.add_argument("--variant", default="prithvi_eo_v2_300_tl")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bf16", help="bf16, fp16 or fp32")
    parser.add_argument("--batch", default="128", help="patches per batch, or auto")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1))
    parser.add_argument("--prefetch", type=int, default=4)
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    return parser.parse_args()


def run(args: argparse.Namespace) -> dict[str, Any]:
    name = register_prithvi(args.variant)
    report: dict[str, Any] = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "torch": torch.__version__,
    }
    if torch.cuda.is_available():
        report["gpu"] = torch.cuda.get_device_name(0)
    with tempfile.TemporaryDirectory() as tmp:
        scene = Path(tmp) / "scene.tif"
        report["scene_write_s"] = round(timed(lambda: write_scene(scene, args.size))[0], 1)
        seconds, engine = timed(
            lambda: Engine(
                name,
                device=args.device,
                dtype=None if args.dtype == "fp32" else args.dtype,
                compile=not args.no_compile,
                max_batch_patches=args.batch if args.batch == "auto" else int(args.batch),
                read_workers=args.workers,
                prefetch_rows=args.prefetch,
            )
        )
        report["startup_s"] = round(seconds, 1)
        report["batch"] = engine.max_batch_patches
        report["preprocess"] = engine.preprocess
        engine.generate_image(scene, output_path=Path(tmp) / "warm.tif")  # compile every shape
        wall, out = timed(lambda: engine.generate_image(scene, output_path=Path(tmp) / "out.tif"))
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


def main() -> None:
    args = parse_args()
    text = json.dumps(run(args), indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
