"""Map tiles of predictions, computed on demand, over a real uvicorn on 127.0.0.1."""

from __future__ import annotations

import asyncio
import math
import os
import re

import httpx
import numpy as np
import pytest
import rasterio
from affine import Affine
from rasterio.enums import Resampling
from rasterio.io import MemoryFile
from rasterio.warp import reproject, transform
from rasterio.windows import Window

from geoserve import Engine
from geoserve.tiles.mercator import WEB_MERCATOR, min_zoom, tile_transform
from geoserve.tiles.plan import SceneGeometry, plan_tile
from tests.conftest import LAKE, serve_ranges, write_geotiff
from tests.server.conftest import running_server

WATER = (31, 120, 220)
LAND = (230, 230, 220)
TWO_KINDS = ("classes", "confidence")


def tile_of(lon: float, lat: float, z: int) -> tuple[int, int]:
    n = 1 << z
    x = int((lon + 180) / 360 * n)
    y = int((1 - math.asinh(math.tan(math.radians(lat))) / math.pi) / 2 * n)
    return x, y


def lake_centre() -> tuple[float, float]:
    with rasterio.open(LAKE) as src:
        cx, cy = src.transform @ (src.width / 2, src.height / 2)
        lon, lat = transform(src.crs, "EPSG:4326", [cx], [cy])
    return lon[0], lat[0]


def lake_zoom() -> int:
    with rasterio.open(LAKE) as src:
        return min_zoom(src.crs, src.transform, src.width, src.height)


def rgba(png: bytes) -> np.ndarray:
    with MemoryFile(png) as mem, mem.open() as ds:
        assert ds.driver == "PNG"
        return ds.read()


def codes(tile: np.ndarray) -> np.ndarray:
    """Class codes of a classes tile (-1: transparent)."""
    out = np.full(tile.shape[1:], -1)
    for code, rgb in enumerate((LAND, WATER)):
        out[(tile[:3] == np.array(rgb)[:, None, None]).all(axis=0) & (tile[3] > 0)] = code
    assert ((out >= 0) == (tile[3] > 0)).all()  # every drawn pixel has a class colour
    return out


@pytest.fixture(scope="module")
def full_classes() -> np.ndarray:
    out = Engine("demo-water").generate_image(LAKE, out_format="tensor").outputs
    return out.tensor[0].numpy()


def test_a_tile_equals_the_whole_scene_prediction_on_its_grid(tmp_path, full_classes):
    z = lake_zoom() + 1
    x, y = tile_of(*lake_centre(), z)
    with running_server(model="demo-water", allowed_input_dirs=[LAKE.parent]) as url:
        resp = httpx.get(f"{url}/v1/tiles/{z}/{x}/{y}.png", params={"source": str(LAKE)})
        assert resp.status_code == 200, resp.text
        assert resp.headers["content-type"] == "image/png"
        conf = httpx.get(
            f"{url}/v1/tiles/{z}/{x}/{y}.png", params={"source": str(LAKE), "kind": "confidence"}
        )
        assert conf.status_code == 200
        true_colour = httpx.get(
            f"{url}/v1/tiles/{z}/{x}/{y}.png", params={"source": str(LAKE), "kind": "input"}
        )
        outside = httpx.get(f"{url}/v1/tiles/{z}/0/0.png", params={"source": str(LAKE)})
    got = codes(rgba(resp.content))
    want = np.full((256, 256), np.nan, dtype=np.float32)
    with rasterio.open(LAKE) as src:
        reproject(
            full_classes.astype(np.float32),
            want,
            src_transform=src.transform,
            src_crs=src.crs,
            dst_transform=tile_transform(z, x, y),
            dst_crs=WEB_MERCATOR,
            dst_nodata=np.nan,
            resampling=Resampling.nearest,
        )
    both = (got >= 0) & np.isfinite(want)
    assert both.mean() > 0.5  # the tile is well inside the scene
    assert (got[both] == want[both]).mean() >= 0.98
    assert set(np.unique(got[both])) == {0, 1}  # water and land in this tile
    c = rgba(conf.content)
    assert (c[3] > 0).sum() == (got >= 0).sum()  # the same pixels drawn
    t = rgba(true_colour.content)
    assert (t[3] > 0).mean() > 0.5
    assert t[:3, t[3] > 0].std() > 5  # a picture, not a flat colour
    assert (rgba(outside.content)[3] == 0).all()  # outside the scene: transparent


