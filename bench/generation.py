"""Served TerraMind generation: throughput, step batching across requests, and seams.

    python -m bench.generation              # prints JSON, updates docs/benchmarks.md
    python -m bench.generation --quick      # the toy model only, seconds (what the test runs)
    python -m bench.generation --gpu        # on a CUDA GPU: device cuda, batch 64, 50 steps

The model is ``bench-terramind-tiny-generate``: geoserve's ``TerraMindGenerate`` at the real
size of TerraMind v1 tiny (the generator of ``generator_args("tiny")`` and the full-size S1GRD
DiVAE and LULC VQVAE decoders, about 304 M parameters), random weights moved off their
initialisation (``tests/generate_stub.py``'s ``randomise``: a fresh UNet outputs zero),
registered here like the plugin's ``terramind-v1-tiny-generate`` (S2L2A in, S1GRD + LULC out,
``cosine`` blend). ``--quick`` runs the toy ``test-generate`` instead (same code, toy width).
Every request is a seeded 12-band S2 L2A-like GeoTIFF, ``Engine.generate_image`` to GeoTIFFs.

1. **Throughput** at 64 px patches (stride 32) and 224 px (stride 192, the served tiling):
   patches/s end to end, patch-steps/s of the step calls (``Engine.step_stats``), per step
   kind; from the 224 px run, a 50-step 224 px chip's cost extrapolated from the measured
   seconds per token pass and per denoising step.
2. **Step batching**: 8 requests admitted together and run to completion, against the same 8
   run one after another (``generate_image`` each), on one engine each; the ratio of wall
   times, each mode's mean batch fill per step kind, and whether the outputs are the same
   bytes (they should be: batch-invariant by default).
3. **Seams** (:mod:`bench.generation_seams`): on a scene several patches wide, adjacent-pixel
   differences across the grid's core boundaries over those inside, per product, for the
   ``cosine`` (default), ``center`` and ``none`` blends.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import rasterio
import torch
from tests.generate_stub import randomise

from bench.generation_doc import write_markdown
from bench.generation_seams import seam_stats, write_s2l2a
from bench.harness import cli, machine, publish, timed
from geoserve import INPUT_REGISTRY, MODEL_REGISTRY, OUTPUT_REGISTRY, Engine
from geoserve.engine.stepping import StepKindStats
from geoserve.models.terramind.generate import RAW_INPUTS, TerraMindGenerate
from geoserve.models.terramind.generation import TerraMindGenerator, generator_args
from geoserve.models.terramind.products import GeneratedProducts
from geoserve.models.terramind.tokenizers import VQVAE, DiVAE
from geoserve.models.terramind.tokenizers.builders import build_tokenizer
from geoserve.models.terramind.variants import MODALITIES
from geoserve.processors import Modality, MultimodalPatcher

TINY, TOY = "bench-terramind-tiny-generate", "test-generate"
KINDS = ["s1grd", "lulc"]
OUTPUTS = ("S1GRD", "LULC")
CHIP_STEPS = 50
REQUESTS = 8


@functools.lru_cache(maxsize=1)
def tiny_parts() -> tuple[TerraMindGenerator, dict[str, DiVAE | VQVAE]]:
    """TerraMind v1 tiny's generator (S2L2A inputs among the raw ones -> S1GRD, LULC) and the
    full-size decoders, randomised (seeded), built once per process."""
    generator = randomise(TerraMindGenerator(RAW_INPUTS, OUTPUTS, **generator_args("tiny")), 1)
    tokenizers = {
        m: randomise(build_tokenizer(m, encoder=False), 2 + i) for i, m in enumerate(OUTPUTS)
    }
    return generator, tokenizers  # type: ignore[return-value]


def _modality(name: str) -> Modality:
    info = MODALITIES[name]
    bands = tuple(range(len(info.bands)))
    return Modality(name, bands=bands, mean=info.mean, std=info.std, required=False)


@MODEL_REGISTRY.register_model(TINY, description="TerraMind v1 tiny generation, random weights")
@INPUT_REGISTRY.register_input_processor(
    MultimodalPatcher(
        modalities=tuple(_modality(m) for m in RAW_INPUTS),
        patch_size=224,
        stride=192,
        blend="cosine",
    )
)
@OUTPUT_REGISTRY.register_output_processor(GeneratedProducts())
def tiny_generate() -> torch.nn.Module:
    """TerraMind v1 tiny generation at real size, random weights (benchmark)."""
    generator, tokenizers = tiny_parts()
    return TerraMindGenerate.from_parts(generator, tokenizers)


# -- runs --------------------------------------------------------------------------------------


def engine(model: str, px: int, args: Any, steps: int, **kw: Any) -> Engine:
    """An engine of ``model`` at ``px`` patches (stride ``px - 32``, margin 16 unless given),
    on ``args``' device, batch cap and batch invariance."""
    device, batch, invariant = args.device, args.batch, args.batch_invariant == "on"
    kw.setdefault("stride", px - 32)
    return Engine(
        model,
        patch_size=px,
        output_kind=KINDS,
        steps=steps,
        device=device,
        max_batch_patches=batch,
        warmup=False,
        batch_invariant=invariant,
        threads=args.threads,
        **kw,
    )


