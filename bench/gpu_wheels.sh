#!/usr/bin/env bash
# For a GPU machine whose Python 3.12 has torch, timm, numpy, einops, safetensors and click but
# not rasterio, and that cannot reach a package index: downloads the other wheels
# `python -m bench.gpu` needs (CPython 3.12, manylinux x86_64) into .whl/ (ignored by git), to
# copy there with the repository. How to install and run them: docs/performance.md, "On a GPU".
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl \
  rasterio==1.4.4 affine==2.4.0 cligj==0.7.2 click-plugins==1.1.1.2
du -sh .whl