def test_a_model_without_colours_draws_its_tiles_as_its_geotiffs(tmp_path, register_model):
    """Tiles are the model's own class map and confidence, in its class map's colour table."""
    from geoserve.plugins import load_plugins
    from geoserve.processors.reassemblers import SegmentationReassembler
    from geoserve.registry import MODEL_REGISTRY
    from geoserve.tiles.render import ramp_rgba
    from tests.conftest import processors_of

    load_plugins()  # (the built-in models: demo-water's processors)
    in_proc, out_proc = processors_of("demo-water")
    factory = MODEL_REGISTRY.get("demo-water").factory
    plain = SegmentationReassembler(classes=out_proc.classes)  # no colours of its own
    name = register_model("demo-water-no-colours", lambda: factory(), in_proc, plain)
    with Engine(name, output_kind="classes,confidence") as eng:
        files = eng.generate_image(LAKE, output_path=tmp_path / "lake.tif").outputs_by_kind
    with rasterio.open(files["classes"].path) as ds:
        classes, table = ds.read(1), ds.colormap(1)
    with rasterio.open(files["confidence"].path) as ds:
        confidence = ds.read(1)
    z = lake_zoom() + 1
    x, y = tile_of(*lake_centre(), z)
    tile = f"/v1/tiles/{z}/{x}/{y}.png"
    with running_server(model=name, allowed_input_dirs=[LAKE.parent], ui=True) as url:
        drawn = rgba(httpx.get(f"{url}{tile}", params={"source": str(LAKE)}).content)
        conf = httpx.get(f"{url}{tile}", params={"source": str(LAKE), "kind": "confidence"})
        legend = httpx.get(f"{url}/ui/config.json").json()["colors"]
    colours = [table[code][:3] for code in range(len(out_proc.classes))]
    got = np.full((256, 256), -1)
    for code, rgb in enumerate(colours):
        got[(drawn[:3] == np.array(rgb)[:, None, None]).all(axis=0) & (drawn[3] > 0)] = code
    assert ((got >= 0) == (drawn[3] > 0)).all()  # every drawn pixel in a GeoTIFF class colour
    assert legend == [list(c) for c in colours]  # the page's legend: the same table
    want = np.full((2, 256, 256), np.nan, dtype=np.float32)
    with rasterio.open(LAKE) as src:
        for band, values, how in ((0, classes, "nearest"), (1, confidence, "bilinear")):
            reproject(
                values.astype(np.float32),
                want[band],
                src_transform=src.transform,
                src_crs=src.crs,
                dst_transform=tile_transform(z, x, y),
                dst_crs=WEB_MERCATOR,
                dst_nodata=np.nan,
                resampling=Resampling[how],
            )
    both = (got >= 0) & np.isfinite(want[0])
    assert both.mean() > 0.5  # the tile is well inside the scene
    assert (got[both] == want[0][both]).mean() >= 0.99  # the GeoTIFF's classes there
    assert set(np.unique(got[both])) == {0, 1}
    c = rgba(conf.content)
    ramp = ramp_rgba(want[1], 1 / len(colours), 1.0)  # the confidence kind's values, drawn
    assert ((c[3] > 0) == (ramp[3] > 0)).all()  # drawn where the confidence map has values
    inside = c[3] > 0
    assert inside.mean() > 0.5
    close = (np.abs(c[:3].astype(int) - ramp[:3].astype(int)) <= 3).all(axis=0)
    assert close[inside].all()  # the same colours (up to a ramp step: float rounding)


def test_a_tile_runs_only_its_patches_once(spy_model):
    name, seen = spy_model("demo-water")
    z = lake_zoom() + 2
    x, y = tile_of(*lake_centre(), z)
    with rasterio.open(LAKE) as src:
        geometry = SceneGeometry("lake", src.crs, src.transform, src.width, src.height)
    plan = plan_tile(geometry, z, x, y, 224, 192)
    assert plan is not None
    per_axis = [math.ceil(plan.cut.height / 192), math.ceil(plan.cut.width / 192)]
    with running_server(model=name, allowed_input_dirs=[LAKE.parent], warmup=False) as url:
        first = httpx.get(f"{url}/v1/tiles/{z}/{x}/{y}.png", params={"source": str(LAKE)})
        ran = sum(len(b) for b in seen)
        again = httpx.get(f"{url}/v1/tiles/{z}/{x}/{y}.png", params={"source": str(LAKE)})
        metrics = httpx.get(f"{url}/metrics").text
    assert first.status_code == again.status_code == 200
    assert ran == per_axis[0] * per_axis[1]  # the patches of the tile's cut-out, no more
    assert ran < 32  # the whole lake scene has 32
    assert sum(len(b) for b in seen) == ran  # the same tile again: no patch ran
    assert again.content == first.content
    hits = float(re.search(r"^geoserve_tile_cache_hits_total (\S+)$", metrics, re.M).group(1))
    assert hits == ran


