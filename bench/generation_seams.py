"""Seams of generated products: adjacent-pixel differences across patch borders and inside.

For ``bench.generation``. A patch grid of stride ``S`` puts its cores at ``[k S, (k + 1) S)``
(``raster/grid.py``): with the ``center`` blend the pixels on either side of ``k S`` come from
two patches, with ``none`` (``S`` = patch size) the patch edges are there too, and with
``cosine`` the two patches' weights cross there, in the middle of their overlap band. So the
*border* pairs are the horizontally and vertically adjacent pixels ``(k S - 1, k S)`` for
every core boundary inside the scene; every other adjacent pair is *inside*. The seam ratio is
the mean difference over border pairs divided by the mean over inside pairs: 1.0 means a
border looks like any other pixel step, above 1 a visible line.

- float products (``s1grd`` ...): mean ``|a - b|`` over the bands;
- class maps (``lulc``): the share of pairs whose classes differ.

A decoder's output has structure of its own on the token grid (TerraMind's UNet works on
4 x 4 pixel blocks, its input pixel-unshuffled by 4, so pixel steps at some offsets inside a
16-pixel token are systematically larger than at others), and core boundaries all sit on that
grid. So besides
the plain ratio, :func:`seam_stats` gives a *grid-matched* one: border pairs over the inside
pairs at the same place in the token grid (``(i, i + 1)`` with ``i + 1`` a multiple of 16
that is no core boundary), which compares like with like.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
from numpy.typing import NDArray
from rasterio.transform import from_origin

#: Pixels per TerraMind token side: the grid the grid-matched control pairs sit on.
TOKEN = 16


def border_mask(length: int, stride: int) -> NDArray[np.bool_]:
    """For the ``length - 1`` adjacent pairs along one axis: True where the pair
    ``(i, i + 1)`` straddles a core boundary (``i + 1`` a multiple of ``stride``)."""
    if stride < 1:
        raise ValueError(f"stride must be a positive integer, not {stride!r}")
    nxt = np.arange(1, length)
    return np.asarray(nxt % stride == 0)


def control_mask(length: int, stride: int, token: int = TOKEN) -> NDArray[np.bool_]:
    """The grid-matched inside pairs along one axis: ``i + 1`` a multiple of ``token`` but
    not of ``stride``."""
    nxt = np.arange(1, length)
    return np.asarray((nxt % token == 0) & (nxt % stride != 0))


def seam_stats(values: NDArray[Any], stride: int, classes: bool = False) -> dict[str, float]:
    """Border and inside differences of a ``(bands, H, W)`` or ``(H, W)`` product.

    Returns ``border``, ``inside`` and their ``ratio`` over both directions together,
    ``ratio_h`` / ``ratio_v`` (pairs across vertical borders, i.e. horizontal neighbours, and
    across horizontal ones), ``control`` (the grid-matched inside pairs, :func:`control_mask`)
    and ``ratio_grid`` (border over control; NaN where the scene has no control pair), and
    ``border_pairs``. Pairs touching a non-finite value are left out.

    Raises:
        ValueError: a scene with no core boundary inside it (one patch wide and high).
    """
    arr = np.asarray(values)
    if arr.ndim == 2:
        arr = arr[None]
    _, height, width = arr.shape
    if height <= stride and width <= stride:
        raise ValueError(f"a {height} x {width} scene has no patch border at stride {stride}")

    def pairs(a: NDArray[Any], b: NDArray[Any]) -> NDArray[np.float64]:
        if classes:
            changed: NDArray[np.float64] = (a != b).astype(np.float64)
            return changed
        diff: NDArray[np.float64] = np.abs(a.astype(np.float64) - b.astype(np.float64))
        diff[~np.isfinite(diff)] = np.nan
        return diff

    horiz = pairs(arr[:, :, 1:], arr[:, :, :-1])  # (bands, H, W - 1)
    vert = pairs(arr[:, 1:, :], arr[:, :-1, :])  # (bands, H - 1, W)
    h_border = np.broadcast_to(border_mask(width, stride)[None, None, :], horiz.shape)
    v_border = np.broadcast_to(border_mask(height, stride)[None, :, None], vert.shape)

    def mean(x: NDArray[np.float64]) -> float:
        x = x[np.isfinite(x)]
        return float(x.mean()) if x.size else math.nan

    def ratio(border: float, inside: float) -> float:
        if math.isnan(border) or math.isnan(inside):
            return math.nan
        if inside == 0:
            return 1.0 if border == 0 else math.inf
        return border / inside

    out: dict[str, float] = {}
    b_all = np.concatenate([horiz[h_border], vert[v_border]])
    i_all = np.concatenate([horiz[~h_border], vert[~v_border]])
    out["border"], out["inside"] = mean(b_all), mean(i_all)
    out["ratio"] = ratio(out["border"], out["inside"])
    out["ratio_h"] = ratio(mean(horiz[h_border]), mean(horiz[~h_border]))
    out["ratio_v"] = ratio(mean(vert[v_border]), mean(vert[~v_border]))
    h_ctrl = np.broadcast_to(control_mask(width, stride)[None, None, :], horiz.shape)
    v_ctrl = np.broadcast_to(control_mask(height, stride)[None, :, None], vert.shape)
    out["control"] = mean(np.concatenate([horiz[h_ctrl], vert[v_ctrl]]))
    out["ratio_grid"] = ratio(out["border"], out["control"])
    out["border_pairs"] = float(b_all.size)
    return {k: (round(v, 5) if math.isfinite(v) else v) for k, v in out.items()}


def write_s2l2a(path: Path, height: int, width: int, seed: int = 0) -> Path:
    """A 12-band Sentinel-2 L2A-like uint16 scene on a UTM grid (10 m), seeded.

    Values are smooth per band (a few broad waves, reflectance 0.02 to 0.4 x 10000) plus a
    little pixel noise, so neighbouring pixels differ the way a real scene's do and any step
    at a patch border comes from the model, not from the input.
    """
    rng = np.random.default_rng(seed)
    rows = np.arange(height)[:, None]
    cols = np.arange(width)[None, :]
    bands = []
    for _ in range(12):
        fy, fx = rng.uniform(0.005, 0.03, 2)
        py, px = rng.uniform(0, 2 * np.pi, 2)
        wave = np.sin(rows * fy * 2 * np.pi + py) * np.cos(cols * fx * 2 * np.pi + px)
        band = 2100 + 1700 * wave + rng.normal(0, 40, (height, width))
        bands.append(np.clip(band, 200, 4000))
    data = np.stack(bands).astype(np.uint16)
    profile = {
        "driver": "GTiff",
        "height": height,
        "width": width,
        "count": 12,
        "dtype": "uint16",
        "crs": "EPSG:32633",
        "transform": from_origin(300000, 5800000, 10, 10),
    }
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(data)
    return path
