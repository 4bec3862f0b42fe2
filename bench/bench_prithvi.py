"""Prithvi forward throughput per variant (CPU fp32), and the engine's model step against it.

    .venv/bin/python bench/bench_prithvi.py        # prints JSON, updates docs/benchmarks.md

Random weights (the architecture, not the numbers, sets the cost). Patches are 224 x 224 x 6
bands with each variant's pretraining frame count. The second part runs the Sen1Floods11
plugin model built at the tiny-TL width from a random checkpoint through ``Engine`` on the
bundled lake scene and compares the time of its forward passes with the same module's raw
forward over the same patches at the same batch size.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _docs import update_section  # noqa: E402

from geoserve import Engine  # noqa: E402
from geoserve.models.prithvi import PrithviSegmentation, PrithviViT, encoder_kwargs  # noqa: E402
from geoserve.raster import open_raster  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCENE = ROOT / "data" / "S2_L1C_T33UUU_20170216T102101_13band_10m.tif"
VARIANTS = (
    "prithvi_eo_v2_tiny_tl",
    "prithvi_eo_v1_100",
    "prithvi_eo_v2_300_tl",
    "prithvi_eo_v2_600_tl",
)
BATCHES = (1, 4, 16)


def forward_rate(model: torch.nn.Module, frames: int, batch: int) -> float:
    x = torch.randn(batch, 6, frames, 224, 224)
    with torch.inference_mode():
        model.forward_features(x)
        reps = 2 if batch == 1 else 1
        t0 = time.perf_counter()
        for _ in range(reps):
            model.forward_features(x)
        return batch * reps / (time.perf_counter() - t0)


def variants() -> list[dict[str, Any]]:
    rows = []
    for name in VARIANTS:
        kw = encoder_kwargs(name)
        model = PrithviViT(**kw).eval()
        params = sum(p.numel() for p in model.parameters()) / 1e6
        rates = {b: round(forward_rate(model, kw["num_frames"], b), 2) for b in BATCHES}
        rows.append(
            {
                "variant": name,
                "params_m": round(params, 1),
                "frames": kw["num_frames"],
                "patches_per_s": rates,
            }
        )
        print(rows[-1], flush=True)
    return rows


def engine_vs_forward(batch: int = 8) -> dict[str, Any]:
    torch.manual_seed(0)
    kw = encoder_kwargs("prithvi_eo_v2_tiny_tl")
    model = PrithviSegmentation(num_classes=2, feature_indices=(2, 5, 8, 11), **kw).eval()
    with tempfile.TemporaryDirectory() as tmp:
        weights = Path(tmp) / "tiny_sen1floods11.pt"
        torch.save({f"model.{k}": v for k, v in model.state_dict().items()}, weights)
        engine = Engine(
            "prithvi-eo2-300m-tl-sen1floods11",
            weights=weights,
            patch_size=224,
            stride=192,
            max_batch_patches=batch,
        )
        forward = engine.runner.forward  # time exactly the engine's model step
        spent = {"s": 0.0, "patches": 0}

        def timed(patches):
            t0 = time.perf_counter()
            out = forward(patches)
            spent["s"] += time.perf_counter() - t0
            spent["patches"] += len(patches)
            return out

        engine.runner.forward = timed  # type: ignore[method-assign]
        t0 = time.perf_counter()
        engine.generate_image(SCENE, output_path=Path(tmp) / "out.tif")
        wall = time.perf_counter() - t0
        with open_raster(SCENE) as src:
            ctx = engine.in_proc.prepare([src])
            rows = [engine.in_proc.read_row([src], ctx, r) for r in range(ctx.grid.rows)]
        patches = torch.from_numpy(__import__("numpy").concatenate([r.patches for r in rows]))
        loc = torch.tensor(ctx.model_kwargs["location_coords"]).expand(batch, 2)
        t0 = time.perf_counter()
        with torch.inference_mode():
            for i in range(0, len(patches), batch):
                chunk = patches[i : i + batch]
                engine.model(chunk, location_coords=loc[: len(chunk)])
        raw = time.perf_counter() - t0
    n = spent["patches"]
    return {
        "model": "Sen1Floods11 UperNet at tiny-TL width",
        "batch": batch,
        "patches": n,
        "engine_model_step_s": round(spent["s"], 3),
        "raw_forward_s": round(raw, 3),
        "ratio": round(raw / spent["s"], 3),
        "end_to_end_s": round(wall, 3),
        "end_to_end_ratio": round(raw / wall, 3),
    }


def write_markdown(report: dict[str, Any]) -> None:
    m = report["machine"]
    lines = [
        "## Prithvi forward throughput (`bench/bench_prithvi.py`)",
        "",
        f"Encoder `forward_features` on random 224 x 224 x 6 patches (each variant's "
        f"pretraining frame count), fp32, random weights. Machine: {m['cores']} cores "
        f"({m['cpu']}), no GPU, torch {m['torch']}, {m['date']}. Patches per second:",
        "",
        "| variant | params (M) | frames | " + " | ".join(f"batch {b}" for b in BATCHES) + " |",
        "| --- | --- | --- | " + " | ".join("---" for _ in BATCHES) + " |",
    ]
    for r in report["variants"]:
        rates = " | ".join(str(r["patches_per_s"][b]) for b in BATCHES)
        lines.append(f"| {r['variant']} | {r['params_m']} | {r['frames']} | {rates} |")
    e = report["engine"]
    lines += [
        "",
        "For scale: an H200 runs the 300M shape (1 frame; the CPU row above has 4) at 2,182 "
        "patches/s in bf16 and about 360 in fp32 (../shared/reference/hardware_limits.md); "
        "the GPU rows need a lent GPU machine (none was lent to this task).",
        "",
        f"Engine model step vs raw forward ({e['model']}, batch {e['batch']}, "
        f"{e['patches']} patches of the lake scene): the engine's forward passes took "
        f"{e['engine_model_step_s']} s, the bare module {e['raw_forward_s']} s on the same "
        f"patches: ratio **{e['ratio']}** (goal >= 0.9). End to end, GeoTIFF in to GeoTIFF out: "
        f"{e['end_to_end_s']} s, ratio {e['end_to_end_ratio']}.",
    ]
    update_section("prithvi", "\n".join(lines))


if __name__ == "__main__":
    torch.set_num_threads(os.cpu_count() or 1)
    report = {
        "engine": engine_vs_forward(),
        "variants": variants(),
        "machine": {
            "cores": os.cpu_count(),
            "cpu": platform.machine(),
            "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d"),
        },
    }
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "prithvi.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report["engine"], indent=2))
    if "--no-docs" not in sys.argv:
        write_markdown(report)
