"""A seeded STAC catalogue of four Sentinel-2-L2A-like Items in two UTM zones, and the servers.

:func:`write_catalogue` writes, under a directory, four Items around 12°E 45°N, where UTM zones
32 and 33 meet: on two days each day has a western Item in EPSG:32632 and an eastern one in
EPSG:32633, overlapping across the zone line (so a bbox over the line needs both). Each Item
has ``green`` (B03) and ``nir`` (B08) at 10 m, ``swir16`` (B11) at 20 m and the scene classes
``scl`` at 20 m, each a Cloud-Optimized GeoTIFF with the ``proj`` and ``eo`` metadata public
catalogues give (hrefs are absolute, under ``base_url``), and an ``eo:cloud_cover``. The first
day is the clearer one; its western Item has a cloud (SCL 9) and a cloud shadow (SCL 3) the
second day sees through. Each Item has a lake (``nir`` below ``green``) in its lower half.

:func:`stac_api` runs a real STAC API server (``rustac serve``, from the package index) on
127.0.0.1 over the Items, in a collection ``sentinel-2-l2a``.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
import rasterio.shutil
from affine import Affine
from pyproj import Transformer

from tests.stac_items import COG, write_band

COLLECTION = "sentinel-2-l2a"
#: (asset key, band name, common name, metres)
BANDS = (
    ("green", "B03", "green", 10),
    ("nir", "B08", "nir", 10),
    ("swir16", "B11", "swir16", 20),
    ("scl", "SCL", None, 20),
)
#: A bbox (lon/lat) over the zone line that both of a day's Items cover together.
BBOX = (11.985, 44.996, 12.015, 45.004)
#: The days, clearest first by ``eo:cloud_cover``.
DAYS = ("2024-06-01", "2024-06-11")
SIZE = 256  # pixels at 10 m: 2.56 km a side
CLOUD = (slice(45, 60), slice(60, 90))  # SCL 9 in the first day's western Item (20 m pixels)
SHADOW = (slice(65, 75), slice(70, 80))  # SCL 3 there


@dataclass(frozen=True)
class Scene:
    """One Item of the catalogue: its id, day, CRS and top-left corner (metres)."""

    item_id: str
    day: str
    epsg: int
    x0: float
    y0: float
    cloud_cover: float
    seed: int


def scenes() -> list[Scene]:
    """The four Items: per day, a western one in zone 32 and an eastern one in zone 33."""
    out = []
    for d, day in enumerate(DAYS):
        for z, (epsg, lon) in enumerate(((32632, 11.972), (32633, 11.997))):
            x, y = Transformer.from_crs(4326, epsg, always_xy=True).transform(lon, 45.011)
            out.append(
                Scene(
                    f"S2_T{epsg - 32600}_{day.replace('-', '')}",
                    day,
                    epsg,
                    round(x, -1),
                    round(y, -1),
                    (5.0, 12.0)[z] + 40 * d,
                    10 * d + z + 1,
                )
            )
    return out


def band_data(scene: Scene, key: str) -> np.ndarray:
    """An Item's band: uint16 reflectance (ramps plus seeded noise), or uint8 scene classes."""
    rng = np.random.default_rng(scene.seed * 10 + [b[0] for b in BANDS].index(key))
    metres = dict((b[0], b[3]) for b in BANDS)[key]
    n = SIZE * 10 // metres
    if key == "scl":
        classes = rng.choice(np.array([4, 5, 6], dtype=np.uint8), (n, n))
        if scene.day == DAYS[0] and scene.epsg == 32632:
            classes[CLOUD] = 9
            classes[SHADOW] = 3
        return classes
    r, c = np.mgrid[0:n, 0:n] * (metres / 10)
    base = {"green": 900, "nir": 2600, "swir16": 1700}[key] + 300 * scene.seed
    values = base + 3 * r + 2 * c + rng.normal(0, 40, (n, n))
    if key == "nir":  # a lake: nir below green
        values[(r - 150) ** 2 + (c - 128) ** 2 < 40**2] -= 2400
    return values.clip(1, 10000).astype(np.uint16)


def write_catalogue(directory: Path, base_url: str) -> list[dict[str, Any]]:
    """The Items' band files under ``directory`` and their Items (``base_url`` serves it)."""
    items = []
    for s in scenes():
        assets: dict[str, Any] = {}
        for key, name, common, metres in BANDS:
            data = band_data(s, key)
            transform = Affine(metres, 0, s.x0, 0, -metres, s.y0)
            path = directory / s.item_id / f"{name}.tif"
            path.parent.mkdir(parents=True, exist_ok=True)
            plain = path.with_suffix(".plain.tif")
            write_band(plain, data, transform, crs=f"EPSG:{s.epsg}", nodata=0)
            rasterio.shutil.copy(plain, path, driver="COG", BLOCKSIZE=128)  # (with overviews)
            plain.unlink()
            band: dict[str, Any] = {"name": name}
            if common:
                band["common_name"] = common
            assets[key] = {
                "href": f"{base_url}/{s.item_id}/{name}.tif",
                "type": COG,
                "roles": ["data"],
                "eo:bands": [band],
                "proj:epsg": s.epsg,
                "proj:shape": list(data.shape),
                "proj:transform": list(transform)[:6],
                "raster:bands": [{"nodata": 0, "data_type": data.dtype.name}],
            }
        items.append(_item(s, assets))
    return items