def test_concurrent_tiles_share_batches():
    z = lake_zoom() + 2
    x0, y0 = tile_of(*lake_centre(), z)
    tiles = [(x0 + dx, y0 + dy) for dx in range(-4, 4) for dy in range(-4, 4)]
    assert len(tiles) == 64
    with running_server(
        model="demo-water", allowed_input_dirs=[LAKE.parent], max_batch_patches=16
    ) as url:

        async def fetch_all() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=url, timeout=120) as client:
                return await asyncio.gather(
                    *(
                        client.get(f"/v1/tiles/{z}/{x}/{y}.png", params={"source": str(LAKE)})
                        for x, y in tiles
                    )
                )

        answers = asyncio.run(fetch_all())
        metrics = httpx.get(f"{url}/metrics").text
    assert [r.status_code for r in answers] == [200] * 64
    drawn = sum(bool((rgba(r.content)[3] > 0).any()) for r in answers)
    assert drawn >= 20  # tiles over the scene; the rest transparent
    total = float(re.search(r"^geoserve_batch_size_patches_sum (\S+)$", metrics, re.M).group(1))
    count = float(re.search(r"^geoserve_batch_size_patches_count (\S+)$", metrics, re.M).group(1))
    assert total / count > 1  # tiles' patches went through the model together


def test_low_zooms_need_a_stored_prediction_and_scenes_are_uploaded(tmp_path, full_classes):
    z = lake_zoom()
    with running_server(model="demo-water", output_dir=tmp_path, max_scenes=1) as url:
        up = httpx.post(
            f"{url}/v1/scenes", files={"file": ("lake.tif", LAKE.read_bytes(), "image/tiff")}
        )
        assert up.status_code == 201, up.text
        scene = up.json()
        assert scene["minzoom"] == z
        assert scene["width"] == 1536
        lon, lat = lake_centre()
        west, south, east, north = scene["bounds"]
        assert west < lon < east
        assert south < lat < north
        x, y = tile_of(lon, lat, z - 3)
        low = httpx.get(f"{url}/v1/tiles/{z - 3}/{x}/{y}.png", params={"source": scene["id"]})
        assert low.status_code == 422
        assert f"zoom in to level >= {z}" in low.json()["message"]
        done = httpx.post(f"{url}/v1/scenes/{scene['id']}/predict", timeout=120)
        assert done.status_code == 200, done.text
        tif = httpx.get(f"{url}/{done.json()['download']}")
        low = httpx.get(f"{url}/v1/tiles/{z - 3}/{x}/{y}.png", params={"source": scene["id"]})
        beside = httpx.get(
            f"{url}/v1/tiles/{z - 3}/{x + 3}/{y}.png", params={"source": scene["id"]}
        )
        stored_conf = httpx.get(
            f"{url}/v1/tiles/{z - 3}/{x}/{y}.png",
            params={"source": scene["id"], "kind": "confidence"},
        )
        too_low = httpx.get(
            f"{url}/v1/tiles/{z - 3}/{x}/{y}.png", params={"source": scene["id"], "kind": "input"}
        )
        input_low = httpx.get(
            f"{url}/v1/tiles/{z - 2}/{'/'.join(map(str, tile_of(lon, lat, z - 2)))}.png",
            params={"source": scene["id"], "kind": "input"},
        )
        gone = httpx.delete(f"{url}/v1/scenes/{scene['id']}")
        after = httpx.get(f"{url}/v1/scenes/{scene['id']}")
    assert tif.status_code == 200
    with MemoryFile(tif.content) as mem, mem.open() as ds:
        np.testing.assert_array_equal(ds.read(1), full_classes)
        assert ds.overviews(1)  # for the low zooms' tiles
    assert low.status_code == 200
    assert (codes(rgba(low.content)) == 1).any()  # the lake, drawn from the stored map
    assert (rgba(beside.content)[3] == 0).all()  # beside the scene: transparent
    assert stored_conf.status_code == 400  # a stored class map has no confidence
    assert "is not a confidence map" in stored_conf.json()["message"]
    assert too_low.status_code == 422
    assert f"zoom in to level >= {z - 2}" in too_low.json()["message"]
    assert input_low.status_code == 200  # true colour, read decimated
    assert (rgba(input_low.content)[3] > 0).any()
    assert gone.status_code == 204
    assert after.status_code == 404
    assert "not found" in after.json()["message"]
    assert not list((tmp_path / "scenes").glob("scn-*"))  # its files removed


