"""CPU backends side by side: torch fp32 / int8 / bf16 and OpenVINO fp32 / bf16 / int8, end to end.

    python -m bench.cpu_backends              # demo-water; prints JSON, updates docs/benchmarks.md
    python -m bench.cpu_backends --prithvi    # also TerraMind tiny + UNet and the 100M- and
                                              # 300M-TL-shaped Prithvi UperNets

Each setting runs through ``Engine`` on the bundled lake scene, GeoTIFF in, raw logits out,
batch 4: torch float32, torch ``--quantize int8`` (dynamic, linear layers), torch ``--dtype
bf16`` (autocast), ``--backend openvino`` float32, ``--precision bf16`` and ``--precision int8
--calibrate`` (NNCF static int8 calibrated on the lake scene's own patches; bf16 and int8 are
forced on CPUs without what makes them pay, and their accuracy gate only warns: the table
shows how well they agree). Every engine is built first (conversion and
calibration into a fresh cache, timed: the figures stored with the converted model), then
the runs are taken in turn, interleaved, after a warm run, and each setting's best round is
kept, so a slow spell of a shared machine hits every setting alike. Agreement: share of
pixels with torch float32's class; error: largest logit difference. The CPU's flags that
decide what pays (AVX2, AVX-512, VNNI, AMX, BF16) are recorded with the figures.
"""

from __future__ import annotations

import math
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import cli, machine, machine_line, publish, timed, write_section
from bench.scenes import LAKE
from geoserve import Engine
from geoserve.accuracy import compare_outputs
from geoserve.engine.cpu_inference import cpu_flags, cpu_name
from geoserve.engine.openvino_backend import OpenVinoRunner

BATCH = 4
ROUNDS = 3
#: The flags that decide which precision pays on an x86 CPU.
FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
SETTINGS: dict[str, dict[str, Any]] = {
    "torch fp32": {},
    "torch int8": {"quantize": "int8"},
    "torch bf16": {"dtype": "bf16"},  # (autocast: native only with AVX512-BF16 or AMX)
    "openvino fp32": {"backend": "openvino"},
    "openvino bf16": {
        "backend": "openvino",
        "precision": "bf16",
        "calibrate": [LAKE],  # (the accuracy gate's patches)
        "accuracy_gate": "warn",  # (measured whatever it agrees; the table shows how well)
        "force_precision": True,
    },
    "openvino int8": {
        "backend": "openvino",
        "precision": "int8",
        "calibrate": [LAKE],
        "accuracy_gate": "warn",
        "force_precision": True,  # (measured on any CPU, VNNI or not)
    },
}


