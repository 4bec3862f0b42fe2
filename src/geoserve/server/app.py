"""The HTTP API: the only module that knows about HTTP.

Routes: ``POST /v1/images`` (multipart upload or JSON), ``POST /pooling`` (vLLM's IO-processor
request and response shapes), ``GET /v1/models``, ``GET /health/live``, ``GET /health/ready``,
``GET /metrics``. Every request runs through :class:`~geoserve.engine.AsyncEngine`; errors go
through the one status table in :mod:`geoserve.server.errors` and never carry a traceback.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from geoserve.engine import Engine
from geoserve.engine.async_engine import AsyncEngine
from geoserve.errors import ConfigError, ForbiddenInputError, GeoServeError, InputError
from geoserve.raster.source import DataFormat, RasterLike
from geoserve.schemas import ImageRequestOutput, OutFormat
from geoserve.server.errors import error_body, status_for
from geoserve.server.inputs import fetch_url, resolve_input_path
from geoserve.server.metrics import Metrics
from geoserve.server.middleware import ClientDisconnected, GuardMiddleware
from geoserve.server.settings import ServerSettings

logger = logging.getLogger("geoserve.server")

InFormat = Literal["b64_json", "path", "url"]
OutDataFormat = Literal["b64_json", "path", "geotiff"]


class ImageOptions(BaseModel):
    """Per-request overrides."""

    model_config = ConfigDict(extra="forbid")
    bands: list[int | str] | None = None
    output_kind: Literal["classes", "probabilities", "raw"] | None = None


class ImagesRequest(BaseModel):
    """JSON body of ``POST /v1/images``."""

    model_config = ConfigDict(extra="forbid")
    data: str | list[str]
    data_format: InFormat = "b64_json"
    out_data_format: OutDataFormat = "b64_json"
    options: ImageOptions = Field(default_factory=ImageOptions)
    priority: int = 0


class PoolingData(BaseModel):
    """The ``data`` object of vLLM's Prithvi IO-processor request."""

    model_config = ConfigDict(extra="ignore")
    data: str
    data_format: InFormat = "b64_json"
    out_data_format: Literal["b64_json", "path"] = "b64_json"
    indices: list[int] | None = None


