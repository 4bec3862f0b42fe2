"""A tile's pixels: values warped from the scene's grid onto the tile, coloured, as PNG."""

from __future__ import annotations

import warnings
from collections.abc import Collection, Sequence

import numpy as np
from affine import Affine
from numpy.typing import NDArray
from rasterio.crs import CRS
from rasterio.enums import Resampling
from rasterio.errors import NotGeoreferencedWarning
from rasterio.io import MemoryFile
from rasterio.warp import reproject

from geoserve.tiles.mercator import TILE, WEB_MERCATOR, tile_transform

#: Class map value where nothing is known (nodata input, outside the scene).
NO_CLASS = 255
#: matplotlib's colour ramp of confidence tiles (and of the map page's legend for them).
RAMP = "viridis"


def warp_to_tile(
    values: NDArray[np.float32],
    transform: Affine,
    crs: CRS,
    z: int,
    x: int,
    y: int,
    resampling: Resampling,
) -> NDArray[np.float32]:
    """(bands, h, w) float32 values on the scene's grid (NaN: none) warped onto the tile.

    Returns (bands, 256, 256), NaN where the scene has nothing.
    """
    out = np.full((values.shape[0], TILE, TILE), np.nan, dtype=np.float32)
    for band in range(values.shape[0]):
        reproject(
            np.ascontiguousarray(values[band], dtype=np.float32),
            out[band],
            src_transform=transform,
            src_crs=crs,
            src_nodata=np.nan,
            dst_transform=tile_transform(z, x, y),
            dst_crs=WEB_MERCATOR,
            dst_nodata=np.nan,
            resampling=resampling,
        )
    return out


def classes_rgba(
    classes: NDArray[np.float32],
    colors: Sequence[Sequence[int]],
    alpha: int = 255,
    hidden: Collection[int] = (),
) -> NDArray[np.uint8]:
    """(256, 256) class codes (NaN: none) as (4, 256, 256) RGBA in the model's colours.

    The classes in ``hidden`` are drawn transparent (a background class over the scene).
    """
    table = np.zeros((256, 4), dtype=np.uint8)
    for i, rgb in enumerate(colors[:255]):
        table[i, :3] = tuple(rgb)[:3]
        table[i, 3] = 0 if i in hidden else alpha
    codes = np.where(np.isfinite(classes), classes, NO_CLASS).astype(np.uint8)
    return np.moveaxis(table[codes], -1, 0)


def _ramp_lut() -> NDArray[np.uint8]:
    from matplotlib import colormaps

    return (colormaps[RAMP](np.linspace(0, 1, 256)) * 255).astype(np.uint8)


def ramp_stops(count: int = 11) -> list[str]:
    """``count`` colours evenly along the ramp of :func:`ramp_rgba`, as CSS ``#rrggbb``."""
    lut = _ramp_lut()
    picks = np.linspace(0, 255, count).round().astype(int)
    return ["#{:02x}{:02x}{:02x}".format(*lut[i, :3]) for i in picks]


def ramp_rgba(values: NDArray[np.float32], lo: float = 0.0, hi: float = 1.0) -> NDArray[np.uint8]:
    """(256, 256) values (NaN: none) as RGBA on matplotlib's :data:`RAMP` from lo to hi."""
    lut = _ramp_lut()
    ok = np.isfinite(values)
    idx = np.clip((np.where(ok, values, lo) - lo) / max(hi - lo, 1e-12), 0, 1) * 255
    rgba = lut[idx.astype(np.uint8)]
    rgba[..., 3] = np.where(ok, 255, 0)
    return np.moveaxis(rgba, -1, 0)


def true_colour_rgba(
    rgb: NDArray[np.float32], lo: Sequence[float], hi: Sequence[float]
) -> NDArray[np.uint8]:
    """(3, 256, 256) red, green, blue values (NaN: none) stretched from lo to hi per band."""
    out = np.zeros((4, *rgb.shape[1:]), dtype=np.uint8)
    ok = np.isfinite(rgb).all(axis=0)
    for i in range(3):
        band = np.where(ok, rgb[i], lo[i])
        out[i] = np.clip((band - lo[i]) / max(hi[i] - lo[i], 1e-12), 0, 1) * 255
    out[3] = np.where(ok, 255, 0)
    return out


def png(rgba: NDArray[np.uint8]) -> bytes:
    """(4, h, w) RGBA as PNG bytes (GDAL's PNG driver)."""
    profile = {
        "driver": "PNG",
        "width": rgba.shape[2],
        "height": rgba.shape[1],
        "count": 4,
        "dtype": "uint8",
    }
    with warnings.catch_warnings(), MemoryFile() as mem:
        warnings.simplefilter("ignore", NotGeoreferencedWarning)  # a picture: no grid
        with mem.open(**profile) as dst:
            dst.write(rgba)
        return bytes(mem.read())


#: A transparent tile.
EMPTY = png(np.zeros((4, TILE, TILE), dtype=np.uint8))
