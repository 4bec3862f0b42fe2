"""The routes of uploaded scenes, for the map's tiles.

``POST /v1/scenes`` (a multipart ``file`` part, or the GeoTIFF as the body; refused when the
model's input processor would refuse it, as a ``/v1/images`` request), ``GET`` and ``DELETE
/v1/scenes/{id}``, ``POST /v1/scenes/{id}/predict`` (the whole scene, stored for the low zooms
and offered at ``GET /v1/scenes/{id}/prediction.tif``). The scenes themselves are kept by
:class:`~geoserve.server.scenes.SceneStore`.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any, BinaryIO

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from geoserve.engine.request_spec import RequestSpec
from geoserve.errors import ForbiddenInputError, InputError, NotFoundError, PayloadTooLargeError
from geoserve.raster.source import NamedBytes
from geoserve.server.gather import read_form
from geoserve.server.metrics import Metrics
from geoserve.server.overviews import add_overviews
from geoserve.server.scenes import SceneStore
from geoserve.server.settings import ServerSettings
from geoserve.tiles.service import TileService

#: The bytes of a stored prediction sent at a time.
CHUNK = 1024 * 1024


class SceneRoutes:
    """The routes above.

    ``lease`` gives the tile service of the model that predicts scenes, its engine leased
    while held.
    """

    def __init__(
        self,
        settings: ServerSettings,
        lease: Callable[[], AbstractAsyncContextManager[TileService]],
        metrics: Metrics,
    ) -> None:
        self.settings = settings
        self.lease = lease
        self.metrics = metrics
        self._store: SceneStore | None = None

    def register(self, app: FastAPI) -> None:
        """Add the routes."""
        app.add_api_route("/v1/scenes", self.upload, methods=["POST"], status_code=201)
        app.add_api_route("/v1/scenes/{sid}", self.describe, methods=["GET"])
        app.add_api_route("/v1/scenes/{sid}", self.delete, methods=["DELETE"])
        app.add_api_route("/v1/scenes/{sid}/predict", self.predict, methods=["POST"])
        app.add_api_route("/v1/scenes/{sid}/prediction.tif", self.download, methods=["GET"])

    @property
    def store(self) -> SceneStore:
        """The uploaded scenes (under ``--output-dir/scenes``).

        Raises:
            ForbiddenInputError: the server has no output directory.
        """
        if self._store is None:
            root = self.settings.output_dir
            if root is None:
                raise ForbiddenInputError(
                    "scene uploads are disabled on this server (start it with --output-dir DIR)"
                )
            self._store = SceneStore(
                root / "scenes",
                max_scenes=self.settings.max_scenes,
                max_bytes=int(self.settings.max_scenes_mb * 1024 * 1024),
                ttl_s=self.settings.scene_ttl_s,
                formats=tuple(self.settings.engine.allowed_formats),
            )
        return self._store

    async def upload(self, request: Request) -> dict[str, Any]:
        """POST /v1/scenes: store a scene for tiles; its id, bounds and zoom range."""
        if request.headers.get("content-type", "").startswith("multipart/form-data"):
            form = await read_form(request)
            part = form.get("file")
            if part is None or isinstance(part, str):
                raise InputError("multipart upload needs a 'file' part with the GeoTIFF")
            data, name = await part.read(), part.filename or "upload.tif"
            await part.close()
        else:
            data, name = await request.body(), "upload.tif"
        if not data:
            raise InputError("empty upload: send the GeoTIFF as a 'file' part or as the body")
        store = self.store
        async with self.lease() as service:
            check = (
                functools.partial(_check_feeds_model, service) if service.class_names() else None
            )
            scene = await asyncio.to_thread(store.add, data, name, check)
        return scene.describe(self.settings.scene_ttl_s)

    async def describe(self, sid: str) -> dict[str, Any]:
        """GET /v1/scenes/{id} (not a use: its expiry stays)."""
        return self.store.get(sid).describe(self.settings.scene_ttl_s)

    async def delete(self, sid: str) -> Response:
        """DELETE /v1/scenes/{id}: the scene and its prediction removed."""
        await asyncio.to_thread(self.store.delete, sid)
        return Response(status_code=204)

    async def predict(self, sid: str) -> dict[str, Any]:
        """POST /v1/scenes/{id}/predict: the whole scene's classes, stored beside it."""
        t0 = time.perf_counter()
        async with self.lease() as service:  # (the model kept loaded while the scene runs)
            engine = service.engine
            with self.store.use(sid) as scene:  # (not evicted or expired while it runs)
                spec = RequestSpec(
                    str(scene.path),
                    request_id=f"geo-{uuid.uuid4().hex}",
                    output_path=scene.prediction,
                    output_kind=["classes"],
                )
                result = await engine.submit(spec, timeout=self.settings.request_timeout_s)
                result.raise_for_error()
                self.metrics.observe_outputs(result)
                if not self.store.holds(scene):  # deleted while it ran
                    await asyncio.to_thread(self.store.discard_files, scene)
                    raise NotFoundError(f"scene {sid}: deleted while it was predicted")
                await asyncio.to_thread(add_overviews, scene.prediction)  # (or the map goes)
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
        with self.store.use(sid) as scene:
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


def _chunks(file: BinaryIO) -> Iterator[bytes]:
    """A file's bytes, a chunk at a time; the file closed at the end (or when dropped)."""
    with file:
        while chunk := file.read(CHUNK):
            yield chunk


def _check_feeds_model(service: TileService, upload: NamedBytes) -> None:
    """Refuse an upload the model's prediction tiles could not read (bands, dates, ...).

    The checks of a tile's request (the engine's admission, headers only), on the whole
    scene: what a tile would answer, the upload answers at once. A scene too large for one
    request is not refused here (tiles cut it; the whole-scene run says so itself).
    ``service``: the tile service on the leased engine of the upload.
    """
    try:
        spec = RequestSpec(upload, data_format="bytes", out_format="tensor", output_kind="raw")
        request = service.engine.engine.prepare_request(spec)
    except PayloadTooLargeError:
        return
    request.close()
