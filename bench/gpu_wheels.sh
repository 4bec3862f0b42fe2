#!/usr/bin/env bash
# Wheels bench/bench_gpu.py needs on the lent GPU machine, whose image has torch, timm, numpy,
# einops, safetensors and click but not rasterio (and nothing can be installed from there).
# Downloads cp312 manylinux wheels into .whl/ (ignored by git); see docs/performance.md.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl \
  rasterio==1.4.4 affine==2.4.0 cligj==0.7.2 click-plugins==1.1.1.2
du -sh .whl
