"""The map routes: prediction tiles, and the parts that serve uploaded scenes and the page.

- ``GET /v1/tiles/{z}/{x}/{y}.png?source=S&kind=classes|confidence|input[&hide=0,2]
  [&model=NAME]``: a WebMercator tile (256 px) of ``S``, predicted on demand
  (:mod:`geoserve.tiles`) by the served model ``NAME`` (optional when one is served; each
  model has its own tile service and patch cache, ``--tile-cache-mb`` shared out evenly);
  ``hide`` names class codes drawn transparent. ``S`` is the id of an uploaded scene, a path
  under an allowed input directory, an ``http(s)`` URL on an allowed host that answers range
  requests, or ``output:NAME``, a GeoTIFF the server wrote under ``--output-dir`` (drawn as
  it is stored, at any zoom); the same trust rules as ``/v1/images`` apply
  (:mod:`~geoserve.server.map_sources`).
- the scenes' routes (:mod:`~geoserve.server.scene_routes`) and, with ``--ui``, the page's
  (:mod:`~geoserve.server.map_page`), on the first served model's tile service.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI
from fastapi.responses import Response

from geoserve.engine.async_engine import AsyncEngine
from geoserve.engine.patch_cache import PatchCache
from geoserve.errors import InputError
from geoserve.server.gather import open_budget
from geoserve.server.map_page import MapPage
from geoserve.server.map_sources import MapSources
from geoserve.server.metrics import Metrics, PatchCacheCollector
from geoserve.server.scene_routes import SceneRoutes
from geoserve.server.served import ServedEngines
from geoserve.server.settings import ServerSettings
from geoserve.tiles.mercator import check_tile
from geoserve.tiles.service import TILE_KINDS, TileService


class MapRoutes:
    """The routes above, on one app; each model's tile service is made on its leased engine."""

    def __init__(self, settings: ServerSettings, served: ServedEngines, metrics: Metrics) -> None:
        self.settings = settings
        self.served = served
        names = served.names
        share = int(settings.tile_cache_mb * 1024 * 1024) // len(names)
        self.caches = {name: PatchCache(share) for name in names}
        self.cache = self.caches[names[0]]
        self._services: dict[str, TileService] = {}
        served.on_unload.append(self._forget)
        self.sources = MapSources(settings)
        self.scenes = SceneRoutes(settings, self.lease_first, metrics)
        self.page = MapPage(settings, self.lease_first)
        collected = self.cache if len(names) == 1 else self.caches
        metrics.registry.register(PatchCacheCollector(collected))

    def register(self, app: FastAPI) -> None:
        """Add the routes (the page's only with ``--ui``)."""
        app.add_api_route("/v1/tiles/{z}/{x}/{y}.png", self.tile, methods=["GET"])
        self.scenes.register(app)
        if self.settings.ui:
            self.page.register(app)

    @contextlib.asynccontextmanager
    async def lease(self, model: str | None) -> AsyncIterator[TileService]:
        """The tile service of the served model ``model``, its engine leased while held."""
        async with self.served.lease(model) as engine:
            yield self._service(self.served.pick(model), engine)

    def lease_first(self) -> contextlib.AbstractAsyncContextManager[TileService]:
        """:meth:`lease` of the first served model (the one scenes and the page use)."""
        return self.lease(self.settings.model)

    def _service(self, name: str, engine: AsyncEngine) -> TileService:
        """The tile service on ``engine`` (made again when the model was reloaded)."""
        service = self._services.get(name)
        if service is None or service.engine is not engine:
            formats = tuple(self.settings.engine.allowed_formats)
            service = self._services[name] = TileService(
                engine,
                self.caches[name],
                formats,
                self.settings.request_timeout_s,
                lambda deadline: open_budget(self.settings, deadline),
            )
        return service

    def _forget(self, name: str) -> None:
        """An unloaded model's tile service goes with it (its patch cache stays: same model)."""
        self._services.pop(name, None)

    async def tile(
        self,
        z: int,
        x: int,
        y: int,
        source: str,
        kind: str = "classes",
        hide: str = "",
        model: str | None = None,
    ) -> Response:
        """GET /v1/tiles/{z}/{x}/{y}.png: one tile (transparent where the scene is not)."""
        check_tile(z, x, y)
        if kind not in TILE_KINDS:
            raise InputError(
                f"kind: {kind[:40]!r} is not a tile kind; choose {', '.join(TILE_KINDS)}"
            )
        async with self.lease(model) as service:
            hidden = _class_codes(hide, len(service.class_names()))
            if source.startswith("output:"):
                path = self.sources.output_file(source.removeprefix("output:"))
                if kind == "input":
                    raise InputError("kind: a stored output has no input bands; ask for classes")
                body = await asyncio.to_thread(service.stored_tile, path, z, x, y, kind, hidden)  # type: ignore[arg-type]
            elif source.startswith("scn-"):
                with self.scenes.store.use(source) as scene:  # (not evicted while its tile is made)
                    body = await service.tile(scene.source(), z, x, y, kind, hidden)  # type: ignore[arg-type]
            else:
                tile_source = await self.sources.resolve(source)
                body = await service.tile(tile_source, z, x, y, kind, hidden)  # type: ignore[arg-type]
        return Response(body, media_type="image/png", headers={"Cache-Control": "no-store"})


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
