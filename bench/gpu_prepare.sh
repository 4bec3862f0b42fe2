#!/usr/bin/env bash
# Run HERE (with a package index), before the GPU run: downloads every wheel the GPU machine's
# image lacks, for CPython 3.12 manylinux x86_64, into .whl/ (ignored by git). The list is
# geoserve's requirements (pyproject.toml, as installed in this venv, and theirs) minus the
# image's package list, each pinned to the version installed here: `python -m bench.gpu_image`.
# Then, on the GPU machine, in one call that carries .whl: bash bench/gpu_run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
rm -rf .whl
mkdir -p .whl
"$PY" -m bench.gpu_image > .whl/requirements.txt
echo "wheels for the GPU image: $(tr '\n' ' ' < .whl/requirements.txt)"
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --abi cp312 --abi abi3 --abi none \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
  -d .whl -r .whl/requirements.txt
n_want=$(grep -c . .whl/requirements.txt)
n_have=$(ls .whl/*.whl | wc -l)
[ "$n_want" -eq "$n_have" ] || { echo "expected $n_want wheels, got $n_have" >&2; exit 1; }
du -sh .whl