def snapshot(eng: Engine) -> dict[str, StepKindStats]:
    """``Engine.step_stats`` as they stand now, per step kind."""
    stats = eng.step_stats
    assert stats is not None, f"{eng.spec.name} is not a stepped model"
    return stats.snapshot()


def kind_stats(eng: Engine, since: dict[str, StepKindStats]) -> dict[str, dict[str, float]]:
    """The steps run since the snapshot ``since``, per step kind: batches, patch-steps,
    seconds, seconds per patch-step and mean batch fill."""
    out = {}
    for kind, now in snapshot(eng).items():
        was = since.get(kind, StepKindStats())
        batches, steps = now.batches - was.batches, now.patch_steps - was.patch_steps
        seconds = now.seconds - was.seconds
        if batches:
            out[kind] = {
                "batches": batches,
                "patch_steps": steps,
                "seconds": round(seconds, 3),
                "s_per_patch_step": round(seconds / steps, 4),
                "mean_fill": round((now.fill - was.fill) / batches, 3),
            }
    return out


def throughput(model: str, px: int, side: tuple[int, int], steps: int, args: Any) -> dict[str, Any]:
    """One scene of ``side`` (H, W) at ``px`` patches after one warm patch: rates and steps."""
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        warm = write_s2l2a(d / "warm.tif", px - 32, px - 32, seed=9)
        scene = write_s2l2a(d / "scene.tif", *side, seed=1)
        with engine(model, px, args, steps) as eng:
            eng.generate_image({"S2L2A": str(warm)}, output_path=d / "warm_out")
            since = snapshot(eng)
            wall, result = timed(
                lambda: eng.generate_image({"S2L2A": str(scene)}, output_path=d / "out")
            )
            kinds = kind_stats(eng, since)
    patch_steps = sum(k["patch_steps"] for k in kinds.values())
    step_s = sum(k["seconds"] for k in kinds.values())
    return {
        "model": model,
        "px": px,
        "stride": px - 32,
        "scene": list(side),
        "steps": steps,
        "batch": args.batch,
        "patches": result.num_patches,
        "seconds": round(wall, 3),
        "patches_per_s": round(result.num_patches / wall, 4),
        "patch_steps": patch_steps,
        "step_seconds": round(step_s, 3),
        "patch_steps_per_s": round(patch_steps / step_s, 4),
        "kinds": kinds,
    }


def chip_cost(row: dict[str, Any], steps: int = CHIP_STEPS) -> dict[str, Any]:
    """One patch's cost at ``steps`` denoising steps: its token passes plus ``steps`` times the
    measured seconds per denoising patch-step (which include the decode at the last step)."""
    tokens = sum(k["s_per_patch_step"] for n, k in row["kinds"].items() if n.startswith("tokens"))
    denoise = [k for n, k in row["kinds"].items() if n.startswith("denoise")]
    per_step = sum(k["seconds"] for k in denoise) / sum(k["patch_steps"] for k in denoise)
    return {
        "px": row["px"],
        "steps": steps,
        "token_s_per_patch": round(tokens, 3),
        "denoise_s_per_patch_step": round(per_step, 3),
        "seconds_per_chip": round(tokens + steps * per_step, 1),
        "from_steps": row["steps"],
    }


