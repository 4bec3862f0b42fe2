"""The map page in a real headless browser (Debian's chromium, driven by Playwright)."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
import torch
from rasterio.io import MemoryFile
from torch import nn

from tests.conftest import LAKE, RGB, processors_of, write_geotiff
from tests.server.conftest import running_server, serve_subprocess
from tests.server.test_tiles import LAND, WATER

#: The browser: Debian's chromium package (scripts/setup.sh installs it where it can).
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DOCS = Path(__file__).resolve().parents[2] / "docs"


def water_point(code: int = 1) -> tuple[float, float]:
    """(lat, lon) of a pixel deep inside the lake (all water 20 pixels around; ``code=0``:
    deep inside the land)."""
    from geoserve import Engine

    water = Engine("demo-water").generate_image(LAKE, out_format="tensor").outputs.tensor[0]
    r = 20  # all of the class in a (2r + 1)^2 square: summed-area table
    table = np.pad((water.numpy() == code).astype(np.int64), ((1, 0), (1, 0))).cumsum(0).cumsum(1)
    side = 2 * r + 1
    sums = table[side:, side:] - table[:-side, side:] - table[side:, :-side] + table[:-side, :-side]
    rows, cols = np.nonzero(sums == side * side)
    rows, cols = rows + r, cols + r
    i = len(rows) // 2
    with rasterio.open(LAKE) as src:
        x, y = src.transform @ (cols[i] + 0.5, rows[i] + 0.5)
        lon, lat = rasterio.warp.transform(src.crs, "EPSG:4326", [x], [y])
    return lat[0], lon[0]


#: Every text the page's status line showed, in ``window.statuses`` (installed before use).
RECORD_STATUS = """() => { window.statuses = [];
  const s = document.getElementById('status');
  new MutationObserver(() => window.statuses.push(s.textContent))
    .observe(s, { childList: true, characterData: true, subtree: true }); }"""
#: The page settled after an upload: tiles shown, or an error on the status line (its
#: message in, not "…" while a failed tile's message is fetched).
SETTLED = """() => { const s = document.getElementById('status'), text = s.textContent;
  return (s.className == 'error' && !text.endsWith('…')) ||
    text.startsWith('Prediction tiles shown'); }"""


@contextmanager
def map_page(url: str) -> Iterator[Any]:
    """The page of the server at ``url`` in headless chromium, once its legend is drawn."""
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), (
        "the browser test needs Debian's chromium (apt-get install chromium)"
    )
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 700})
            page.goto(url + "/")
            page.wait_for_function("() => document.querySelectorAll('#legend .row').length > 0")
            page.evaluate(RECORD_STATUS)
            yield page
        finally:
            browser.close()


def screen_point(page: Any, lat: float, lon: float) -> tuple[int, int]:
    """Where (lat, lon) is on the page's screenshot."""
    x, y = page.evaluate(
        f"() => {{ const p = window.geoserveMap.latLngToContainerPoint([{lat}, {lon}]);"
        " const m = document.getElementById('map').getBoundingClientRect();"
        " return [Math.round(p.x + m.left), Math.round(p.y + m.top)]; }"
    )
    return x, y


