"""Synthetic multi-band scenes for the benchmarks, laid out like Sentinel-2 stacks on disk."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import rasterio


def write_scene(path: Path, size: int, bands: int = 6, seed: int = 0) -> Path:
    """A size x size uint16 scene: tiled 256, DEFLATE + predictor, UTM, written 1024 rows at a
    time. Values are a smooth ramp per band plus noise, so it compresses like real reflectance
    rather than like random bytes."""
    profile = {
        "driver": "GTiff",
        "width": size,
        "height": size,
        "count": bands,
        "dtype": "uint16",
        "tiled": True,
        "blockxsize": 256,
        "blockysize": 256,
        "compress": "deflate",
        "predictor": 2,
        "NUM_THREADS": "ALL_CPUS",
        "BIGTIFF": "YES",
        "crs": "EPSG:32633",
        "transform": rasterio.Affine(10, 0, 300000, 0, -10, 5900000),
    }
    rng = np.random.default_rng(seed)
    x = np.arange(size, dtype=np.int64)
    tmp = path.with_name(path.name + ".part")
    with rasterio.open(tmp, "w", **profile) as dst:
        for r0 in range(0, size, 1024):
            rows = np.arange(r0, min(size, r0 + 1024), dtype=np.int64)[:, None]
            base = (x[None, :] * 7 + rows * 3) % 2500 + 200
            noise = rng.integers(0, 64, (bands, len(rows), size))
            offsets = np.arange(bands)[:, None, None] * 300
            dst.write(
                (base[None] + noise + offsets).astype(np.uint16),
                window=((r0, r0 + len(rows)), (0, size)),
            )
    tmp.rename(path)
    return path