def test_tile_sources_follow_the_trust_rules_and_the_key_guards_tiles_and_page(tmp_path):
    key = "s3cret-key"
    vrt = tmp_path / "evil.vrt"
    vrt.write_text('<VRTDataset rasterXSize="1" rasterYSize="1"></VRTDataset>')
    z = lake_zoom() + 1
    x, y = tile_of(*lake_centre(), z)
    tile = f"/v1/tiles/{z}/{x}/{y}.png"
    auth = {"Authorization": f"Bearer {key}"}
    with running_server(
        model="demo-water",
        allowed_input_dirs=[LAKE.parent],
        allowed_url_domains=["example.org"],
        output_dir=tmp_path / "out",
        api_key=key,
        ui=True,
    ) as url:
        get = lambda path, **kw: httpx.get(f"{url}{path}", **kw)  # noqa: E731
        assert get(tile, params={"source": str(LAKE)}).status_code == 401
        assert get(tile, params={"source": str(LAKE)}, headers=auth).status_code == 200
        for source, status, words in (
            ("/etc/passwd", 403, "outside the allowed input directories"),
            (str(vrt), 403, "outside the allowed input directories"),
            ("https://elsewhere.net/a.tif", 403, "elsewhere.net"),
            ("output:../../etc/passwd", 403, "not an output file name"),
            ("output:nothing.tif", 404, "not found"),
            (str(LAKE.parent / "none.tif"), 400, "none.tif: not found"),
            ("scn-" + "0" * 32, 404, "not found"),
        ):
            resp = get(tile, params={"source": source}, headers=auth)
            assert resp.status_code == status, (source, resp.text)
            assert words in resp.json()["message"]
            assert "Traceback" not in resp.text
        bad_kind = get(tile, params={"source": str(LAKE), "kind": "polygons"}, headers=auth)
        assert bad_kind.status_code == 400
        assert "not a tile kind" in bad_kind.json()["message"]
        assert (
            get("/v1/tiles/3/9/0.png", params={"source": str(LAKE)}, headers=auth).status_code
            == 400
        )
        upload = httpx.post(
            f"{url}/v1/scenes", files={"file": ("evil.vrt", vrt.read_bytes())}, headers=auth
        )
        assert upload.status_code in (400, 403)
        assert "upload 'evil.vrt'" in upload.json()["message"]
        page = get("/")
        assert page.status_code == 401
        assert page.headers["www-authenticate"] == 'Basic realm="geoserve"'
        page = get("/", auth=("any", key))
        assert page.status_code == 200
        assert "leaflet.js" in page.text
        assert get("/ui/app.js", auth=("any", key)).status_code == 200
        assert get("/ui/../settings.py", auth=("any", key)).status_code == 404
        assert get("/ui/config.json", auth=("any", "wrong")).status_code == 401
        # a browser's stored Basic key is not sent for it by another site's page
        cross = httpx.post(
            f"{url}/v1/scenes",
            content=LAKE.read_bytes(),
            auth=("any", key),
            headers={"Sec-Fetch-Site": "cross-site"},
        )
        assert cross.status_code == 403
        fine = write_geotiff(
            tmp_path / "fine.tif",
            np.zeros((1, 64, 64), np.uint16),
            crs="EPSG:4326",
            transform=Affine(1e-9, 0, 13.0, 0, -1e-9, 52.0),
        )
        tiny = httpx.post(f"{url}/v1/scenes", content=fine.read_bytes(), headers=auth)
        assert tiny.status_code == 400
        assert "finer than map tiles show" in tiny.json()["message"]
        config = get("/ui/config.json", auth=("any", key)).json()
    assert config["classes"] == ["not water", "water"]
    assert config["colors"] == [list(LAND), list(WATER)]
    assert config["basemap_url"] is None


