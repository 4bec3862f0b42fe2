#!/usr/bin/env bash
# Run THERE, on the GPU machine, in one call that carries .whl (fetched here by
# bench/gpu_prepare.sh), within ~9 minutes:
#     bash bench/gpu_run.sh            # results in $OUT (default bench/results/gpu)
# Installs the wheels with --target (no index there), prints versions and nvidia-smi, runs the
# CUDA correctness checks (bench.gpu_checks -> checks.json) and the compile-once test on CUDA,
# then bench.gpu phase by phase (gpu.json rewritten after each, a profiler trace at the end).
# Each step has its own time limit, and a step that fails does not stop the next.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
OUT=${OUT:-bench/results/gpu}
export OUT
mkdir -p "$OUT"
PY=${PYTHON:-python3}
SITE=${SITE:-/tmp/geoserve-site}
exec > >(tee "$OUT/run.log") 2>&1

ls .whl/*.whl >/dev/null || { echo "no .whl/: run bench/gpu_prepare.sh here, carry .whl"; exit 1; }
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$SITE" .whl/*.whl || exit 1
# the wheels, then this tree's geoserve (not installed: its built-in models register anyway)
export PYTHONPATH="$SITE:$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export GEOSERVE_PLUGINS=builtin

"$PY" - <<'PYEOF'
import importlib, sys
print("python", sys.version.split()[0])
for name in ("torch", "numpy", "rasterio", "pydantic", "pystac", "timm", "einops", "geoserve"):
    try:
        mod = importlib.import_module(name)
        print(f"{name} {getattr(mod, '__version__', '?')} {mod.__file__}")
    except Exception as exc:
        print(f"{name}: {exc!r}")
import rasterio, torch
print("gdal", rasterio.__gdal_version__, "cuda", torch.version.cuda,
      "device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
PYEOF
nvidia-smi || true

rc=0
timeout 120 "$PY" -m bench.gpu_checks --device cuda --out-dir "$OUT" || rc=1
timeout 90 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_compile_once.py \
  --junitxml="$OUT/pytest-gpu.xml" || rc=1
timeout 330 "$PY" -m bench.gpu --out-dir "$OUT" --phases reader,eager,compiled,profile \
  --scenes 1,4 || rc=1
ls -la "$OUT"
exit $rc
