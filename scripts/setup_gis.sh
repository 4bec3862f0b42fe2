#!/usr/bin/env bash
# QGIS 3.22 and GDAL 3.6 as Debian 12's GIS users have them: the products' QGIS test
# (tests/raster/test_gis_products.py) loads geoserve's outputs with them through the system
# Python (python3-qgis; about 100 MB to download, a few minutes). Skipped when absent.
set -euo pipefail
if /usr/bin/python3 -c "import qgis.core" >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-qgis >/dev/null
elif command -v sudo >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-qgis >/dev/null
else
    echo "setup_gis: install python3-qgis (the products' QGIS test needs it; it is skipped without)" >&2
fi