def _files_bytes(files: dict[str, Any]) -> dict[str, bytes]:
    out = {}
    for kind, o in sorted(files.items()):
        with rasterio.open(o.path) as src:
            out[kind] = src.read().tobytes()
    return out


def batching(model: str, px: int, side: int, steps: int, args: Any) -> dict[str, Any]:
    """8 requests together against the same 8 one after another (see the module docstring)."""
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        scenes = [write_s2l2a(d / f"s{i}.tif", side, side, seed=10 + i) for i in range(REQUESTS)]
        warm = write_s2l2a(d / "warm.tif", px - 32, px - 32, seed=9)
        for mode in ("concurrent", "sequential"):
            with engine(model, px, args, steps) as eng:
                eng.generate_image({"S2L2A": str(warm)}, output_path=d / f"warm_{mode}")
                since = snapshot(eng)
                t0 = time.perf_counter()
                results: list[Any]
                if mode == "sequential":
                    results = [
                        eng.generate_image({"S2L2A": str(s)}, output_path=d / f"{mode}{i}", seed=i)
                        for i, s in enumerate(scenes)
                    ]
                else:
                    ids = [
                        eng.add_request({"S2L2A": str(s)}, output_path=d / f"{mode}{i}", seed=i)
                        for i, s in enumerate(scenes)
                    ]
                    done = {r.request_id: r for r in eng.run_until_done()}
                    results = [done[i] for i in ids]
                wall = time.perf_counter() - t0
                errors = [str(r.error) for r in results if r.error is not None]
                if errors:
                    raise RuntimeError(f"{mode}: {errors[0]}")
                runs[mode] = {
                    "seconds": round(wall, 3),
                    "patches": sum(r.num_patches for r in results),
                    "kinds": kind_stats(eng, since),
                    "bytes": [_files_bytes(r.outputs_by_kind) for r in results],
                }
    same = runs["concurrent"].pop("bytes") == runs["sequential"].pop("bytes")
    fill = {
        kind: {mode: runs[mode]["kinds"][kind]["mean_fill"] for mode in runs}
        for kind in runs["concurrent"]["kinds"]
    }
    return {
        "model": model,
        "px": px,
        "scene": [side, side],
        "requests": REQUESTS,
        "steps": steps,
        "batch": args.batch,
        "concurrent": runs["concurrent"],
        "sequential": runs["sequential"],
        "ratio": round(runs["sequential"]["seconds"] / runs["concurrent"]["seconds"], 3),
        "mean_fill": fill,
        "same_bytes": same,
    }


def seams(model: str, px: int, side: int, steps: int, args: Any) -> dict[str, Any]:
    """Border / inside differences of each product, per blend (see :mod:`.generation_seams`)."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        scene = write_s2l2a(d / "scene.tif", side, side, seed=3)
        for blend, stride in (("cosine", px - 32), ("center", px - 32), ("none", px)):
            with engine(model, px, args, steps, blend=blend, stride=stride) as eng:
                t0 = time.perf_counter()
                result = eng.generate_image({"S2L2A": str(scene)}, output_path=d / blend, seed=5)
                wall = time.perf_counter() - t0
            for kind, o in result.outputs_by_kind.items():
                with rasterio.open(o.path) as src:
                    values = src.read()
                stats = seam_stats(values, stride, classes=kind == "lulc")
                rows.append({"blend": blend, "stride": stride, "product": kind, **stats})
            rows[-1]["seconds"] = round(wall, 2)
    return {"model": model, "px": px, "scene": [side, side], "steps": steps, "rows": rows}


# -- the command -------------------------------------------------------------------------------


def cpu_model() -> str:
    """``lscpu``'s model name (the platform's processor name where lscpu is missing)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        out = ""
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