class PoolingRequest(BaseModel):
    """vLLM's ``POST /pooling`` request with an IO-processor plugin (extra fields ignored)."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    data: PoolingData
    priority: int = 0


def _error_response(exc: GeoServeError, settings: ServerSettings) -> JSONResponse:
    status = status_for(exc)
    headers = {"Retry-After": str(settings.retry_after_s)} if status == 503 else None
    return JSONResponse(error_body(str(exc), status, type(exc).__name__), status, headers=headers)


def create_app(settings: ServerSettings, *, engine: Engine | None = None) -> FastAPI:
    """Build the FastAPI app; the model loads in the background (ready is 503 until then)."""
    state: dict[str, Any] = {"engine": None, "draining": False, "load_error": None}
    metrics = Metrics(settings.max_batch_patches)

    def load() -> None:
        try:
            eng = engine or Engine(
                settings.model,
                weights=settings.weights,
                device=settings.device,
                dtype=settings.dtype,
                max_batch_patches=settings.max_batch_patches,
                cross_request_batching=settings.cross_request_batching,
            )
            eng.cross_request_batching = settings.cross_request_batching
            async_engine = AsyncEngine(
                eng,
                max_queued_patches=settings.max_queued_patches,
                max_pixels=settings.max_pixels,
                max_wait_ms=settings.max_wait_ms,
                on_batch=metrics.observe_batch,
            )
            metrics.bind(lambda: async_engine.queued_patches, lambda: async_engine.in_flight)
            state["engine"] = async_engine
            logger.info("model %s ready", settings.model)
        except Exception as exc:  # reported by /health/ready and every request
            logger.exception("model %s failed to load", settings.model)
            state["load_error"] = exc

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        threading.Thread(target=load, name="geoserve-load", daemon=True).start()
        yield
        if state["engine"] is not None:
            await asyncio.to_thread(state["engine"].close)

    app = FastAPI(title="geoserve", version="0.1.0", lifespan=lifespan)
    app.state.geoserve = state
    app.state.settings = settings
    app.state.metrics = metrics
    app.add_middleware(GuardMiddleware, settings=settings, state=state, metrics=metrics)

    @app.exception_handler(GeoServeError)
    async def on_geoserve_error(request: Request, exc: GeoServeError) -> JSONResponse:
        metrics.errors.labels(kind=type(exc).__name__).inc()
        return _error_response(exc, settings)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        metrics.errors.labels(kind="ValidationError").inc()
        return JSONResponse(
            error_body(_validation_message(exc.errors()), 422, "ValidationError"), 422
        )

    def ready_engine() -> AsyncEngine:
        if state["load_error"] is not None:
            raise ConfigError(f"model {settings.model!r} failed to load: {state['load_error']}")
        eng = state["engine"]
        if eng is None:
            from geoserve.errors import ShuttingDownError

            raise ShuttingDownError(f"model {settings.model!r} is still loading")
        return eng  # type: ignore[no-any-return]

    async def run(
        request: Request,
        inputs: RasterLike | list[RasterLike],
        data_format: DataFormat,
        out_data_format: str,
        *,
        bands: list[int | str] | None = None,
        output_kind: str | None = None,
        priority: int = 0,
    ) -> tuple[str, ImageRequestOutput]:
        eng = ready_engine()
        rid = request.headers.get("x-request-id") or f"geo-{uuid.uuid4().hex}"
        if not rid.replace("-", "").replace("_", "").isalnum() or len(rid) > 128:
            raise InputError("X-Request-Id may hold only letters, digits, '-' and '_'")
        out_format: OutFormat = {"geotiff": "bytes", "b64_json": "b64", "path": "path"}[
            out_data_format
        ]  # type: ignore[assignment]
        output_path = None
        if out_format == "path":
            if settings.output_dir is None:
                raise ForbiddenInputError(
                    "path outputs are disabled on this server (start it with --output-dir DIR)"
                )
            output_path = settings.output_dir / f"{rid}.tif"
        t0 = time.perf_counter()
        job = eng.submit(
            inputs,
            request_id=rid,
            out_format=out_format,
            output_path=output_path,
            data_format=data_format,
            bands=bands,
            output_kind=output_kind,
            priority=priority,
            timeout=settings.request_timeout_s,
        )
        result = await _unless_disconnected(request, job)
        metrics.latency.labels(endpoint=request.url.path).observe(time.perf_counter() - t0)
        if result.error is not None:
            raise result.error
        metrics.observe_stages(result.timings)
        return rid, result

    async def gather_inputs(
        items: list[str], data_format: str
    ) -> tuple[list[RasterLike], DataFormat]:
        if data_format == "path":
            paths = [resolve_input_path(p, settings.allowed_input_dirs) for p in items]
            return list(paths), "path"
        if data_format == "url":
            limit = int(settings.max_body_mb * 1024 * 1024)
            return [await fetch_url(u, settings.allowed_url_domains, limit) for u in items], (
                "bytes"
            )
        return list(items), "b64"

    @app.post("/v1/images", response_model=None)
    async def images(request: Request) -> Response:
        ctype = request.headers.get("content-type", "")
        if ctype.startswith("multipart/form-data"):
            form = await request.form()
            uploads = form.getlist("file")
            if not uploads:
                raise InputError("multipart upload needs one or more 'file' parts")
            files: list[RasterLike] = []
            for up in uploads:
                if isinstance(up, str):
                    raise InputError("'file' must be a file part, not a text field")
                files.append(await up.read())
            body = _parse_json(
                ImagesRequest,
                json.dumps(
                    {
                        "data": "",
                        "out_data_format": form.get("out_data_format") or "geotiff",
                        "options": _form_json(form.get("options")),
                        "priority": form.get("priority") or 0,
                    }
                ).encode(),
            )
            inputs: list[RasterLike] = files
            data_format: DataFormat = "bytes"
        else:
            body = _parse_json(ImagesRequest, await request.body())
            items = body.data if isinstance(body.data, list) else [body.data]
            inputs, data_format = await gather_inputs(items, body.data_format)
        rid, result = await run(
            request,
            inputs if len(inputs) > 1 else inputs[0],
            data_format,
            body.out_data_format,
            bands=body.options.bands,
            output_kind=body.options.output_kind,
            priority=body.priority,
        )
        out = result.outputs
        assert out is not None
        timings = {k: round(v, 4) for k, v in vars(result.timings).items()}
        if body.out_data_format == "geotiff":
            return Response(
                out.data,
                media_type="image/tiff",
                headers={"X-Request-Id": rid, "X-Geoserve-Timings": json.dumps(timings)},
            )
        return JSONResponse(
            {
                "request_id": rid,
                "created_at": int(time.time()),
                "model": settings.model,
                "data_format": body.out_data_format,
                "data": out.b64 if body.out_data_format == "b64_json" else str(out.path),
                "width": out.width,
                "height": out.height,
                "count": out.count,
                "dtype": out.dtype,
                "num_patches": result.num_patches,
                "timings": timings,
            }
        )

    @app.post("/pooling", response_model=None)
    async def pooling(request: Request) -> Response:
        body = _parse_json(PoolingRequest, await request.body())
        if body.model is not None and body.model != settings.model:
            from geoserve.errors import UnknownModelError

            raise UnknownModelError(body.model, [settings.model])
        inputs, data_format = await gather_inputs([body.data.data], body.data.data_format)
        rid, result = await run(
            request,
            inputs[0],
            data_format,
            body.data.out_data_format,
            bands=list(body.data.indices) if body.data.indices is not None else None,
            priority=body.priority,
        )
        out = result.outputs
        assert out is not None
        payload = out.b64 if body.data.out_data_format == "b64_json" else str(out.path)
        return JSONResponse(
            {
                "request_id": rid,
                "created_at": int(time.time()),
                "data": {
                    "data_format": body.data.out_data_format,
                    "data": payload,
                    "request_id": rid,
                },
            }
        )

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        eng = state["engine"]
        entry: dict[str, Any] = {
            "id": settings.model,
            "object": "model",
            "owned_by": "geoserve",
            "ready": eng is not None,
        }
        if eng is not None:
            inp, out = eng.engine.in_proc, eng.engine.out_proc
            entry["input"] = {
                "bands": list(getattr(inp, "bands", None) or []) or None,
                "patch_size": inp.patch_size,
                "stride": inp.stride,
                "blend": inp.blend,
                "num_frames": inp.num_frames,
            }
            entry["output"] = {"kind": out.kind, "classes": list(getattr(out, "classes", ()))}
        return {"object": "list", "data": [entry]}

    @app.get("/health/live")
    async def live() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/health/ready", response_model=None)
    async def ready() -> Response:
        if state["draining"]:
            return JSONResponse({"status": "draining"}, 503)
        if state["load_error"] is not None:
            return JSONResponse({"status": "failed", "message": str(state["load_error"])}, 503)
        if state["engine"] is None:
            return JSONResponse({"status": "loading"}, 503)
        return JSONResponse({"status": "ready"})

    @app.get("/metrics")
    async def metrics_route() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    return app


def _parse_json(model: type[BaseModel], raw: bytes) -> Any:
    try:
        payload = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"request body is not valid JSON ({exc})") from None
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from None


def _form_json(value: Any) -> Any:
    if value is None or value == "":
        return {}
    try:
        return json.loads(str(value))
    except json.JSONDecodeError as exc:
        raise InputError(f"form field 'options' is not valid JSON ({exc})") from None


def _validation_message(errors: Any) -> str:
    parts = []
    for err in errors:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        parts.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts)


async def _unless_disconnected(request: Request, job: Any) -> ImageRequestOutput:
    """Await ``job``; if the client disconnects first, cancel it (dropping its patches)."""
    task = asyncio.ensure_future(job)

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(watch())
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        watcher.cancel()
        raise
    if task in done:
        watcher.cancel()
        return task.result()  # type: ignore[no-any-return]
    task.cancel()
    raise ClientDisconnected()
