"""The benchmarks' inputs: the bundled lake scene, crops of it, and synthetic Sentinel-2 stacks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import rasterio
from rasterio.io import MemoryFile
from rasterio.windows import Window

from bench.harness import RESULTS, ROOT

#: The bundled Sentinel-2 L1C scene (1536 x 768, 13 bands; see data/README.md).
LAKE = ROOT / "data" / "S2_L1C_T33UUU_20170216T102101_13band_10m.tif"
#: Synthetic scenes are cached here between runs.
SCENES = RESULTS / "scenes"
#: Crop sides: 1, 1, 4 and 4 patches at patch 224 / stride 192.
CROP_SIZES = (192, 192, 300, 384)


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


def synthetic_scene(size: int) -> Path:
    """A size x size x 6 uint16 scene, tiled 256, DEFLATE: cached under bench/results/scenes."""
    SCENES.mkdir(parents=True, exist_ok=True)
    path = SCENES / f"scene_{size}.tif"
    return path if path.exists() else write_scene(path, size, seed=size)


def crops(scene: Path = LAKE) -> list[bytes]:
    """16 crops of ``scene`` (seed 0), 192 to 384 px, as GeoTIFF bytes: the server benchmarks'
    uploads."""
    out = []
    with rasterio.open(scene) as src:
        rng = np.random.default_rng(0)
        for i in range(16):
            size = CROP_SIZES[i % len(CROP_SIZES)]
            r = int(rng.integers(0, src.height - size))
            c = int(rng.integers(0, src.width - size))
            win = Window(c, r, size, size)
            profile = {
                **src.profile,
                "width": size,
                "height": size,
                "transform": src.window_transform(win),
            }
            with MemoryFile() as mem:
                with mem.open(**profile) as dst:
                    dst.write(src.read(window=win))
                    dst.descriptions = src.descriptions
                out.append(bytes(mem.read()))
    return out
