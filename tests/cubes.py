"""Cubes for the tests of the ``xarray`` extra: real scenes as DataArrays, lazy Dask cubes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import rasterio
import rioxarray  # noqa: F401  (registers .rio)
import xarray as xr
from affine import Affine

REPO = Path(__file__).resolve().parents[1]
SCENE = REPO / "data" / "S2_L1C_T33UUU_20170216T102101_13band_10m.tif"


def dataarray(
    data: Any,
    transform: Affine,
    crs: Any = "EPSG:32633",
    bands: Any = None,
    **coords: Any,
) -> xr.DataArray:
    """(band, y, x) ``data`` (numpy or Dask) with pixel-centre coords, CRS and transform set."""
    count, height, width = data.shape
    da = xr.DataArray(
        data,
        dims=("band", "y", "x"),
        coords={
            "band": list(bands) if bands is not None else list(range(1, count + 1)),
            "x": transform.c + transform.a * (np.arange(width) + 0.5),
            "y": transform.f + transform.e * (np.arange(height) + 0.5),
            **coords,
        },
    )
    return da.rio.write_transform(transform).rio.write_crs(crs)


def scene_cube(rows: int = 192, cols: int = 256) -> xr.DataArray:
    """The bundled scene's upper-left corner as a DataArray, band names as the band coord."""
    with rasterio.open(SCENE) as src:
        window = ((0, rows), (0, cols))
        data = src.read(window=window)
        return dataarray(data, src.window_transform(window), src.crs, src.descriptions)


def write_scene_corner(path: Path, rows: int = 192, cols: int = 256) -> Path:
    """The same corner as :func:`scene_cube`, as a GeoTIFF (band descriptions kept)."""
    with rasterio.open(SCENE) as src:
        window = ((0, rows), (0, cols))
        profile = {
            **src.profile,
            "width": cols,
            "height": rows,
            "transform": src.window_transform(window),
        }
        with rasterio.open(path, "w", **profile) as dst:
            dst.write(src.read(window=window))
            dst.descriptions = src.descriptions
    return path


def seeded_block(block: np.ndarray, block_info: dict[Any, Any] | None = None) -> np.ndarray:
    """One chunk of a lazy cube: values from a generator seeded by the chunk's place.

    Any chunk computed twice gives the same values; the cube is never held whole anywhere.
    """
    if block_info is None:  # (dask's meta probe)
        return block
    info = block_info[None]
    (b0, _), (r0, _), (c0, _) = info["array-location"]
    seed = (b0 * 1_000_003 + r0) * 1_000_003 + c0
    rng = np.random.default_rng(seed)
    return rng.integers(1, 10_000, size=info["chunk-shape"], dtype=np.uint16)


def lazy_cube(
    bands: int, rows: int, cols: int, chunk: int = 512, calls: list[Any] | None = None
) -> xr.DataArray:
    """A Dask-backed (band, y, x) uint16 cube of :func:`seeded_block` chunks (EPSG:32633).

    ``calls``: where each computed chunk's (band, row, col) start is appended.
    """
    import dask.array as dsa

    def block(b: np.ndarray, block_info: dict[Any, Any] | None = None) -> np.ndarray:
        out = seeded_block(b, block_info)
        if calls is not None and block_info is not None:
            calls.append(tuple(lo for lo, _ in block_info[None]["array-location"]))
        return out

    empty = dsa.zeros((bands, rows, cols), dtype=np.uint16, chunks=(bands, chunk, chunk))
    data = empty.map_blocks(block, dtype=np.uint16)
    transform = Affine(10.0, 0.0, 300000.0, 0.0, -10.0, 5900000.0)
    return dataarray(data, transform, bands=[f"B{i}" for i in range(1, bands + 1)])
