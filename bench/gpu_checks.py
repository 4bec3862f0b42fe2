"""CUDA correctness checks, run by ``bench/gpu_run.sh`` before the benchmark (CI has no GPU).

Each check compares the device path with the host path (or numpy) and records what it found:

- ``upload_uint16``: a uint16 array (the full range) copied from pinned memory equals numpy;
- ``device_cut``: ``read_row_on`` (cast, normalise, cut on the device) equals ``read_row`` on
  the bundled lake scene, bit for bit, without and with nodata;
- ``device_canvas``: the engine with patches cut and stitched on the device equals the host
  pipeline (same model, same device);
- ``oom_backoff``: a model that really runs out of device memory above 4 patches a batch: the
  engine halves its batch and the output equals a batch-1 run;
- ``bf16``: bf16 autocast outputs are finite and agree with float32 on the class map.

    python -m bench.gpu_checks --device cuda --out-dir "$OUT"     # writes checks.json

On a CPU (``--device cpu``) the same code runs as a smoke test; ``oom_backoff`` is skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
import torch
from torch import nn

import bench.models  # noqa: F401  (registers bench-1x1, bench-conv)
from bench.models import BANDS, bench_patcher, register
from bench.scenes import LAKE
from geoserve import MODEL_REGISTRY, Engine
from geoserve.raster import open_raster


def upload_uint16(device: torch.device, _tmp: Path) -> dict[str, Any]:
    arr = np.random.default_rng(0).integers(0, 65536, (6, 512, 1024), dtype=np.uint16)
    raw = torch.from_numpy(arr)
    if device.type == "cuda":
        raw = raw.pin_memory()
    back = raw.to(device, non_blocking=True).to(torch.float32).cpu().numpy()
    np.testing.assert_array_equal(back, arr.astype(np.float32))
    return {"ok": True, "max": int(arr.max())}


def _lake_with_nodata(tmp: Path) -> Path:
    with rasterio.open(LAKE) as src:
        data, profile = src.read(), src.profile
    data[:, :300, :400] = 0  # whole patches of nodata, and a ragged edge
    data[:, 300:310, 400:700] = 0
    path = tmp / "lake_nodata.tif"
    with rasterio.open(path, "w", **{**profile, "nodata": 0}) as dst:
        dst.write(data)
    return path


def device_cut(device: torch.device, tmp: Path) -> dict[str, Any]:
    proc = bench_patcher(BANDS)
    out: dict[str, Any] = {}
    for name, path in (("plain", LAKE), ("nodata", _lake_with_nodata(tmp))):
        rows = 0
        with open_raster(path) as src:
            ctx = proc.prepare([src])
            for r in range(ctx.grid.rows):
                host = proc.read_row([src], ctx, r)
                dev = proc.read_row_on([src], ctx, r, device)
                assert dev.cols == host.cols, (name, r)
                got = dev.patches.cpu().numpy() if isinstance(dev.patches, torch.Tensor) else None
                np.testing.assert_array_equal(got, host.patches)
                rows += 1
        out[name] = {"rows": rows, "equal": True}
    return {"ok": True, **out}


def device_canvas(device: torch.device, _tmp: Path) -> dict[str, Any]:
    outs = {}
    for pre in ("host", "device"):
        with Engine(
            "bench-1x1-lake", device=str(device), preprocess=pre, output_kind=["probabilities"]
        ) as engine:
            res = engine.generate_image(LAKE, out_format="tensor")
            outs[pre] = res.outputs.tensor.numpy()
    diff = float(np.abs(outs["host"].astype(np.float64) - outs["device"]).max())
    assert outs["host"].shape == outs["device"].shape
    assert diff == 0.0 or np.mean(outs["host"] == outs["device"]) > 0.999, diff
    return {"ok": True, "max_abs_diff": diff, "shape": list(outs["host"].shape)}


class Hog(nn.Module):
    """1x1 conv; allocates a sixth of the device per patch, so more than 4 patches OOM."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(6, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            total = torch.cuda.get_device_properties(x.device).total_memory
            hog = torch.empty(x.shape[0] * total // 6, dtype=torch.uint8, device=x.device)
            del hog
        return self.conv(x)


def oom_backoff(device: torch.device, _tmp: Path) -> dict[str, Any]:
    if device.type != "cuda":
        return {"skipped": "needs CUDA"}
    with Engine("bench-hog", device="cuda", max_batch_patches=1) as one:
        want = one.generate_image(LAKE, out_format="tensor").outputs.tensor
    with Engine("bench-hog", device="cuda", max_batch_patches=16, warmup=False) as engine:
        got = engine.generate_image(LAKE, out_format="tensor").outputs.tensor
        batch = engine.max_batch_patches
    assert batch <= 4, batch
    diff = float((got.double() - want.double()).abs().max())
    assert diff < 1e-5, diff
    return {"ok": True, "batch_after": batch, "max_abs_diff": diff}


def bf16(device: torch.device, _tmp: Path) -> dict[str, Any]:
    outs = {}
    for dtype in (None, "bf16"):
        with Engine(
            "bench-conv-lake", device=str(device), dtype=dtype, output_kind=["probabilities"]
        ) as engine:
            outs[str(dtype)] = engine.generate_image(LAKE, out_format="tensor").outputs.tensor
    ref, low = outs["None"].float(), outs["bf16"].float()
    assert torch.isfinite(low).all()
    agree = float((ref.argmax(0) == low.argmax(0)).float().mean())
    assert agree > 0.99, agree
    return {"ok": True, "class_agreement": agree, "max_abs_diff": float((ref - low).abs().max())}


def timings(device: torch.device, _tmp: Path) -> dict[str, Any]:
    """A CUDA run's timings see the device: its forwards' time (events), the waits for it."""
    with Engine("bench-conv-lake", device=str(device)) as engine:
        t = engine.generate_image(LAKE, out_format="tensor").raise_for_error().timings
    if device.type == "cuda":
        assert t.device > 0, t
    else:
        assert t.device == 0, t
    assert t.read_busy > 0, t
    assert t.device_wait >= 0, t
    return {"ok": True, **vars(t)}


CHECKS: dict[str, Callable[[torch.device, Path], dict[str, Any]]] = {
    "upload_uint16": upload_uint16,
    "device_cut": device_cut,
    "device_canvas": device_canvas,
    "oom_backoff": oom_backoff,
    "bf16": bf16,
    "timings": timings,
}


def register_models() -> None:
    if "bench-hog" not in MODEL_REGISTRY:
        register("bench-hog", BANDS)(Hog)
        register("bench-1x1-lake", BANDS)(type("Pointwise13", (bench.models.Pointwise,), {}))
        register("bench-conv-lake", BANDS)(type("Conv13", (bench.models.BenchConv,), {}))


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out-dir", type=Path, default=Path(os.environ.get("OUT") or "."))
    parser.add_argument("--only", default=",".join(CHECKS), help="checks to run, by name")
    args = parser.parse_args()
    register_models()
    device = torch.device(args.device)
    report: dict[str, Any] = {"device": str(device), "torch": torch.__version__}
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only.split(","):
            try:
                report[name] = CHECKS[name](device, Path(tmp))
            except Exception as exc:  # recorded; the other checks still run
                traceback.print_exc()
                report[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
                failed += 1
            print(name, json.dumps(report[name]), flush=True)
            args.out_dir.mkdir(parents=True, exist_ok=True)
            (args.out_dir / "checks.json").write_text(json.dumps(report, indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
