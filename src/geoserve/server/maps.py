"""The map routes: prediction tiles, uploaded scenes, and the map page (``--ui``).

- ``GET /v1/tiles/{z}/{x}/{y}.png?source=S&kind=classes|confidence|input[&hide=0,2]``: a
  WebMercator tile (256 px) of ``S``, predicted on demand (:mod:`geoserve.tiles`); ``hide``
  names class codes drawn transparent. ``S`` is the id of an
  uploaded scene, a path under an allowed input directory, an ``http(s)`` URL on an allowed
  host that answers range requests, or ``output:NAME``, a GeoTIFF the server wrote under
  ``--output-dir`` (drawn as it is stored, at any zoom). The same trust rules as
  ``/v1/images`` apply.
- ``POST /v1/scenes`` (a multipart ``file`` part, or the GeoTIFF as the body; refused when
  the model's input processor would refuse it, as a ``/v1/images`` request), ``GET`` and
  ``DELETE /v1/scenes/{id}``, ``POST /v1/scenes/{id}/predict`` (the whole scene, stored for
  the low zooms and offered at ``GET /v1/scenes/{id}/prediction.tif``).
- ``GET /`` and ``/ui/...`` with ``--ui``: the page and its files, all from the package.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any, BinaryIO

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from geoserve.engine.patch_cache import PatchCache, Unvalidated, file_identity
from geoserve.errors import (
    ForbiddenInputError,
    InputError,
    NotFoundError,
    PayloadTooLargeError,
    RasterReadError,
)
from geoserve.raster.source import NamedBytes
from geoserve.raster.write import write_error
from geoserve.server.gather import open_budget
from geoserve.server.inputs import remote_input, resolve_input_path
from geoserve.server.metrics import Metrics
from geoserve.server.scenes import SceneStore
from geoserve.server.settings import ServerSettings
from geoserve.tiles.mercator import check_tile
from geoserve.tiles.render import ramp_stops
from geoserve.tiles.service import TILE_KINDS, TileService, TileSource

#: The map page's files (``/ui/NAME``), served from the package and nothing else.
UI_FILES = {
    "app.js": "text/javascript",
    "app.css": "text/css",
    "leaflet/leaflet.js": "text/javascript",
    "leaflet/leaflet.css": "text/css",
    "leaflet/images/layers.png": "image/png",
    "leaflet/images/layers-2x.png": "image/png",
    "leaflet/images/marker-icon.png": "image/png",
    "leaflet/images/marker-icon-2x.png": "image/png",
    "leaflet/images/marker-shadow.png": "image/png",
}
_OUTPUT_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,200}\.tif")
#: How long a vetted URL source with a validator (ETag, Last-Modified) is trusted before it
#: is checked (and its validator read) again; one without is checked for every tile.
URL_CHECK_S = 60.0
#: The bytes of a stored prediction sent at a time.
CHUNK = 1024 * 1024


class MapRoutes:
    """The routes above, on one app; the tile service starts with the engine."""

    def __init__(
        self, settings: ServerSettings, ready_engine: Callable[[], Any], metrics: Metrics
    ) -> None:
        self.settings = settings
        self.ready_engine = ready_engine
        self.cache = PatchCache(int(settings.tile_cache_mb * 1024 * 1024))
        self._service: TileService | None = None
        self._scenes: SceneStore | None = None
        self._urls: dict[str, tuple[float, TileSource]] = {}
        metrics.registry.register(_CacheCollector(self.cache))

    def register(self, app: FastAPI) -> None:
        """Add the routes (the page's only with ``--ui``)."""
        app.add_api_route("/v1/tiles/{z}/{x}/{y}.png", self.tile, methods=["GET"])
        app.add_api_route("/v1/scenes", self.upload, methods=["POST"], status_code=201)
        app.add_api_route("/v1/scenes/{sid}", self.describe, methods=["GET"])
        app.add_api_route("/v1/scenes/{sid}", self.delete, methods=["DELETE"])
        app.add_api_route("/v1/scenes/{sid}/predict", self.predict, methods=["POST"])
        app.add_api_route("/v1/scenes/{sid}/prediction.tif", self.download, methods=["GET"])
        if self.settings.ui:
            app.add_api_route("/", self.page, methods=["GET"], response_model=None)
            app.add_api_route("/ui/config.json", self.page_config, methods=["GET"])
            app.add_api_route("/ui/{name:path}", self.ui_file, methods=["GET"])

    # -- tiles -----------------------------------------------------------------------------

    @property
    def service(self) -> TileService:
        """The tile service on the ready engine."""
        if self._service is None:
            engine = self.ready_engine()
            formats = tuple(self.settings.engine.allowed_formats)
            self._service = TileService(
                engine,
                self.cache,
                formats,
                self.settings.request_timeout_s,
                lambda deadline: open_budget(self.settings, deadline),
            )
        return self._service

    @property
    def scenes(self) -> SceneStore:
        """The uploaded scenes (under ``--output-dir/scenes``)."""
        if self._scenes is None:
            root = self.settings.output_dir
            if root is None:
                raise ForbiddenInputError(
                    "scene uploads are disabled on this server (start it with --output-dir DIR)"
                )
            self._scenes = SceneStore(
                root / "scenes",
                max_scenes=self.settings.max_scenes,
                max_bytes=int(self.settings.max_scenes_mb * 1024 * 1024),
                ttl_s=self.settings.scene_ttl_s,
                formats=tuple(self.settings.engine.allowed_formats),
            )
        return self._scenes

    async def tile(
        self, z: int, x: int, y: int, source: str, kind: str = "classes", hide: str = ""
    ) -> Response:
        """GET /v1/tiles/{z}/{x}/{y}.png: one tile (transparent where the scene is not)."""
        check_tile(z, x, y)
        if kind not in TILE_KINDS:
            raise InputError(
                f"kind: {kind[:40]!r} is not a tile kind; choose {', '.join(TILE_KINDS)}"
            )
        service = self.service
        hidden = _class_codes(hide, len(service.class_names()))
        if source.startswith("output:"):
            path = self._output_file(source.removeprefix("output:"))
            if kind == "input":
                raise InputError("kind: a stored output has no input bands; ask for classes")
            body = await asyncio.to_thread(service.stored_tile, path, z, x, y, kind, hidden)  # type: ignore[arg-type]
        elif source.startswith("scn-"):
            with self.scenes.use(source) as scene:  # (not evicted while its tile is made)
                body = await service.tile(scene.source(), z, x, y, kind, hidden)  # type: ignore[arg-type]
        else:
            body = await service.tile(await self._source(source), z, x, y, kind, hidden)  # type: ignore[arg-type]
        return Response(body, media_type="image/png", headers={"Cache-Control": "no-store"})

    async def _source(self, text: str) -> TileSource:
        """A path or URL tile source by the trust rules of ``/v1/images``."""
        if text.startswith(("http://", "https://")):
            return await self._url_source(text)
        path = await asyncio.to_thread(resolve_input_path, text, self.settings.allowed_input_dirs)
        try:  # (what it is, a regular file, open_raster checks when the tile opens it)
            identity = file_identity(path)
        except OSError:
            raise RasterReadError(f"{text}: not found") from None
        return TileSource(Path(path).name, path, identity)

    async def _url_source(self, url: str) -> TileSource:
        known = self._urls.get(url)
        if known is not None and time.monotonic() - known[0] < URL_CHECK_S:
            return known[1]
        s = self.settings
        if s.url_reads != "range":
            raise ForbiddenInputError(
                f"{url}: tiles read URLs in place; this server downloads them"
            )
        head: dict[str, str] = {}
        where = await remote_input(  # (a host without range requests: refused, not fetched)
            url,
            s.allowed_url_domains,
            int(s.max_body_mb * 1024 * 1024),
            s.request_timeout_s,
            tuple(s.engine.allowed_formats),
            head,
            open_budget(s, time.monotonic() + s.request_timeout_s),
            download=False,
        )
        if not isinstance(where, str):  # (never: download=False)
            raise InputError(f"{url}: tiles need a server that answers HTTP range requests")
        # GDAL keeps what it read of a URL for later opens of the same name: the name it is
        # given carries a fragment (never sent to the host) that changes with the content
        name = url.rsplit("/", 1)[-1][:100]
        validators = (head.get("etag"), head.get("last-modified"), head.get("content-length"))
        if validators[:2] == (None, None):  # its content may change unseen: nothing is reused
            return TileSource(name, f"{where}#{uuid.uuid4().hex}", Unvalidated(url))
        tag = hashlib.sha256(repr(validators).encode()).hexdigest()[:32]
        source = TileSource(name, f"{where}#{tag}", (url, tag))
        if len(self._urls) > 256:
            self._urls.clear()
        self._urls[url] = (time.monotonic(), source)
        return source

    def _output_file(self, name: str) -> Path:
        root = self.settings.output_dir
        if root is None:
            raise ForbiddenInputError("this server writes no outputs (no --output-dir)")
        if not _OUTPUT_NAME.fullmatch(name):
            raise ForbiddenInputError(f"output:{name[:60]}: not an output file name")
        path = root / name
        if not path.is_file():
            raise NotFoundError(f"output:{name}: not found")
        return path

    # -- scenes ------------------------------------------------------------------------------

    async def upload(self, request: Request) -> dict[str, Any]:
        """POST /v1/scenes: store a scene for tiles; its id, bounds and zoom range."""
        if request.headers.get("content-type", "").startswith("multipart/form-data"):
            form = await request.form()
            part = form.get("file")
            if part is None or isinstance(part, str):
                raise InputError("multipart upload needs a 'file' part with the GeoTIFF")
            data, name = await part.read(), part.filename or "upload.tif"
        else:
            data, name = await request.body(), "upload.tif"
        if not data:
            raise InputError("empty upload: send the GeoTIFF as a 'file' part or as the body")
        store, service = self.scenes, self.service
        check = self._check_feeds_model if service.class_names() else None
        scene = await asyncio.to_thread(store.add, data, name, check)
        return scene.describe(self.settings.scene_ttl_s)

    def _check_feeds_model(self, upload: NamedBytes) -> None:
        """Refuse an upload the model's prediction tiles could not read (bands, dates, ...).

        The checks of a tile's request (the engine's admission, headers only), on the whole
        scene: what a tile would answer, the upload answers at once. A scene too large for one
        request is not refused here (tiles cut it; the whole-scene run says so itself).
        """
        try:
            request = self.service.engine.engine.prepare_request(
                upload, data_format="bytes", out_format="tensor", output_kind=["raw"]
            )
        except PayloadTooLargeError:
            return
        request.close()

    async def describe(self, sid: str) -> dict[str, Any]:
        """GET /v1/scenes/{id} (not a use: its expiry stays)."""
        return self.scenes.get(sid).describe(self.settings.scene_ttl_s)

    async def delete(self, sid: str) -> Response:
        """DELETE /v1/scenes/{id}: the scene and its prediction removed."""
        await asyncio.to_thread(self.scenes.delete, sid)
        return Response(status_code=204)

    async def predict(self, sid: str) -> dict[str, Any]:
        """POST /v1/scenes/{id}/predict: the whole scene's classes, stored beside it."""
        engine = self.ready_engine()
        t0 = time.perf_counter()
        with self.scenes.use(sid) as scene:  # (not evicted or expired while it runs)
            result = await engine.submit(
                str(scene.path),
                request_id=f"geo-{uuid.uuid4().hex}",
                out_format="path",
                output_path=scene.prediction,
                output_kind=["classes"],
                timeout=self.settings.request_timeout_s,
            )
            result.raise_for_error()
            if not self.scenes.holds(scene):  # deleted while it ran
                await asyncio.to_thread(self.scenes.discard_files, scene)
                raise NotFoundError(f"scene {sid}: deleted while it was predicted")
            await asyncio.to_thread(_add_overviews, scene.prediction)  # (or the map goes)
        return {
            "id": scene.id,
            "download": f"v1/scenes/{scene.id}/prediction.tif",
            "seconds": round(time.perf_counter() - t0, 3),
        }

    async def download(self, sid: str) -> StreamingResponse:
        """GET /v1/scenes/{id}/prediction.tif: the stored whole-scene class map.

        Sent from the file opened here, so a scene evicted or deleted meanwhile does not cut
        the download short.
        """
        with self.scenes.use(sid) as scene:
            try:
                file = scene.prediction.open("rb")
            except FileNotFoundError:
                raise NotFoundError(
                    f"scene {sid}: not predicted yet (POST /v1/scenes/{sid}/predict)"
                ) from None
        size = os.fstat(file.fileno()).st_size
        return StreamingResponse(
            _chunks(file),
            media_type="image/tiff",
            headers={
                "Content-Length": str(size),
                "Content-Disposition": f'attachment; filename="{scene.id}_classes.tif"',
            },
        )

    # -- the page ----------------------------------------------------------------------------

    async def page(self) -> Response:
        """GET /: the map page."""
        return Response(_ui_bytes("index.html"), media_type="text/html")

    async def page_config(self) -> JSONResponse:
        """GET /ui/config.json: what the page shows (model, classes, colours, basemap)."""
        service = self.service
        return JSONResponse(
            {
                "model": self.settings.model,
                "classes": service.class_names(),
                "colors": [list(c) for c in service.colors()],
                "transparent": service.transparent_classes(),
                "ramp": ramp_stops(),
                "confidence_range": list(service.confidence_range()),
                "uploads": self.settings.output_dir is not None,
                "basemap_url": self.settings.basemap_url,
            }
        )

    async def ui_file(self, name: str) -> Response:
        """GET /ui/NAME: one of the page's own files (nothing else)."""
        if name not in UI_FILES:
            raise NotFoundError(f"/ui/{name[:80]}: no such file")
        return Response(_ui_bytes(name), media_type=UI_FILES[name])


def _class_codes(text: str, count: int) -> tuple[int, ...]:
    """The class codes of a tile's ``hide`` (comma-separated, each below ``count``)."""
    codes = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        if not part.isdigit() or int(part) >= count:
            raise InputError(
                f"hide: {part[:20]!r} is not a class code of this model (0 to {count - 1})"
            )
        codes.append(int(part))
    return tuple(codes)


def _ui_bytes(name: str) -> bytes:
    return (resources.files("geoserve.server") / "ui" / name).read_bytes()


def _chunks(file: BinaryIO) -> Iterator[bytes]:
    """A file's bytes, a chunk at a time; the file closed at the end (or when dropped)."""
    with file:
        while chunk := file.read(CHUNK):
            yield chunk


def _add_overviews(path: Path) -> None:
    """Overviews for the low zooms' tiles of a stored class map (nearest: classes stay).

    Raises:
        OutputWriteError: (:class:`OutputSpaceError` on a full disk) the map is removed.
    """
    import rasterio
    from rasterio.enums import Resampling
    from rasterio.errors import RasterioError

    try:
        with rasterio.open(path, "r+") as ds:
            factors = [f for f in (2, 4, 8, 16, 32, 64) if min(ds.width, ds.height) // f >= 64]
            if factors:
                ds.build_overviews(factors, Resampling.nearest)
    except (RasterioError, OSError) as exc:  # a map with half its overviews is not kept
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
        raise write_error(str(path), exc) from exc


class _CacheCollector:
    """The patch cache's hits, misses and size for ``/metrics``."""

    def __init__(self, cache: PatchCache) -> None:
        self.cache = cache

    def collect(self) -> Iterator[Any]:
        yield CounterMetricFamily(
            "geoserve_tile_cache_hits", "Tile patches found in the patch cache", self.cache.hits
        )
        yield CounterMetricFamily(
            "geoserve_tile_cache_misses", "Tile patches that ran the model", self.cache.misses
        )
        yield GaugeMetricFamily(
            "geoserve_tile_cache_bytes", "Bytes held by the patch cache", self.cache.bytes
        )
