"""Seeded synthetic multimodal scenes with known answers (used by tests and bench/).

- :func:`write_s2`: an S2-like scene, 10 m in EPSG:32633, uint16 reflectance x 10000 with band
  descriptions ``B2 B3 B4 B8``, nodata 0. Water is a disc in the middle (B3 > B8 there,
  B3 < B8 elsewhere), so NDWI > 0 exactly on the disc.
- :func:`write_s1`: an S1-like scene, 20 m in EPSG:4326, float32 ``VV VH`` in dB, NaN as
  nodata, covering only the upper-left part of the S2 scene (the rest is outside its
  footprint). Water (the same disc, on the ground) has VV < -15 dB, land VV > -10 dB.

Every value is a smooth function of ground position plus seeded noise, so bilinear resampling
changes values little and the water rule gives the same answer on both grids away from edges.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import rasterio
from affine import Affine
from rasterio.crs import CRS
from rasterio.warp import transform, transform_bounds

S2_CRS = CRS.from_epsg(32633)
S1_CRS = CRS.from_epsg(4326)
#: Upper-left corner of the S2 scene (EPSG:32633 metres) and its pixel size.
S2_ORIGIN = (400000.0, 5800000.0)
S2_RES = 10.0
#: The water disc: centre (EPSG:32633) and radius in metres, for a scene of ``size`` pixels.


def water_disc(size: int) -> tuple[float, float, float]:
    """Centre x, centre y (EPSG:32633) and radius (m) of the water disc of a ``size`` scene."""
    x0, y0 = S2_ORIGIN
    half = size * S2_RES / 2
    return x0 + half, y0 - half, size * S2_RES / 4


def s2_transform() -> Affine:
    """The S2 scene's geotransform."""
    return Affine(S2_RES, 0, S2_ORIGIN[0], 0, -S2_RES, S2_ORIGIN[1])


def _is_water(x: np.ndarray, y: np.ndarray, size: int) -> np.ndarray:
    cx, cy, r = water_disc(size)
    return (x - cx) ** 2 + (y - cy) ** 2 < r**2


def s2_array(size: int, seed: int = 0, rows: slice | None = None) -> np.ndarray:
    """(4, rows, size) uint16 B2, B3, B4, B8 of the S2 scene (all rows by default)."""
    rows = rows or slice(0, size)
    rng = np.random.default_rng([seed, rows.start])
    r = np.arange(rows.start, rows.stop)[:, None] + 0.5
    c = np.arange(size)[None, :] + 0.5
    x, y = S2_ORIGIN[0] + c * S2_RES, S2_ORIGIN[1] - r * S2_RES
    water = _is_water(x, y, size)
    ramp = 300 * np.sin(c / 97.0) + 200 * np.cos(r / 61.0)
    noise = rng.normal(0, 20, (4, *water.shape))
    land = np.array([900, 1200, 1100, 3000])[:, None, None] + ramp + noise
    wet = np.array([700, 900, 500, 300])[:, None, None] + 0.3 * ramp + noise
    out = np.where(water, wet, land)
    return np.clip(out, 1, 10000).astype(np.uint16)


def write_s2(
    path: Path, size: int = 512, seed: int = 0, height: int | None = None, **profile: Any
) -> Path:
    """The S2-like scene as a tiled, DEFLATE GeoTIFF, written in bands of rows.

    ``height``: a scene of only ``height`` rows (``size`` by default) on the same grid, with
    the ramp and water disc of the ``size`` x ``size`` scene; for a multiple of 1024 rows,
    exactly its first rows (the noise is drawn per band of 1024 rows).
    """
    height = size if height is None else height
    prof = {
        "driver": "GTiff",
        "width": size,
        "height": height,
        "count": 4,
        "dtype": "uint16",
        "crs": S2_CRS,
        "transform": s2_transform(),
        "nodata": 0,
        "tiled": True,
        "blockxsize": 256,
        "blockysize": 256,
        "compress": "deflate",
        **profile,
    }
    with rasterio.open(path, "w", **prof) as dst:
        for start in range(0, height, 1024):
            rows = slice(start, min(height, start + 1024))
            window = rasterio.windows.Window(0, start, size, rows.stop - start)
            dst.write(s2_array(size, seed, rows), window=window)
        dst.descriptions = ("B2", "B3", "B4", "B8")
        dst.update_tags(ACQUISITION_DATE="2020-06-01")
    return path


def s1_grid(size: int, cover: float = 0.6) -> tuple[Affine, int, int]:
    """Transform, width and height of the S1 scene: ~20 m pixels in EPSG:4326 over the
    upper-left ``cover`` fraction (per axis) of an S2 scene of ``size`` pixels."""
    x0, y0 = S2_ORIGIN
    extent = size * S2_RES * cover
    west, south, east, north = transform_bounds(S2_CRS, S1_CRS, x0, y0 - extent, x0 + extent, y0)
    res_y = 20.0 / 111_320.0  # about 20 m of latitude
    lat = (north + south) / 2
    res_x = res_y / np.cos(np.radians(lat))
    width = max(1, int(round((east - west) / res_x)))
    height = max(1, int(round((north - south) / res_y)))
    return Affine(res_x, 0, west, 0, -res_y, north), width, height


def s1_array(size: int, cover: float = 0.6, seed: int = 1, rows: slice | None = None) -> np.ndarray:
    """(2, rows, width) float32 VV, VH in dB of the S1 scene (all rows by default)."""
    tr, width, height = s1_grid(size, cover)
    rows = rows or slice(0, height)
    rng = np.random.default_rng([seed, rows.start])
    r = np.arange(rows.start, rows.stop)[:, None] + 0.5
    c = np.arange(width)[None, :] + 0.5
    lon, lat = tr.c + c * tr.a + 0 * r, tr.f + r * tr.e + 0 * c
    xs, ys = transform(S1_CRS, S2_CRS, lon.ravel(), lat.ravel())
    water = _is_water(np.asarray(xs), np.asarray(ys), size).reshape(lon.shape)
    ramp = 1.5 * np.sin(c / 43.0) + np.cos(r / 29.0)
    vv = np.where(water, -21.0, -7.0) + ramp + rng.normal(0, 0.3, water.shape)
    vh = vv - 7.0 + rng.normal(0, 0.3, water.shape)
    return np.stack([vv, vh]).astype(np.float32)


def write_s1(path: Path, size: int = 512, cover: float = 0.6, seed: int = 1) -> Path:
    """The S1-like scene as a tiled float32 GeoTIFF (NaN nodata), VV and VH in dB."""
    tr, width, height = s1_grid(size, cover)
    prof = {
        "driver": "GTiff",
        "width": width,
        "height": height,
        "count": 2,
        "dtype": "float32",
        "crs": S1_CRS,
        "transform": tr,
        "nodata": float("nan"),
        "tiled": True,
        "blockxsize": 256,
        "blockysize": 256,
        "compress": "deflate",
    }
    with rasterio.open(path, "w", **prof) as dst:
        for start in range(0, height, 1024):
            rows = slice(start, min(height, start + 1024))
            window = rasterio.windows.Window(0, start, width, rows.stop - start)
            dst.write(s1_array(size, cover, seed, rows), window=window)
        dst.descriptions = ("VV", "VH")
        dst.update_tags(ACQUISITION_DATE="2020-06-02", UNITS="dB")
    return path
