"""The map page in a real headless browser (Debian's chromium, driven by Playwright)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import rasterio
from rasterio.io import MemoryFile

from tests.conftest import LAKE
from tests.server.conftest import running_server
from tests.server.test_tiles import WATER

#: The browser: Debian's chromium package (scripts/setup.sh installs it where it can).
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DOCS = Path(__file__).resolve().parents[2] / "docs"


def water_point() -> tuple[float, float]:
    """(lat, lon) of a pixel deep inside the lake (all water 20 pixels around)."""
    from geoserve import Engine

    water = Engine("demo-water").generate_image(LAKE, out_format="tensor").outputs.tensor[0]
    r = 20  # all water in a (2r + 1)^2 square: summed-area table
    table = np.pad((water.numpy() == 1).astype(np.int64), ((1, 0), (1, 0))).cumsum(0).cumsum(1)
    side = 2 * r + 1
    sums = table[side:, side:] - table[:-side, side:] - table[side:, :-side] + table[:-side, :-side]
    rows, cols = np.nonzero(sums == side * side)
    rows, cols = rows + r, cols + r
    i = len(rows) // 2
    with rasterio.open(LAKE) as src:
        x, y = src.transform @ (cols[i] + 0.5, rows[i] + 0.5)
        lon, lat = rasterio.warp.transform(src.crs, "EPSG:4326", [x], [y])
    return lat[0], lon[0]


def test_the_page_uploads_a_scene_and_shows_its_prediction_tiles(tmp_path):
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), (
        "the browser test needs Debian's chromium (apt-get install chromium)"
    )
    lat, lon = water_point()
    with (
        running_server(model="demo-water", output_dir=tmp_path, ui=True) as url,
        sync_playwright() as pw,
    ):
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1100, "height": 700})
        requested: list[str] = []
        page.on("request", lambda r: requested.append(r.url))
        page.goto(url + "/")
        page.wait_for_function("() => document.querySelectorAll('#legend .row').length == 2")
        legend = page.inner_text("#legend")
        page.set_input_files("#file", str(LAKE))
        page.wait_for_function(
            "() => document.getElementById('status').textContent.startsWith('Prediction tiles')",
            timeout=120_000,
        )
        page.fill("#opacity", "100")
        page.dispatch_event("#opacity", "input")
        page.wait_for_timeout(300)
        point = page.evaluate(
            f"(() => {{ const p = window.geoserveMap.latLngToContainerPoint([{lat}, {lon}]);"
            " const m = document.getElementById('map').getBoundingClientRect();"
            " return [Math.round(p.x + m.left), Math.round(p.y + m.top)]; })()"
        )
        shot = page.screenshot()
        if os.environ.get("GEOSERVE_UPDATE_SCREENSHOT"):  # docs/serving.md's picture
            page.fill("#opacity", "60")
            page.dispatch_event("#opacity", "input")
            page.wait_for_timeout(300)
            (DOCS / "map_page.png").write_bytes(page.screenshot())
        browser.close()
    assert legend.split() == ["not", "water", "water"]
    assert requested, "the page made no requests"
    assert all(u.startswith(url) or u.startswith(("data:", "blob:")) for u in requested), [
        u for u in requested if not u.startswith(url)
    ]
    assert any("/v1/tiles/" in u and "kind=classes" in u for u in requested)
    with MemoryFile(shot) as mem, mem.open() as img:
        pixels = img.read()
    x, y = point
    assert tuple(pixels[:3, y, x]) == WATER, (point, pixels[:3, y, x])
