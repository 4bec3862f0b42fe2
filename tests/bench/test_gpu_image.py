"""``bench.gpu`` runs on the GPU machine's image plus the wheels ``bench/gpu_prepare.sh`` fetches.

A subprocess refuses to import any top-level module that is not in the image's package list,
the wheel list (:func:`bench.gpu_image.wheels`), the standard library, geoserve or bench, then
imports ``bench.gpu`` and smoke-runs its CPU path on a one-patch scene.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.gpu_image import allowed_modules, wheels

ROOT = Path(__file__).resolve().parents[2]

EMULATE = r"""
import json, sys

allowed = set(json.load(open(sys.argv[1])))
refused = []


class GpuImage:
    # wraps each finder: a module the GPU machine lacks is found by none, as if not installed
    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top not in allowed:
            refused.append(top)
            return None
        find = getattr(self.finder, "find_spec", None)
        return None if find is None else find(name, path, target)

    def __getattr__(self, attr):
        return getattr(self.finder, attr)


sys.meta_path[:] = [GpuImage(f) for f in sys.meta_path]
try:
    import uvicorn  # not in the image, not a wheel: the emulation must refuse it
except ModuleNotFoundError:
    pass
else:
    raise SystemExit("emulation let uvicorn through")
refused.clear()

import bench.gpu

report = bench.gpu.main(sys.argv[2:])
print("REFUSED", json.dumps(sorted(set(refused))))
print("LOADED", json.dumps(sorted({m.partition(".")[0] for m in sys.modules})))
"""


def test_wheel_list_covers_what_the_image_lacks():
    names = set(wheels())
    # the ones named with the machine, and what geoserve imports besides them
    for dist in ("pydantic", "pydantic-core", "annotated-types", "typing-inspection"):
        assert dist in names
    for dist in ("cachetools", "pystac", "rasterio", "affine", "cligj", "click-plugins"):
        assert dist in names
    assert not names & {"torch", "numpy", "timm", "pyarrow", "pyyaml", "prometheus-client"}


def test_bench_gpu_imports_and_smoke_runs_on_the_gpu_image(tmp_path):
    allowed = tmp_path / "allowed.json"
    allowed.write_text(json.dumps(sorted(allowed_modules())))
    out = tmp_path / "out"
    args = [
        "--device=cpu",
        "--size=224",
        "--variant=prithvi_eo_v2_tiny_tl",
        "--dtype=fp32",
        "--batch=1",
        "--workers=1",
        "--scenes=1",
        "--phases=reader,eager,profile",
        f"--out-dir={out}",
        f"--tmp={tmp_path}",
    ]
    proc = subprocess.run(
        [sys.executable, "-c", EMULATE, str(allowed), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={"PATH": "/usr/bin:/bin", "GEOSERVE_PLUGINS": "builtin", "OUT": str(out)},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    loaded = json.loads(proc.stdout.split("LOADED ", 1)[1].splitlines()[0])
    assert {"rasterio", "pydantic", "geoserve", "torch"} <= set(loaded)
    report = json.loads((out / "gpu.json").read_text())
    phases = report["phases"]
    assert set(phases) == {"scene", "reader", "eager", "profile"}
    assert not [name for name, p in phases.items() if "error" in p], phases
    assert phases["reader"]["end_to_end"][0]["patches"] >= 1
    assert phases["eager"]["model_only_patches_per_s"] > 0
    assert (out / "trace.json.gz").stat().st_size > 0
