"""Prithvi forward throughput per variant (CPU fp32), and the engine's model step against it.

    python -m bench.prithvi             # prints JSON, updates docs/benchmarks.md

Random weights (the architecture, not the numbers, sets the cost). Patches are 224 x 224 x 6
bands with each variant's pretraining frame count. The second part runs the Sen1Floods11
plugin model built at the tiny-TL width from a random checkpoint through ``Engine`` on the
bundled lake scene and compares the time of its forward passes with the same module's raw
forward over the same patches at the same batch size.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.harness import cli, machine, machine_line, publish, throughput, timed, write_section
from bench.scenes import LAKE
from geoserve import Engine
from geoserve.models.prithvi import PrithviSegmentation, PrithviViT, encoder_kwargs
from geoserve.raster import open_raster

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
        reps = 2 if batch == 1 else 1
        return throughput(lambda: model.forward_features(x), per_call=batch, reps=reps)


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

        def timed_forward(patches):
            seconds, out = timed(lambda: forward(patches))
            spent["s"] += seconds
            spent["patches"] += len(patches)
            return out

        engine.runner.forward = timed_forward  # type: ignore[method-assign]
        wall, _ = timed(lambda: engine.generate_image(LAKE, output_path=Path(tmp) / "out.tif"))
        with open_raster(LAKE) as src:
            ctx = engine.in_proc.prepare([src])
            rows = [engine.in_proc.read_row([src], ctx, r) for r in range(ctx.grid.rows)]
        patches = torch.from_numpy(np.concatenate([r.patches for r in rows]))
        loc = torch.tensor(ctx.model_kwargs["location_coords"]).expand(batch, 2)

        def raw_forward() -> None:
            with torch.inference_mode():
                for i in range(0, len(patches), batch):
                    chunk = patches[i : i + batch]
                    engine.model(chunk, location_coords=loc[: len(chunk)])

        raw, _ = timed(raw_forward)
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


#: The GPU figure beside the CPU table, its source, and the command for the missing GPU rows.
GPU_NOTE = (
    "For scale: an H200 runs the 300M shape (1 frame; the CPU row above has 4) at 2,182 "
    "patches/s in bf16 and about 360 in fp32 (batch 128; measured 2026-11-30 on one NVIDIA "
    "H200, torch 2.11, CUDA 13: a Prithvi-shaped timm encoder with a small segmentation head "
    "alone, random weights and input, no I/O). This table has no GPU rows yet: this module "
    "measures on the CPU; on a machine with a CUDA GPU, `python -m bench.gpu` measures the "
    "300M-TL shape there, alone and end to end (see docs/performance.md)."
)


def write_markdown(report: dict[str, Any]) -> None:
    m = report["machine"]
    lines = [
        f"Encoder `forward_features` on random 224 x 224 x 6 patches (each variant's "
        f"pretraining frame count), fp32, random weights. {machine_line(m, 'torch')} "
        "Patches per second:",
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
        GPU_NOTE,
        "",
        f"Engine model step vs raw forward ({e['model']}, batch {e['batch']}, "
        f"{e['patches']} patches of the lake scene): the engine's forward passes took "
        f"{e['engine_model_step_s']} s, the bare module {e['raw_forward_s']} s on the same "
        f"patches: ratio **{e['ratio']}** (goal >= 0.9). End to end, GeoTIFF in to GeoTIFF out: "
        f"{e['end_to_end_s']} s, ratio {e['end_to_end_ratio']}.",
    ]
    write_section("prithvi", "Prithvi forward throughput", lines)


def main() -> None:
    args = cli(__doc__).parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    report = {"engine": engine_vs_forward(), "variants": variants(), "machine": machine()}
    publish("prithvi", report, write_markdown, docs=not args.no_docs, echo=report["engine"])


if __name__ == "__main__":
    main()