def test_a_url_on_an_allowed_host_is_tiled_in_place_like_the_file():
    z = lake_zoom() + 1
    x, y = tile_of(*lake_centre(), z)
    with (
        serve_ranges(LAKE.parent) as (base, log),
        running_server(
            model="demo-water",
            allowed_input_dirs=[LAKE.parent],
            allowed_url_domains=["127.0.0.1"],
        ) as url,
    ):
        by_url = httpx.get(
            f"{url}/v1/tiles/{z}/{x}/{y}.png", params={"source": f"{base}/{LAKE.name}"}
        )
        by_path = httpx.get(f"{url}/v1/tiles/{z}/{x}/{y}.png", params={"source": str(LAKE)})
    assert by_url.status_code == 200, by_url.text
    assert by_url.content == by_path.content
    assert any(r is not None for _, _, r in log)  # read by range requests, in place


def lake_part(path, *, flipped: bool = False):
    """The middle of the lake scene, uncompressed (so a changed copy is of the same size)."""
    with rasterio.open(LAKE) as src:
        window = Window(512, 128, 512, 512)
        data = src.read(window=window)
        where = {"crs": src.crs, "transform": src.window_transform(window)}
    return write_geotiff(path, data[:, ::-1].copy() if flipped else data, **where)


def part_tile(path) -> str:
    """The tile at the middle of ``lake_part``, one zoom above its on-demand zoom."""
    with rasterio.open(path) as src:
        z = min_zoom(src.crs, src.transform, src.width, src.height) + 1
        cx, cy = src.transform @ (src.width / 2, src.height / 2)
        lon, lat = transform(src.crs, "EPSG:4326", [cx], [cy])
    x, y = tile_of(lon[0], lat[0], z)
    return f"/v1/tiles/{z}/{x}/{y}.png"


def cache_hits(url: str) -> float:
    metrics = httpx.get(f"{url}/metrics").text
    return float(re.search(r"^geoserve_tile_cache_hits_total (\S+)$", metrics, re.M).group(1))


def test_a_file_rewritten_with_its_size_and_mtime_kept_is_predicted_anew(tmp_path):
    scene = lake_part(tmp_path / "scene.tif")
    flipped = lake_part(tmp_path / "flipped.tif", flipped=True)
    assert flipped.stat().st_size == scene.stat().st_size
    tile = part_tile(scene)
    with running_server(model="demo-water", allowed_input_dirs=[tmp_path]) as url:
        get = lambda path: httpx.get(f"{url}{tile}", params={"source": str(path)}, timeout=120)  # noqa: E731
        before = get(scene)
        st = scene.stat()
        with scene.open("r+b") as f:  # cp -p: the same file rewritten, its times set back
            f.write(flipped.read_bytes())
        os.utime(scene, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert (scene.stat().st_size, scene.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
        rewritten = get(scene)
        copy = tmp_path / "copy.tif"  # rsync -t: a new file renamed over it, its time set back
        copy.write_bytes(lake_part(tmp_path / "again.tif").read_bytes())
        os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))
        os.replace(copy, scene)
        renamed = get(scene)
        want = get(flipped)
    assert before.status_code == rewritten.status_code == renamed.status_code == 200
    old, new = codes(rgba(before.content)), codes(rgba(rewritten.content))
    assert (old != new).mean() > 0.05  # the lake moved with the content
    assert rewritten.content == want.content
    assert renamed.content == before.content  # the first content again