def lscpu() -> dict[str, str]:
    """``lscpu``'s model name and the flags of :data:`FLAGS` it has."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        text = ""
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    flags = set(fields.get("Flags", "").split()) or set(cpu_flags())
    return {
        "model_name": fields.get("Model name", cpu_name()).strip(),
        "flags": " ".join(f for f in FLAGS if f in flags) or "none of them",
    }


def run_model(
    name: str, model: str, tmp: Path, weights: Path | None, tiling: dict[str, int]
) -> dict[str, Any]:
    """Every setting on the lake scene, interleaved (see the module docstring)."""
    rows: dict[str, dict[str, Any]] = {}
    engines: dict[str, Engine] = {}
    for setting, options in SETTINGS.items():
        t0 = time.perf_counter()
        engine = Engine(
            model,
            weights=weights,
            max_batch_patches=BATCH,
            output_kind=["raw"],
            backend_cache_dir=tmp / "converted",
            **tiling,
            **options,
        )
        engines[setting] = engine
        row: dict[str, Any] = {"startup_s": round(time.perf_counter() - t0, 1)}
        engine.generate_image(LAKE, output_path=tmp / f"{name}_{setting}.tif")  # warm
        if isinstance(engine.runner, OpenVinoRunner):  # (converted by now: at start-up, or
            # for the first batch; a multimodal model once per set of modalities, the
            # warm-up's all of them and the scene's S2 alone: their costs summed)
            converted = list(engine.runner.converted.values())
            row["conversions"] = len(converted)
            row["conversion_s"] = round(sum(c.meta["conversion_s"] for c in converted), 3)
            calibrated = [c.meta["calibration_s"] for c in converted if "calibration_s" in c.meta]
            row["calibration_s"] = round(sum(calibrated), 3) if calibrated else None
            row["gate"] = next((c.meta["gate"] for c in converted if c.meta.get("gate")), None)
            row["disk_mb"] = round(
                sum(f.stat().st_size for c in converted for f in c.folder.iterdir()) / 1e6, 1
            )
        row["seconds"] = math.inf
        rows[setting] = row
    for _ in range(ROUNDS):
        for setting, engine in engines.items():
            out = tmp / f"{name}_{setting}.tif"
            wall, result = timed(lambda e=engine, o=out: e.generate_image(LAKE, output_path=o))
            rows[setting]["patches"] = result.num_patches
            rows[setting]["seconds"] = round(min(rows[setting]["seconds"], wall), 2)
    for engine in engines.values():
        engine.close()
    ref = tmp / f"{name}_torch fp32.tif"
    for setting, row in rows.items():
        row["patches_per_s"] = round(row["patches"] / row["seconds"], 2)
        row["speedup"] = round(rows["torch fp32"]["seconds"] / row["seconds"], 2)
        if setting != "torch fp32":
            stats = compare_outputs(ref, tmp / f"{name}_{setting}.tif", is_classes=True)
            row["agreement"] = round(stats["agreement"], 5)
            row["max_logit_error"] = float(f"{stats['max_abs']:.3g}")
        print(name, setting, row, flush=True)
    return rows


def run(prithvi: bool) -> dict[str, Any]:
    report: dict[str, Any] = {"cpu": lscpu(), "models": {}}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        report["models"]["demo-water"] = run_model("demo", "demo-water", tmp, None, {})
        if prithvi:
            from bench.cpu_fast_path import TILING, _checkpoint

            w100 = _checkpoint("prithvi_eo_v2_100_tl", tmp / "p100.ckpt")
            report["models"]["100M-TL UperNet"] = run_model(
                "p100", "prithvi-eo2-300m-tl-sen1floods11", tmp, w100, TILING
            )
            from bench.families import _lightning, _terramind

            tm = _lightning(_terramind().eval(), tmp / "terramind.ckpt")
            report["models"]["TerraMind tiny + UNet"] = run_model(
                "tm", "terramind-v1-sen1floods11", tmp, tm, {}
            )
            w300 = _checkpoint("prithvi_eo_v2_300_tl", tmp / "p300.ckpt")
            report["models"]["300M-TL UperNet"] = run_model(
                "p300", "prithvi-eo2-300m-tl-sen1floods11", tmp, w300, TILING
            )
    return report


def write_markdown(report: dict[str, Any]) -> None:
    m, cpu = report["machine"], report["cpu"]
    lines = [
        f"{machine_line(m, 'torch')} CPU: {cpu['model_name']}; of AVX2, AVX-512, VNNI, AMX "
        f"and BF16 it has: {cpu['flags']}. OpenVINO {report.get('openvino', '?')}, NNCF "
        f"{report.get('nncf', '?')}. Each setting through `Engine` on the lake scene "
        "(1536 x 768, 32 patches of 224), GeoTIFF in, raw logits out, batch 4; every engine "
        f"built first, then the runs taken in turn, {ROUNDS} rounds after a warm run, best "
        "kept. Agreement: share of pixels with torch fp32's class; error: largest logit "
        "difference. "
        "Conversion: `openvino.convert_model` of the loaded module (TerraMind: once per set "
        "of modalities, the warm-up's S2 + S1 and the scene's S2 alone, summed); calibration: "
        "NNCF on 32 "
        "patches of the same scene (int8 is calibrated on the scene it is then measured on). "
        "Gate: the bf16 / int8 model against torch fp32 on those patches (only warned of "
        "here: the table gives the agreement).",
        "",
        "| model | setting | patches/s | vs torch fp32 | same classes | max logit error "
        "| start-up (s) | conversion (s) | calibration (s) | gate agreement | on disk (MB) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for model, rows in report["models"].items():
        for setting, r in rows.items():
            gate = (r.get("gate") or {}).get("agreement")
            lines.append(
                f"| {model} | {setting} | {r['patches_per_s']} | {r['speedup']}x | "
                f"{100 * r.get('agreement', 1.0):.3f} % | {r.get('max_logit_error', 0)} | "
                f"{r['startup_s']} | {r.get('conversion_s') or '—'} | "
                f"{r.get('calibration_s') or '—'} | "
                f"{f'{100 * gate:.2f} %' if gate is not None else '—'} | "
                f"{r.get('disk_mb') or '—'} |"
            )
    lines += ["", report.get("note", "")]
    write_section("cpu_backends", "CPU backends: torch and OpenVINO", lines)


def main() -> None:
    import importlib.metadata

    parser = cli(__doc__)
    parser.add_argument(
        "--prithvi",
        action="store_true",
        help="also TerraMind tiny + UNet and the 100M- and 300M-TL-shaped UperNets (minutes)",
    )
    parser.add_argument("--note", default="", help="a sentence written under the table")
    args = parser.parse_args()
    report = run(args.prithvi)
    report["machine"] = machine()
    report["openvino"] = importlib.metadata.version("openvino")
    report["nncf"] = importlib.metadata.version("nncf")
    report["note"] = args.note
    publish("cpu_backends", report, write_markdown, docs=not args.no_docs)


if __name__ == "__main__":
    main()