#: Each mode's settings; an option given on the command line wins.
SETTINGS = [
    "device",
    "batch",
    "batch_invariant",
    "steps_64",
    "steps_224",
    "side_64",
    "height_224",
    "width_224",
    "batching_model",
    "seam_model",
    "side_batching",
    "side_seams",
    "steps_batching",
    "steps_seams",
]
PRESETS: dict[str, tuple[Any, ...]] = {
    "quick": ("cpu", 16, "on", 2, 2, 64, 192, 192, "toy", "toy", 64, 96, 2, 2),
    "cpu": ("cpu", 16, "on", 10, 2, 64, 192, 384, "tiny", "tiny", 64, 192, 2, 2),
    "gpu": ("cuda", 64, "off", 50, 50, 512, 768, 768, "tiny", "tiny", 256, 512, 10, 50),
}
HELP = {
    "batch": "max patches per step batch",
    "steps_64": "denoising steps at 64 px",
    "steps_224": "denoising steps at 224 px",
    "side_64": "scene side at 64 px patches",
    "height_224": "scene height at 224 px patches",
    "width_224": "scene width at 224 px patches",
    "side_batching": "each batching request's scene side",
    "side_seams": "the seam scene's side",
    "steps_batching": "denoising steps of the batching run",
    "steps_seams": "denoising steps of the seam run",
}


def parser() -> argparse.ArgumentParser:
    p = cli(__doc__)
    p.add_argument("--quick", action="store_true", help="the toy model, small scenes (a test)")
    p.add_argument("--gpu", action="store_true", help="the CUDA preset (docs/benchmarks.md)")
    p.add_argument("--device", help="torch device (cpu; --gpu: cuda)")
    p.add_argument("--threads", type=int, help="torch threads (CPU: 1; --gpu: torch's own)")
    p.add_argument(
        "--batch-invariant",
        choices=("on", "off"),
        help="one network call per patch (on, the served default) or per batch (--gpu: off)",
    )
    p.add_argument("--batching-model", choices=("tiny", "toy"), help="(tiny; --quick: toy)")
    p.add_argument("--seam-model", choices=("tiny", "toy"), help="(tiny; --quick: toy)")
    for key, text in HELP.items():
        cpu, gpu = (PRESETS[m][SETTINGS.index(key)] for m in ("cpu", "gpu"))
        p.add_argument(f"--{key.replace('_', '-')}", type=int, help=f"{text} ({cpu}; --gpu: {gpu})")
    p.add_argument("--out", type=Path, help="the JSON's path (bench/results/generation.json)")
    return p


def settings(args: argparse.Namespace) -> argparse.Namespace:
    """The options not given, from the mode (``--quick``, ``--gpu`` or the CPU default)."""
    mode = "quick" if args.quick else "gpu" if args.gpu else "cpu"
    for key, value in zip(SETTINGS, PRESETS[mode], strict=True):
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.threads is None and not args.gpu:
        args.threads = 1
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: torch sees no CUDA device here")
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    main_model = TOY if args.quick else TINY
    models = {"tiny": TINY, "toy": TOY}
    load = [round(os.getloadavg()[0], 2)]
    t0 = time.perf_counter()
    rows = [
        throughput(main_model, 64, (args.side_64, args.side_64), args.steps_64, args),
        throughput(main_model, 224, (args.height_224, args.width_224), args.steps_224, args),
    ]
    for row in rows:
        print(json.dumps({k: v for k, v in row.items() if k != "kinds"}), flush=True)
    report: dict[str, Any] = {"throughput": rows, "chip": chip_cost(rows[1])}
    report["batching"] = batching(
        models[args.batching_model], 64, args.side_batching, args.steps_batching, args
    )
    print(json.dumps({k: report["batching"][k] for k in ("ratio", "mean_fill")}), flush=True)
    report["seams"] = seams(models[args.seam_model], 64, args.side_seams, args.steps_seams, args)
    load.append(round(os.getloadavg()[0], 2))
    report["machine"] = {**machine(), "cpu_model": cpu_model(), "device": args.device}
    report["run"] = {
        "quick": args.quick,
        "batch_invariant": args.batch_invariant == "on",
        "threads": args.threads,
        "seconds": round(time.perf_counter() - t0, 1),
        "load_1min": load,
        "nice": os.nice(0),
    }
    return report


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run every part; the JSON to ``--out`` (or ``bench/results``), then the docs section."""
    args = settings(parser().parse_args(argv))
    report = run(args)
    docs = not args.no_docs and not args.quick  # (quick figures are no benchmark)
    if args.out is None:
        publish("generation", report, write_markdown, docs=docs)
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
        print(json.dumps(report, indent=2))
        if docs:
            write_markdown(report)
    return report


if __name__ == "__main__":
    main()