def test_a_url_without_etag_or_last_modified_is_predicted_anew_every_time(tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    scene = lake_part(served / "scene.tif")
    flipped = lake_part(tmp_path / "flipped.tif", flipped=True)
    tile = part_tile(scene)
    with (
        serve_ranges(served) as (base, _),  # (it answers with neither header)
        running_server(
            model="demo-water",
            allowed_input_dirs=[tmp_path],
            allowed_url_domains=["127.0.0.1"],
        ) as url,
    ):
        get = lambda source: httpx.get(f"{url}{tile}", params={"source": source}, timeout=120)  # noqa: E731
        before = get(f"{base}/scene.tif")
        scene.write_bytes(flipped.read_bytes())  # the content behind the URL changes
        after = get(f"{base}/scene.tif")
        hits = cache_hits(url)
        want = get(str(flipped))
    assert before.status_code == after.status_code == 200, after.text
    assert hits == 0  # no patch of the URL was reused
    assert (codes(rgba(before.content)) != codes(rgba(after.content))).mean() > 0.05
    assert after.content == want.content


def test_hidden_classes_are_drawn_transparent_and_a_model_can_declare_them(register_model):
    import dataclasses

    from geoserve.plugins import load_plugins
    from geoserve.processors.reassemblers import SegmentationReassembler
    from geoserve.registry import MODEL_REGISTRY
    from tests.conftest import processors_of

    load_plugins()  # (the built-in models: demo-water's processors)

    @dataclasses.dataclass(frozen=True)
    class WaterHidden(SegmentationReassembler):  # a model's own declaration
        transparent_classes: tuple[str, ...] = ("water",)

    in_proc, out_proc = processors_of("demo-water")
    declared = WaterHidden(classes=out_proc.classes, colors=out_proc.colors)
    factory = MODEL_REGISTRY.get("demo-water").factory
    named = register_model("demo-water-water-hidden", lambda: factory(), in_proc, declared)
    z = lake_zoom() + 1
    x, y = tile_of(*lake_centre(), z)
    tile, source = f"/v1/tiles/{z}/{x}/{y}.png", {"source": str(LAKE)}
    with running_server(model="demo-water", allowed_input_dirs=[LAKE.parent], ui=True) as url:
        get = lambda **kw: httpx.get(f"{url}{tile}", params={**source, **kw}, timeout=120)  # noqa: E731
        every, land_hidden = codes(rgba(get().content)), rgba(get(hide="0").content)
        bad = [get(hide=h) for h in ("2", "x", "-1")]
        binary = httpx.get(f"{url}/ui/config.json").json()
    with running_server(model=named, allowed_input_dirs=[LAKE.parent], ui=True) as url:
        own = httpx.get(f"{url}/ui/config.json").json()
    assert (every == 0).any()  # the tile has land
    assert (every == 1).any()  # and water
    assert (land_hidden[3][every == 0] == 0).all()  # land: transparent
    assert (land_hidden[3][every == 1] == 255).all()  # water: drawn, in its colour
    assert (land_hidden[:3, every == 1] == np.array(WATER)[:, None]).all()
    for answer in bad:
        assert answer.status_code == 400, answer.text
        assert "is not a class code of this model (0 to 1)" in answer.json()["message"]
    assert binary["transparent"] == [0]  # a two-class map: its background, by default
    assert own["transparent"] == [1]  # what the model declares
    assert binary["confidence_range"] == [0.5, 1.0]
    assert len(binary["ramp"]) > 2
    assert all(re.fullmatch(r"#[0-9a-f]{6}", c) for c in binary["ramp"])


def test_a_url_without_range_requests_is_refused_for_tiles_without_downloading_it(tmp_path):
    """A host that does not answer range requests would have to be downloaded whole for each
    tile: refused on its HEAD (400), nothing fetched."""
    import http.server
    import threading

    got: list[str] = []

    class Plain(http.server.SimpleHTTPRequestHandler):  # no Accept-Ranges, no Range
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, directory=str(LAKE.parent), **kwargs)  # type: ignore[arg-type]

        def send_head(self) -> object:
            got.append(self.command)
            return super().send_head()

        def log_message(self, *args: object) -> None:
            pass

    host = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Plain)
    threading.Thread(target=host.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{host.server_address[1]}/{LAKE.name}"
    z = lake_zoom()
    x, y = tile_of(*lake_centre(), z)
    try:
        with running_server(model="demo-water", allowed_url_domains=["127.0.0.1"]) as base:
            resp = httpx.get(f"{base}/v1/tiles/{z}/{x}/{y}.png", params={"source": url})
    finally:
        host.shutdown()
    assert resp.status_code == 400, resp.text
    assert "range requests" in resp.json()["message"]
    assert got == ["HEAD"]  # the file itself was never fetched


def test_a_model_without_classes_draws_only_input_tiles():
    z = lake_zoom() + 1
    x, y = tile_of(*lake_centre(), z)
    tile, source = f"/v1/tiles/{z}/{x}/{y}.png", {"source": str(LAKE)}
    with running_server(model="identity", allowed_input_dirs=[LAKE.parent], ui=True) as url:
        refused = [httpx.get(f"{url}{tile}", params={**source, "kind": k}) for k in TWO_KINDS]
        picture = httpx.get(f"{url}{tile}", params={**source, "kind": "input"})
        config = httpx.get(f"{url}/ui/config.json").json()
    for answer in refused:
        assert answer.status_code == 400, answer.text
        assert "model 'identity' gives no classes; ask for kind=input" in answer.json()["message"]
    assert picture.status_code == 200
    assert (rgba(picture.content)[3] > 0).mean() > 0.5
    assert (config["classes"], config["colors"]) == ([], [])