def test_the_page_uploads_a_scene_and_shows_its_prediction_tiles(tmp_path):
    lat, lon = water_point()
    land_lat, land_lon = water_point(0)
    with (
        running_server(model="demo-water", output_dir=tmp_path, ui=True) as url,
        map_page(url) as page,
    ):
        requested: list[str] = []
        page.on("request", lambda r: requested.append(r.url))
        legend = page.inner_text("#legend")
        drawn = page.eval_on_selector_all("#legend input", "(boxes) => boxes.map(b => b.checked)")
        page.set_input_files("#file", str(LAKE))
        page.wait_for_function(SETTLED, timeout=120_000)
        page.fill("#opacity", "100")
        page.dispatch_event("#opacity", "input")
        page.wait_for_timeout(300)
        water, land = screen_point(page, lat, lon), screen_point(page, land_lat, land_lon)
        shot = page.screenshot()
        if os.environ.get("GEOSERVE_UPDATE_SCREENSHOT"):  # docs/serving.md's picture
            page.fill("#opacity", "60")
            page.dispatch_event("#opacity", "input")
            page.wait_for_timeout(300)
            (DOCS / "map_page.png").write_bytes(page.screenshot())
        controls = page.inner_text(".leaflet-control-layers")
        scale = page.inner_text(".leaflet-control-scale")
        statuses = page.evaluate("() => window.statuses")
        # below the zoom of on-demand tiles: no prediction, and the page says why
        zmin = page.evaluate("() => window.geoserveMap.getZoom()")
        page.evaluate(f"() => window.geoserveMap.setZoom({zmin - 2})")
        page.wait_for_function(
            "() => document.getElementById('status').textContent.includes('zoom in')"
        )
        below = page.inner_text("#status")
        # the confidence view: its ramp legend, not the classes'
        page.select_option("#kind", "confidence")
        page.evaluate(f"() => window.geoserveMap.setZoom({zmin})")
        page.wait_for_function(SETTLED, timeout=120_000)
        views = page.evaluate(
            "() => [document.getElementById('legend').hidden, "
            "document.getElementById('ramp').hidden, "
            "getComputedStyle(document.getElementById('ramp-bar')).backgroundImage]"
        )
        ramp = page.inner_text("#ramp")
    assert legend.split() == ["not", "water", "water"]
    assert drawn == [False, True]  # a binary map's background is not drawn over the scene
    assert requested, "the page made no requests"
    assert all(u.startswith(url) or u.startswith(("data:", "blob:")) for u in requested), [
        u for u in requested if not u.startswith(url)
    ]
    assert any("/v1/tiles/" in u and "kind=classes&hide=0" in u for u in requested)
    with MemoryFile(shot) as mem, mem.open() as img:
        pixels = img.read()
    x, y = water
    assert tuple(pixels[:3, y, x]) == WATER, (water, pixels[:3, y, x])
    x, y = land
    assert tuple(pixels[:3, y, x]) != LAND, land  # the scene itself shows through
    name = re.escape(LAKE.name)
    progress = [
        s
        for s in statuses
        if re.fullmatch(
            rf"Predicting tiles for {name}: \d+ of \d+ done, \d+ pending \(zoom \d+\)…", s
        )
    ]
    assert progress, statuses  # the tiles being computed were counted
    assert re.fullmatch(rf"Prediction tiles shown for {name} \(zoom \d+\)\.", statuses[-1]), (
        statuses
    )
    assert "Scene (true colour)" in controls
    assert "Prediction" in controls
    assert re.fullmatch(r"\d+ (k?m)", scale.strip()), scale  # a metric scale bar
    assert below == (
        f"{LAKE.name}: the prediction is drawn from zoom {zmin} (now {zmin - 2}): zoom in to "
        f"{zmin}, or Run the whole scene."
    )
    legend_hidden, ramp_hidden, gradient = views
    assert legend_hidden
    assert not ramp_hidden
    assert gradient.startswith("linear-gradient(to right, rgb(68, 1, 84)"), gradient  # viridis
    assert ramp.split() == ["50", "%", "confidence", "100", "%"]


def test_an_upload_the_model_cannot_read_shows_the_servers_message(tmp_path):
    with (
        running_server(model="demo-water", output_dir=tmp_path, ui=True) as url,
        map_page(url) as page,
    ):
        page.set_input_files("#file", str(RGB))
        page.wait_for_function(SETTLED, timeout=60_000)  # (tiles shown, or an error)
        shown, style = page.inner_text("#status"), page.get_attribute("#status", "class")
    assert shown.startswith(
        f"Upload of {RGB.name} failed: upload '{RGB.name}' has 3 bands; band index 3 (0-based) "
        "does not exist; model 'demo-water' takes a 13-band Sentinel-2 L1C stack"
    ), shown
    assert style == "error"


def test_failing_prediction_tiles_show_the_servers_message(tmp_path, register_model):
    class Broken(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("the weights are all NaN (a test)")

    name = register_model("test-seg-broken-tiles", Broken, *processors_of("test-seg"))
    data = np.random.default_rng(0).integers(0, 400, (3, 256, 256)).astype(np.uint16)
    scene = write_geotiff(tmp_path / "field.tif", data)
    with (
        running_server(model=name, output_dir=tmp_path / "out", ui=True, warmup=False) as url,
        map_page(url) as page,
    ):
        page.set_input_files("#file", str(scene))
        page.wait_for_function(SETTLED, timeout=120_000)
        shown, style = page.inner_text("#status"), page.get_attribute("#status", "class")
    assert re.match(r"Prediction failed for field\.tif \(\d+ of \d+ tiles\): ", shown), shown
    assert "the weights are all NaN (a test)" in shown  # the server's own message
    assert style == "error"


def test_the_server_prints_the_pages_address_and_warns_when_uploads_are_off():
    with serve_subprocess("--ui", model="demo-water") as (url, proc), map_page(url) as page:
        shown = page.inner_text("#status")
        disabled = page.is_disabled("#file")
    err = proc.stderr.read() if proc.stderr else ""
    assert f"map page: {url}/" in err, err
    assert "--ui without --output-dir: the map page cannot upload scenes" in err, err
    assert shown == "Uploads are off on this server (it was started without --output-dir)."
    assert disabled
