"""WebMercator (EPSG:3857) XYZ tiles: bounds, transforms and the zoom a scene needs.

Tile ``(z, x, y)`` is one of ``2**z x 2**z`` squares of 256 x 256 pixels over the WebMercator
square, ``x`` from west, ``y`` from north (the OpenStreetMap / Leaflet convention).
"""

from __future__ import annotations

import math

from affine import Affine
from rasterio.crs import CRS
from rasterio.transform import array_bounds
from rasterio.warp import transform_bounds

from geoserve.errors import InputError

TILE = 256
WEB_MERCATOR = CRS.from_epsg(3857)
#: Half the side of the WebMercator square, in metres.
HALF = 20037508.342789244
#: Deepest zoom level served.
MAX_ZOOM = 24
#: A tile is predicted on demand when its pixels are at most this many scene pixels wide:
#: at the lowest such zoom a tile covers about 4 x 256 = 1,024 scene pixels a side, about
#: (1024 / stride + 2)**2 patches (49 at stride 192), which one request runs in seconds on a
#: GPU and reuses at every deeper zoom through the patch cache.
MAX_SCENE_PIXELS_PER_TILE_PIXEL = 4


def check_tile(z: int, x: int, y: int) -> None:
    """Raises InputError when ``(z, x, y)`` is not a tile."""
    if not 0 <= z <= MAX_ZOOM:
        raise InputError(f"zoom {z}: must be 0..{MAX_ZOOM}")
    n = 1 << z
    if not (0 <= x < n and 0 <= y < n):
        raise InputError(f"tile {z}/{x}/{y}: x and y must be 0..{n - 1} at zoom {z}")


def tile_bounds(z: int, x: int, y: int) -> tuple[float, float, float, float]:
    """(west, south, east, north) of the tile in EPSG:3857 metres."""
    size = 2 * HALF / (1 << z)
    west = -HALF + x * size
    north = HALF - y * size
    return west, north - size, west + size, north


def tile_transform(z: int, x: int, y: int) -> Affine:
    """The tile's 256 x 256 pixel grid in EPSG:3857."""
    west, _, east, north = tile_bounds(z, x, y)
    res = (east - west) / TILE
    return Affine(res, 0.0, west, 0.0, -res, north)


def lonlat_bounds(crs: CRS, bounds: tuple[float, float, float, float]) -> list[float]:
    """``bounds`` in ``crs`` as [west, south, east, north] in degrees (EPSG:4326)."""
    return [round(v, 7) for v in transform_bounds(crs, "EPSG:4326", *bounds, densify_pts=21)]


def min_zoom(crs: CRS, transform: Affine, width: int, height: int) -> int:
    """The lowest zoom whose tiles are predicted on demand for this scene.

    The zoom at which a tile pixel spans at most :data:`MAX_SCENE_PIXELS_PER_TILE_PIXEL`
    scene pixels, the scene's pixel size taken in metres at its centre.

    Raises:
        InputError: the scene's pixels are finer than the deepest zoom shows, or it lies
            outside WebMercator.
    """
    try:
        west, south, east, north = transform_bounds(
            crs, WEB_MERCATOR, *array_bounds(height, width, transform), densify_pts=21
        )
    except Exception:  # (pyproj: no WebMercator for it, e.g. a polar grid)
        west = south = east = north = math.nan
    # the scene's width in WebMercator metres over its pixels: its pixel size as a map sees it
    merc_pixel = min((east - west) / max(width, 1), (north - south) / max(height, 1))
    if not math.isfinite(merc_pixel) or merc_pixel <= 0 or north <= -HALF or south >= HALF:
        raise InputError("the scene does not lie within WebMercator's map (85 S to 85 N)")
    tile_pixel_at_0 = 2 * HALF / TILE
    z = math.ceil(math.log2(tile_pixel_at_0 / (MAX_SCENE_PIXELS_PER_TILE_PIXEL * merc_pixel)))
    if z > MAX_ZOOM:
        raise InputError(
            f"the scene's pixels ({merc_pixel:.3g} m on the map) are finer than map tiles show "
            f"at zoom {MAX_ZOOM}; it cannot be tiled"
        )
    return max(0, z)
