"""Seeded STAC Items over small GeoTIFFs, laid out like public Sentinel-2 L2A and Sentinel-1 Items.

- :func:`write_s2_item`: one file per band, as Earth Search's Sentinel-2 L2A Items: ``blue``,
  ``green``, ``red``, ``nir`` at 10 m (the :mod:`tests.multimodal_scenes` S2 scene), ``nir08``,
  ``swir16``, ``swir22`` and the categorical ``scl`` at 20 m, plus a JPEG 2000 copy of ``red``
  and a PNG thumbnail (neither ever read). Hrefs are relative to the Item file.
- :func:`write_s1_item`: ``vv`` and ``vh`` as two files on the S1 scene's grid (EPSG:4326).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
from affine import Affine

from tests.multimodal_scenes import S1_CRS, S2_CRS, s1_array, s1_grid, s2_array, s2_transform

#: (asset key, band name, common name) of the 10 m bands, in the S2 scene's band order.
S2_10M = (
    ("blue", "B02", "blue"),
    ("green", "B03", "green"),
    ("red", "B04", "red"),
    ("nir", "B08", "nir"),
)
#: The 20 m bands.
S2_20M = (("nir08", "B8A", "nir08"), ("swir16", "B11", "swir16"), ("swir22", "B12", "swir22"))
COG = "image/tiff; application=geotiff; profile=cloud-optimized"
SCL_CLASSES = (4, 5, 6)  # vegetation, bare soil, water


def write_band(
    path: Path,
    data: np.ndarray,
    transform: Affine,
    crs: Any = S2_CRS,
    nodata: float | None = 0,
    **profile: Any,
) -> Path:
    """One (H, W) or (C, H, W) array as a GeoTIFF."""
    data = data[None] if data.ndim == 2 else data
    with rasterio.open(
        path,
        "w",
        driver="GTiff",
        width=data.shape[2],
        height=data.shape[1],
        count=data.shape[0],
        dtype=data.dtype.name,
        crs=crs,
        transform=transform,
        nodata=nodata,
        **profile,
    ) as dst:
        dst.write(data)
    return path


def twenty_m(size: int, seed: int = 7) -> np.ndarray:
    """(3, size/2, size/2) uint16 B8A, B11, B12: smooth ramps plus seeded noise."""
    rng = np.random.default_rng(seed)
    half = size // 2
    r, c = np.mgrid[0:half, 0:half]
    base = np.array([2500, 1800, 1200])[:, None, None] + 40 * r + 25 * c
    return (base + rng.normal(0, 30, (3, half, half))).clip(1, 10000).astype(np.uint16)


def scl(size: int, seed: int = 3) -> np.ndarray:
    """(size/2, size/2) uint8 scene classes drawn from :data:`SCL_CLASSES`."""
    rng = np.random.default_rng(seed)
    return rng.choice(np.array(SCL_CLASSES, dtype=np.uint8), (size // 2, size // 2))


def asset(
    href: str,
    name: str | None,
    common: str | None,
    media: str = COG,
    roles: tuple[str, ...] = ("data",),
    **extra: Any,
) -> dict[str, Any]:
    """One asset of one band."""
    out: dict[str, Any] = {"href": href, "type": media, "roles": list(roles), **extra}
    if name is not None:
        out["eo:bands"] = [{"name": name, **({"common_name": common} if common else {})}]
    return out


def item(
    assets: dict[str, Any],
    datetime: str | None = "2020-06-01T10:21:01Z",
    item_id: str = "S2B_33UUU_20200601_0_L2A",
    **extra: Any,
) -> dict[str, Any]:
    """A STAC Item around ``assets``."""
    return {
        "type": "Feature",
        "stac_version": "1.0.0",
        "stac_extensions": [],
        "id": item_id,
        "geometry": None,
        "bbox": [0, 0, 0, 0],
        "properties": {"datetime": datetime},
        "links": [],
        "assets": assets,
        **extra,
    }


def write_item(path: Path, data: dict[str, Any]) -> Path:
    """``data`` as the Item file ``path``."""
    path.write_text(json.dumps(data, indent=1))
    return path


def write_s2_item(
    directory: Path,
    size: int = 64,
    name: str = "s2_item.json",
    datetime: str | None = "2020-06-01T10:21:01Z",
) -> Path:
    """The S2 Item and its band files in ``directory``; returns the Item's path."""
    directory.mkdir(parents=True, exist_ok=True)
    ten, twenty = s2_array(size), twenty_m(size)
    t = s2_transform()
    t20 = Affine(20.0, 0.0, t.c, 0.0, -20.0, t.f)
    assets: dict[str, Any] = {}
    for i, (key, band, common) in enumerate(S2_10M):
        write_band(directory / f"{band}.tif", ten[i], t)
        assets[key] = asset(f"{band}.tif", band, common)
    for i, (key, band, common) in enumerate(S2_20M):
        write_band(directory / f"{band}.tif", twenty[i], t20)
        assets[key] = asset(f"./{band}.tif", band, common)
    write_band(directory / "SCL.tif", scl(size), t20)
    names = ("vegetation", "bare soil", "water")
    classes = [{"value": v, "name": n} for v, n in zip(SCL_CLASSES, names, strict=True)]
    assets["scl"] = asset("SCL.tif", None, None, **{"classification:classes": classes})
    assets["red-jp2"] = asset("B04.jp2", "B04", "red", media="image/jp2")
    assets["thumbnail"] = asset("thumb.png", None, None, media="image/png", roles=("thumbnail",))
    return write_item(directory / name, item(assets, datetime))


def write_s1_item(
    directory: Path, size: int = 64, cover: float = 0.6, name: str = "s1_item.json"
) -> Path:
    """VV and VH as two float32 files (NaN nodata) of the S1 scene, and their Item."""
    directory.mkdir(parents=True, exist_ok=True)
    tr, _, _ = s1_grid(size, cover)
    data = s1_array(size, cover)
    assets = {}
    for i, pol in enumerate(("VV", "VH")):
        write_band(directory / f"{pol}.tif", data[i], tr, crs=S1_CRS, nodata=float("nan"))
        assets[pol.lower()] = asset(f"{pol}.tif", pol, None)
    return write_item(
        directory / name, item(assets, "2020-06-02T05:00:00Z", item_id="S1A_IW_GRDH_20200602")
    )
