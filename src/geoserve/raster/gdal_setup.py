"""Process-wide settings an engine applies when it starts.

GDAL's block-cache cap, and the default number of reader threads.
"""

from __future__ import annotations

import os

#: GDAL's block cache, in MB, unless the GDAL_CACHEMAX environment variable sets it. GDAL's
#: default (5 % of RAM) lets the cache grow with the scene; geoserve keeps its own cache of
#: decoded rows, so GDAL only needs room for the tiles of one band of rows.
GDAL_CACHE_MB = 64


def limit_gdal_cache(megabytes: int = GDAL_CACHE_MB) -> None:
    """Cap GDAL's block cache (process-wide) unless GDAL_CACHEMAX is set in the environment.

    Called when an engine starts, before it reads anything.
    """
    if "GDAL_CACHEMAX" not in os.environ:
        from rasterio._env import set_gdal_config

        set_gdal_config("GDAL_CACHEMAX", megabytes << 20)  # rasterio passes bytes to GDAL


def default_read_workers() -> int:
    """Reader threads by default: the core count, at most 4 (the model needs cores too)."""
    return max(1, min(4, os.cpu_count() or 1))
