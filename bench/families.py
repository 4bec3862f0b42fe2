"""CPU throughput of each served family's smallest variant, alone and through the engine.

    python -m bench.families            # prints JSON, updates docs/benchmarks.md

For each family, a segmentation fine-tune of its smallest variant with random weights (the
architecture, not the numbers, sets the cost): the bare module's forward on random 224 x 224
patches at batch 1, 4 and 16 (fp32, patches per second), then the registered model that serves
that family run by ``Engine`` on the bundled 13-band Sentinel-2 lake scene (1536 x 768) from a
checkpoint file, GeoTIFF in to GeoTIFF out, with its default tiling: end-to-end patches per
second, and the model step's share of that time (the rest: reading, normalising, stitching,
writing).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn

from bench.harness import cli, machine, machine_line, publish, throughput, timed, write_section
from bench.scenes import LAKE
from geoserve import Engine

BATCHES = (1, 4, 16)
E2E_BATCH = 8


@dataclass
class Family:
    """One family: how to build its smallest fine-tune and which registered model serves it."""

    family: str
    variant: str
    build: Callable[[], nn.Module]
    inputs: Callable[[int], Any]  # batch -> the module's input
    served_by: str
    save: Callable[[nn.Module, Path], Path]
    engine_options: dict[str, Any]
    #: Registers the model from files in a directory (configured models); the weights go with it.
    register: Callable[[nn.Module, Path], None] | None = None


def _prithvi() -> nn.Module:
    from geoserve.models.prithvi import PrithviSegmentation, encoder_kwargs

    kw = encoder_kwargs("prithvi_eo_v2_tiny_tl")
    return PrithviSegmentation(num_classes=2, feature_indices=(2, 5, 8, 11), **kw)


def _terramind() -> nn.Module:
    from geoserve.models.terramind import TerraMindSegmentation
    from geoserve.models.terramind.variants import VARIANTS

    necks = [
        {"name": "SelectIndices", "indices": [2, 5, 8, 11]},
        {"name": "ReshapeTokensToImage"},
        {"name": "LearnedInterpolateToPyramidal"},
    ]
    return TerraMindSegmentation(
        dict(modalities={"S2L1C": 13, "S1GRD": 2}, **VARIANTS["terramind_v1_tiny"]),
        necks=necks,
        decoder="UNetDecoder",
        decoder_args={"channels": [512, 256, 128, 64]},
        num_classes=2,
    )


#: A TerraTorch fine-tune config of the timm / SMP family: ResNet-18 + UNet over the 13 bands.
RESNET_CONFIG: dict[str, Any] = {
    "model": {
        "class_path": "terratorch.tasks.SemanticSegmentationTask",
        "init_args": {
            "model_factory": "EncoderDecoderFactory",
            "model_args": {
                "backbone": "timm_resnet18",
                "backbone_in_chans": 13,
                "decoder": "UNetDecoder",
                "decoder_channels": [256, 128, 64, 32, 16],
                "num_classes": 2,
            },
            "tiled_inference_parameters": {"crop": 224, "stride": 192, "average_patches": False},
        },
    },
    "data": {"init_args": {"constant_scale": 1.0e-4}},
}


def _resnet() -> nn.Module:
    from geoserve.models.encoder_decoder import build_network
    from geoserve.models.terratorch_config import read_fine_tune

    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "config.yaml"
        cfg.write_text(yaml.safe_dump(RESNET_CONFIG))
        return build_network(read_fine_tune(cfg).network)


def _register_resnet(model: nn.Module, root: Path) -> None:
    from geoserve.models.configured import register_configured

    cfg = root / "config.yaml"
    cfg.write_text(yaml.safe_dump(RESNET_CONFIG))
    register_configured("bench-resnet18-unet", cfg, _lightning(model, root / "best.ckpt"))


def _lightning(model: nn.Module, path: Path) -> Path:
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}}, path)
    return path


FAMILIES = [
    Family(
        "Prithvi-EO 2.0",
        "prithvi_eo_v2_tiny_tl + UperNet (6 bands)",
        _prithvi,
        lambda b: (torch.randn(b, 6, 1, 224, 224),),
        "prithvi-eo2-300m-tl-sen1floods11",
        _lightning,
        {"patch_size": 224, "stride": 192},
    ),
    Family(
        "TerraMind 1.0",
        "terramind_v1_tiny + UNet (S2L1C 13 bands)",
        _terramind,
        lambda b: ({"S2L1C": torch.randn(b, 13, 224, 224)},),
        "terramind-v1-sen1floods11",
        _lightning,
        {},
    ),
    Family(
        "timm / SMP encoder-decoder",
        "timm resnet18 + UNetDecoder (13 bands)",
        _resnet,
        lambda b: (torch.randn(b, 13, 224, 224),),
        "bench-resnet18-unet",
        _lightning,
        {},
        _register_resnet,
    ),
]


def forward_rates(fam: Family, model: nn.Module) -> dict[int, float]:
    rates = {}
    for batch in BATCHES:
        args = fam.inputs(batch)
        with torch.inference_mode():
            rate = throughput(lambda a=args: model(*a), per_call=batch, reps=2 if batch < 16 else 1)
        rates[batch] = round(rate, 2)
    return rates


def end_to_end(fam: Family, model: nn.Module) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        weights: Path | None = None
        if fam.register is not None:
            fam.register(model, Path(tmp))
        else:
            weights = fam.save(model, Path(tmp) / "weights.ckpt")
        engine = Engine(
            fam.served_by, weights=weights, max_batch_patches=E2E_BATCH, **fam.engine_options
        )
        source: Any = {"S2L1C": str(LAKE)} if fam.served_by.startswith("terramind") else LAKE
        engine.generate_image(source, output_path=Path(tmp) / "warm.tif")
        forward = engine.runner.forward  # count and time exactly the engine's model step
        spent = {"s": 0.0, "patches": 0}

        def timed_forward(patches: Any) -> Any:
            seconds, out = timed(lambda: forward(patches))
            spent["s"] += seconds
            spent["patches"] += len(patches)
            return out

        engine.runner.forward = timed_forward  # type: ignore[method-assign]
        wall, _ = timed(lambda: engine.generate_image(source, output_path=Path(tmp) / "o.tif"))
        grid = engine.in_proc.patch_size, engine.in_proc.stride
    n = spent["patches"]
    return {
        "model": fam.served_by,
        "patch": grid[0],
        "stride": grid[1],
        "patches": n,
        "seconds": round(wall, 2),
        "patches_per_s": round(n / wall, 2),
        "model_share": round(spent["s"] / wall, 3),
    }


def run() -> list[dict[str, Any]]:
    rows = []
    for fam in FAMILIES:
        torch.manual_seed(0)
        model = fam.build().eval()
        row = {
            "family": fam.family,
            "variant": fam.variant,
            "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
            "forward": forward_rates(fam, model),
            "engine": end_to_end(fam, model),
        }
        print(row, flush=True)
        rows.append(row)
    return rows


def write_markdown(report: dict[str, Any]) -> None:
    lines = [
        "Each family's smallest variant as a segmentation fine-tune, random weights, fp32, "
        f"224 x 224 patches. {machine_line(report['machine'], 'torch')} Bare forward, "
        "patches per second; then the registered model serving it through `Engine` on the "
        "13-band lake scene (1536 x 768), GeoTIFF to GeoTIFF, default tiling, batch "
        f"{E2E_BATCH}, and the share of that time spent in the model's forward.",
        "",
        "| family | fine-tune | params (M) | "
        + " | ".join(f"batch {b}" for b in BATCHES)
        + " | served as | patches | end to end (patches/s) | model share |",
        "| --- | --- | --- | " + " | ".join("---" for _ in BATCHES) + " | --- | --- | --- | --- |",
    ]
    for r in report["families"]:
        e = r["engine"]
        rates = " | ".join(str(r["forward"][b]) for b in BATCHES)
        lines.append(
            f"| {r['family']} | {r['variant']} | {r['params_m']} | {rates} | `{e['model']}` "
            f"({e['patch']}/{e['stride']}) | {e['patches']} | {e['patches_per_s']} | "
            f"{e['model_share']} |"
        )
    write_section("families", "Model families on the CPU", lines)


def main() -> None:
    args = cli(__doc__).parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    report = {"families": run(), "machine": machine()}
    publish("families", report, write_markdown, docs=not args.no_docs)


if __name__ == "__main__":
    main()
