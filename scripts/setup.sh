#!/usr/bin/env bash
# Set up geoserve in ./.venv on a fresh machine: torch first (pinned to the version geoserve is
# tested with; pip takes it from the package index or a local wheel cache), then geoserve
# itself with its test, server, Ray, xarray, STAC search and cpu (OpenVINO) extras.

set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet torch==2.14.1 torchvision==0.29.1
.venv/bin/python -m pip install --quiet -e '.[dev,server,ray,xarray,stac,cpu]'
# the Prithvi model plugin (its own package, found through the geoserve.plugins entry point)
.venv/bin/python -m pip install --quiet -e plugins/geoserve-prithvi
# the TerraMind model plugin, beside it
.venv/bin/python -m pip install --quiet -e plugins/geoserve-terramind
