"""Fine-tunes of one encoder, loaded side by side: memory with the encoder shared and without.

    python -m bench.shared_weights       # prints JSON, updates docs/benchmarks.md

Three TerraTorch fine-tunes (timm ResNet-18 + UNet decoder over 4 bands, random weights) share
one encoder's weights, as fine-tunes with a frozen backbone do, each with its own decoder and
head. Each way (``share_weights`` on, off) runs in a fresh process: the resident set (VmRSS)
grown by loading the three engines, and the time their loads took. Then the arithmetic for
three fine-tunes of Prithvi-EO-2.0-300M-TL with UperNet heads (the architecture of
``prithvi-eo2-300m-tl-sen1floods11``), counted from the modules built on the meta device.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import torch
import yaml

from bench.harness import cli, machine, machine_line, publish, write_section
from geoserve.engine.cpu_inference import cpu_name

NAMES = ("floods", "burns", "crops")
MODEL_ARGS = {
    "backbone": "timm_resnet18",
    "backbone_in_chans": 4,
    "backbone_pretrained": False,
    "decoder": "UNetDecoder",
    "decoder_channels": [32, 32, 16, 16, 16],
    "num_classes": 3,
}
CONFIG = {
    "model": {
        "class_path": "terratorch.tasks.SemanticSegmentationTask",
        "init_args": {"model_factory": "EncoderDecoderFactory", "model_args": MODEL_ARGS},
    },
    "data": {
        "class_path": "GenericNonGeoSegmentationDataModule",
        "init_args": {
            "dataset_bands": ["BLUE", "GREEN", "RED", "NIR"],
            "output_bands": ["BLUE", "GREEN", "RED", "NIR"],
            "means": [500.0, 600.0, 700.0, 2000.0],
            "stds": [300.0, 310.0, 320.0, 800.0],
        },
    },
}

LOAD = textwrap.dedent(
    """
    import gc, json, sys, time
    from geoserve import Engine
    from geoserve.engine.heap import trim_heap
    from geoserve.models.configured import register_configured

    def rss_mb():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024

    root, share = sys.argv[1], sys.argv[2] == "on"
    names = sys.argv[3:]
    for n in names:
        register_configured(n, f"{root}/{n}/config.yaml", f"{root}/{n}/best.ckpt")
    Engine("identity")  # (torch and the engine's threads started before measuring)
    gc.collect(); trim_heap()
    before = rss_mb()
    t0 = time.perf_counter()
    engines = [Engine(n, share_weights=share, warmup=False) for n in names]
    seconds = time.perf_counter() - t0
    gc.collect(); trim_heap()
    shared = sum(p.bytes for e in engines for p in e.shared_parts) / 2**20
    print(json.dumps({"grown_mb": rss_mb() - before, "load_s": seconds, "shared_mb": shared}))
    """
)


def write_fine_tunes(root: Path) -> float:
    """The three fine-tunes under ``root``; the encoder's MB of weights."""
    from geoserve.models.encoder_decoder import build_network
    from geoserve.models.terratorch_config import read_fine_tune

    (root / NAMES[0]).mkdir(parents=True)
    (root / NAMES[0] / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    torch.manual_seed(3)
    net = build_network(read_fine_tune(root / NAMES[0] / "config.yaml").network)
    state = {f"model.{k}": v for k, v in net.state_dict().items()}
    for seed, name in enumerate(NAMES):
        g = torch.Generator().manual_seed(seed)
        own = {
            k: v * (1 + 0.05 * torch.randn(v.shape, generator=g))
            if seed and v.is_floating_point() and not k.startswith("model.encoder.")
            else v
            for k, v in state.items()
        }
        (root / name).mkdir(exist_ok=True)
        (root / name / "config.yaml").write_text(yaml.safe_dump(CONFIG))
        torch.save({"state_dict": own}, root / name / "best.ckpt")
    encoder = [*net.encoder.parameters(), *net.encoder.buffers()]
    return sum(t.numel() * t.element_size() for t in encoder) / 2**20


def measured(root: Path, share: str) -> dict[str, float]:
    cmd = [sys.executable, "-c", LOAD, str(root), share, *NAMES]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True)
    got: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return {k: round(v, 2) for k, v in got.items()}


def prithvi_arithmetic() -> dict[str, float]:
    """MB of float32 weights: Prithvi-EO-2.0-300M-TL's encoder, and UperNet + head."""
    from geoserve.models.prithvi.segmentation import PrithviSegmentation
    from geoserve.models.prithvi.variants import encoder_kwargs

    with torch.device("meta"):
        net = PrithviSegmentation(
            num_classes=2,
            feature_indices=(5, 11, 17, 23),
            **encoder_kwargs("prithvi_eo_v2_300_tl", num_frames=1),
        )

    def mb(module: torch.nn.Module) -> float:
        tensors = [*module.parameters(), *module.buffers()]
        return sum(t.numel() * 4 for t in tensors) / 2**20

    encoder, whole = mb(net.encoder), mb(net)
    return {
        "encoder_mb": round(encoder, 1),
        "head_mb": round(whole - encoder, 1),
        "three_apart_mb": round(3 * whole, 1),
        "three_shared_mb": round(encoder + 3 * (whole - encoder), 1),
    }


def run() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        encoder_mb = write_fine_tunes(root)
        on, off = measured(root, "on"), measured(root, "off")
    return {
        "encoder_mb": round(encoder_mb, 1),
        "shared": on,
        "apart": off,
        "prithvi_300m_tl": prithvi_arithmetic(),
        "machine": machine(),
        "cpu": cpu_name(),
    }


def write_markdown(report: dict[str, Any]) -> None:
    on, off, p = report["shared"], report["apart"], report["prithvi_300m_tl"]
    saved = p["three_apart_mb"] - p["three_shared_mb"]
    lines = [
        f"{machine_line(report['machine'], 'torch')} CPU: {report.get('cpu', '?')}. Three "
        "fine-tunes of one timm ResNet-18 encoder (UNet decoders, 4 bands; each its own "
        f"decoder and head; the encoder {report['encoder_mb']} MB of float32 weights) loaded "
        "side by side in one process, each way in a fresh one; resident memory (VmRSS) "
        "grown by the three loads.",
        "",
        "| `share_weights` | resident memory grown (MB) | weights shared (MB) | three loads (s) |",
        "| --- | --- | --- | --- |",
        f"| on | {on['grown_mb']} | {on['shared_mb']} | {on['load_s']} |",
        f"| off | {off['grown_mb']} | {off['shared_mb']} | {off['load_s']} |",
        "",
        "Prithvi-EO-2.0-300M-TL with an UperNet head (256 channels; counted from the modules, "
        f"float32): the encoder {p['encoder_mb']} MB, decoder and head {p['head_mb']} MB. "
        f"Three such fine-tunes of one frozen encoder: {p['three_apart_mb']} MB apart, "
        f"{p['three_shared_mb']} MB shared ({saved:.0f} MB less).",
    ]
    write_section("shared_weights", "Fine-tunes of one encoder, shared", lines)


def main() -> None:
    args = cli(__doc__).parse_args()
    publish("shared_weights", run(), write_markdown, docs=not args.no_docs)


if __name__ == "__main__":
    main()
