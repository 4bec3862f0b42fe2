"""The map page (``--ui``): ``GET /``, what it shows (``/ui/config.json``) and its own files.

The page and its files, Leaflet included, are served from the package (``server/ui/``) and
nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from importlib import resources

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

from geoserve.errors import NotFoundError
from geoserve.server.settings import ServerSettings
from geoserve.tiles.render import ramp_stops
from geoserve.tiles.service import TileService

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


class MapPage:
    """The page's routes; ``lease`` gives the tile service (the model's classes, colours)."""

    def __init__(
        self,
        settings: ServerSettings,
        lease: Callable[[], AbstractAsyncContextManager[TileService]],
    ) -> None:
        self.settings = settings
        self.lease = lease

    def register(self, app: FastAPI) -> None:
        """Add the routes."""
        app.add_api_route("/", self.page, methods=["GET"], response_model=None)
        app.add_api_route("/ui/config.json", self.page_config, methods=["GET"])
        app.add_api_route("/ui/{name:path}", self.ui_file, methods=["GET"])

    async def page(self) -> Response:
        """GET /: the map page."""
        return Response(_ui_bytes("index.html"), media_type="text/html")

    async def page_config(self) -> JSONResponse:
        """GET /ui/config.json: what the page shows (model, classes, colours, basemap)."""
        async with self.lease() as service:
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


def _ui_bytes(name: str) -> bytes:
    return (resources.files("geoserve.server") / "ui" / name).read_bytes()