def _item(s: Scene, assets: dict[str, Any]) -> dict[str, Any]:
    to_lonlat = Transformer.from_crs(s.epsg, 4326, always_xy=True)
    side = SIZE * 10
    ring = [(s.x0, s.y0), (s.x0 + side, s.y0), (s.x0 + side, s.y0 - side), (s.x0, s.y0 - side)]
    lonlat = [to_lonlat.transform(x, y) for x, y in ring]
    lons, lats = [p[0] for p in lonlat], [p[1] for p in lonlat]
    return {
        "type": "Feature",
        "stac_version": "1.0.0",
        "stac_extensions": [
            "https://stac-extensions.github.io/eo/v1.1.0/schema.json",
            "https://stac-extensions.github.io/projection/v1.1.0/schema.json",
            "https://stac-extensions.github.io/raster/v1.1.0/schema.json",
        ],
        "id": s.item_id,
        "collection": COLLECTION,
        "geometry": {"type": "Polygon", "coordinates": [[*map(list, lonlat), list(lonlat[0])]]},
        "bbox": [min(lons), min(lats), max(lons), max(lats)],
        "properties": {
            "datetime": f"{s.day}T10:20:00Z",
            "eo:cloud_cover": s.cloud_cover,
            "proj:epsg": s.epsg,
        },
        "links": [],
        "assets": assets,
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rustac() -> str:
    """The ``rustac`` command of this Python environment."""
    found = Path(sys.executable).with_name("rustac")
    return str(found) if found.exists() else shutil.which("rustac") or "rustac"


@contextlib.contextmanager
def stac_api(items: list[dict[str, Any]], directory: Path) -> Iterator[str]:
    """A real STAC API (``rustac serve``, memory backend) on 127.0.0.1 over ``items``.

    Yields its root URL.
    """
    collection = {
        "type": "Collection",
        "stac_version": "1.0.0",
        "id": COLLECTION,
        "description": "Sentinel-2 L2A-like test scenes",
        "license": "CC-BY-4.0",
        "extent": {
            "spatial": {"bbox": [[11.9, 44.9, 12.1, 45.1]]},
            "temporal": {"interval": [["2024-01-01T00:00:00Z", None]]},
        },
        "links": [],
    }
    (directory / "collection.json").write_text(json.dumps(collection))
    features = {"type": "FeatureCollection", "features": items}
    (directory / "items.json").write_text(json.dumps(features))
    port = _free_port()
    proc = subprocess.Popen(
        [rustac(), "serve", "--addr", f"127.0.0.1:{port}",
         str(directory / "collection.json"), str(directory / "items.json")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{url}/collections/{COLLECTION}", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    err = proc.stderr.read().decode() if proc.stderr else ""
                    raise RuntimeError(f"rustac serve did not start: {err[-2000:]}") from None
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


class Catalogue:
    """A served catalogue: its API's URL, the band files' directory, the Items."""

    def __init__(self, url: str, root: Path, items: list[dict[str, Any]]) -> None:
        self.url, self.root, self.items = url, root, items

    def search(self, **kw: Any) -> Any:
        """A search of :data:`BBOX` (by default from 2024-05-25 to 2024-06-20)."""
        from geoserve.stac_query import stac_search

        when = kw.pop("datetime", "2024-05-25/2024-06-20")
        return stac_search(self.url, COLLECTION, BBOX, when, **kw)

    def body(self, **kw: Any) -> dict[str, Any]:
        """The search as a request body's ``stac`` object."""
        return {k: v for k, v in self.search(**kw).to_json().items() if v is not None}


@contextlib.contextmanager
def served_catalogue(root: Path, host: str = "127.0.0.1") -> Iterator[Catalogue]:
    """The catalogue under ``root``: band files on a range server (hrefs naming ``host``),
    Items in a real STAC API."""
    from tests.conftest import serve_ranges

    with serve_ranges(root) as (base, _log):
        items = write_catalogue(root, base.replace("127.0.0.1", host))
        api = root / "api"
        api.mkdir(exist_ok=True)
        with stac_api(items, api) as url:
            yield Catalogue(url, root, items)
