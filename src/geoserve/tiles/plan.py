"""Which part of a scene a map tile needs, cut so that its patches are the scene's own.

A tile covers a window of the scene (its bounds in the scene's CRS, one pixel wider on each
side for bilinear resampling): the *inner* window. The tile is predicted from a cut-out of the
scene around it (the *cut*), run as a request of its own. The cut is chosen so that every
patch whose output reaches the inner window is, pixel for pixel, a patch of the whole scene's
grid with the whole scene's neighbours:

- the cut starts on the scene's patch grid (a multiple of the stride ``S``), so the cut's patch
  ``j`` is the scene's patch ``j + offset``;
- it reaches far enough past the inner window that each patch covering an inner pixel lies
  entirely inside the cut (patch ``i`` covers ``[i*S - m, i*S - m + P)``, see
  :mod:`geoserve.raster.grid`) or crosses only the scene's own border, where the cut and the
  scene are filled alike; such a patch is never the cut's first or last, so its blending
  weights are those of the whole scene too.

So the tile's pixels are the whole-scene prediction's pixels (up to float rounding of other
batch sizes), and the cut's *exact* patches, those read entirely from the scene, are named by
their place on the scene's grid: :meth:`TilePlan.key`, the patch cache's key (the others by
the cut-out too, so the same tile asked again runs nothing).
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass

from affine import Affine
from rasterio.crs import CRS
from rasterio.warp import transform_bounds
from rasterio.windows import Window

from geoserve.tiles.mercator import WEB_MERCATOR, tile_bounds


@dataclass(frozen=True)
class SceneGeometry:
    """What tiling needs to know of a scene: its grid, and an identity for the cache."""

    identity: Hashable  # changes when the scene's content may have (path, mtime, size)
    crs: CRS
    transform: Affine
    width: int
    height: int
    minzoom: int = 0  # the lowest zoom predicted on demand (mercator.min_zoom)
    count: int = 1  # bands


@dataclass(frozen=True)
class TilePlan:
    """The windows of one tile over one scene (see the module docstring)."""

    inner: Window  # the scene pixels the tile is warped from
    cut: Window  # the cut-out run as a request (starts on the patch grid)
    offset: tuple[int, int]  # the scene's grid (row, col) of the cut's patch (0, 0)
    exact_rows: range  # the cut's grid rows whose patches are read entirely from the scene
    exact_cols: range
    identity: Hashable

    def key(self, row: int, col: int) -> Hashable:
        """The cache key of the cut's patch (row, col).

        An exact patch is named by its place on the scene's grid (any tile may reuse it);
        one filled at the cut's edge by this cut-out too (only the same tile reuses it).
        """
        if row in self.exact_rows and col in self.exact_cols:
            return (self.identity, row + self.offset[0], col + self.offset[1])
        cut = (self.cut.col_off, self.cut.row_off, self.cut.width, self.cut.height)
        return (self.identity, cut, row, col)

    @property
    def inner_in_cut(self) -> tuple[slice, slice]:
        """The inner window's rows and columns within the cut."""
        r = int(self.inner.row_off - self.cut.row_off)
        c = int(self.inner.col_off - self.cut.col_off)
        return slice(r, r + int(self.inner.height)), slice(c, c + int(self.inner.width))


def plan_tile(
    scene: SceneGeometry, z: int, x: int, y: int, patch_size: int, stride: int
) -> TilePlan | None:
    """The plan of tile ``(z, x, y)``, or None when the tile does not touch the scene."""
    try:
        west, south, east, north = transform_bounds(
            WEB_MERCATOR, scene.crs, *tile_bounds(z, x, y), densify_pts=21
        )
    except Exception:  # a tile outside the scene CRS's domain
        return None
    if not all(math.isfinite(v) for v in (west, south, east, north)):
        return None
    # the bounds' corners in pixels (north-up, south-up and rotated grids alike)
    inverse = ~scene.transform
    corners = [inverse @ (cx, cy) for cx in (west, east) for cy in (south, north)]
    xs, ys = [c for c, _ in corners], [r for _, r in corners]
    c0 = max(0, math.floor(min(xs)) - 1)
    r0 = max(0, math.floor(min(ys)) - 1)
    c1 = min(scene.width, math.ceil(max(xs)) + 1)
    r1 = min(scene.height, math.ceil(max(ys)) + 1)
    if c1 <= c0 or r1 <= r0:
        return None
    rows = _axis(r0, r1, scene.height, patch_size, stride)
    cols = _axis(c0, c1, scene.width, patch_size, stride)
    return TilePlan(
        inner=Window(c0, r0, c1 - c0, r1 - r0),
        cut=Window(cols[0], rows[0], cols[1] - cols[0], rows[1] - rows[0]),
        offset=(rows[0] // stride, cols[0] // stride),
        exact_rows=rows[2],
        exact_cols=cols[2],
        identity=scene.identity,
    )


def _axis(a0: int, a1: int, size: int, patch: int, stride: int) -> tuple[int, int, range]:
    """One axis: the cut ``[lo, hi)`` around ``[a0, a1)``, and its exact patch indices."""
    m = (patch - stride) // 2
    first = math.floor((a0 + m - patch) / stride) + 1  # the first patch reaching a0
    last = math.ceil((a1 + m) / stride) - 1  # the last patch reaching a1 - 1
    lo = max(0, math.floor((first * stride - m) / stride) * stride)
    hi = min(size, last * stride - m + patch)
    n = math.ceil((hi - lo) / stride)
    exact = [
        j
        for j in range(n)
        if (j * stride - m >= 0 or lo == 0) and (j * stride - m + patch <= hi - lo or hi == size)
    ]
    return lo, hi, range(exact[0], exact[-1] + 1) if exact else range(0)
