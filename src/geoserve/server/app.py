"""The HTTP API: the only module that knows about HTTP.

Routes: ``POST /v1/images`` (multipart upload or JSON), ``POST /pooling`` (vLLM's IO-processor
request and response shapes), ``GET /v1/models``, ``GET /health/live``, ``GET /health/ready``,
``GET /metrics``. Every request runs through its model's :class:`~geoserve.engine.AsyncEngine`
(:mod:`geoserve.server.served`: one per served model; a request names its model with
``"model"``, optional when one is served); errors go through the one status table in
:mod:`geoserve.server.errors` and never carry a traceback.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from geoserve.engine import Engine
from geoserve.engine.async_engine import AsyncEngine
from geoserve.engine.request_spec import RequestSpec
from geoserve.engine.startup import AUTO_MAX_BATCH
from geoserve.errors import ForbiddenInputError, GeoServeError, InputError
from geoserve.models.configured import models_in_dir, register_all
from geoserve.raster import tempfiles
from geoserve.raster.budget import OpenBudget
from geoserve.raster.sinks import kind_suffix
from geoserve.raster.source import DataFormat
from geoserve.schemas import TOKEN_KINDS, VECTOR_KINDS, ImageOutput, ImageRequestOutput, OutFormat
from geoserve.server.api_models import (
    ImagesRequest,
    PoolingRequest,
    parse_json,
    validation_message,
)
from geoserve.server.errors import error_body, status_for
from geoserve.server.gather import Items, gather, open_budget, parse_multipart
from geoserve.server.job_routes import JobRoutes
from geoserve.server.job_service import JobService
from geoserve.server.map_routes import MapRoutes
from geoserve.server.metrics import Metrics
from geoserve.server.middleware import GuardMiddleware, unless_disconnected
from geoserve.server.ogc_routes import OgcRoutes
from geoserve.server.served import ServedEngines
from geoserve.server.settings import ServerSettings

logger = logging.getLogger("geoserve.server")

_REQUEST_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
_OUT_FORMATS: dict[str, OutFormat] = {"geotiff": "bytes", "b64_json": "b64", "path": "path"}
#: How the engine reads each ``data_format`` (and a multipart upload's parts: ``bytes``).
_IN_FORMATS: dict[str, DataFormat] = {
    "b64_json": "b64",
    "path": "path",
    "url": "url",
    "auto": "auto",  # (a STAC search)
    "bytes": "bytes",
}


def _error_response(exc: GeoServeError, settings: ServerSettings) -> JSONResponse:
    status = status_for(exc)
    headers = {"Retry-After": str(settings.retry_after_s)} if status == 503 else None
    return JSONResponse(error_body(str(exc), status, type(exc).__name__), status, headers=headers)


class _Service:
    """Holds the app's settings, engines and metrics; its methods are the routes."""

    def __init__(self, settings: ServerSettings, engine: Engine | None) -> None:
        self.settings = settings
        batches = {
            m.name: b if isinstance(b := m.engine.max_batch_patches, int) else AUTO_MAX_BATCH
            for m in settings.served
        }
        self.metrics = Metrics(batches, settings.model_names)
        self.state: dict[str, Any] = {"started": False, "draining": False, "load_error": None}
        self.served = ServedEngines(settings, self.metrics, self.state, engine)
        self.jobs: JobService | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    def load(self) -> None:
        """Build the engines (in a thread, so health answers while the models load)."""
        s = self.settings
        if s.output_dir is not None:  # what a killed earlier server left half-written
            tempfiles.sweep(s.output_dir)
        try:
            if s.models_dir is not None:  # (each Ray Serve replica registers its own)
                register_all(models_in_dir(s.models_dir))
        except Exception as exc:  # reported by /health/ready and every request
            logger.exception("models of %s failed to register", s.models_dir)
            self.state["load_error"] = exc
            self.served.errors.update(dict.fromkeys(s.model_names, exc))
            return
        self.served.load()

    def label(self, model: str) -> str | None:
        """``model`` as the metrics name it (``None`` on a one-model server: no label)."""
        return model if self.metrics.by_model else None

    # -- shared request path -------------------------------------------------------------------

    def output_path(
        self, rid: str, out_format: str, kinds: Sequence[str], model: str | None = None
    ) -> Path | None:
        """Where a ``path`` output goes: always under --output-dir, named by the server.

        One kind: ``<rid>.tif`` (polygons: ``<rid>.gpkg``, or --polygon-format's suffix);
        several: the stem ``<rid>`` of ``<rid>_<kind>.tif`` and so on.
        """
        if out_format != "path":
            return None
        if self.settings.output_dir is None:
            raise ForbiddenInputError(
                "path outputs are disabled on this server (start it with --output-dir DIR)"
            )
        if len(kinds) > 1:
            return self.settings.output_dir / rid
        fmt = self.settings.engine_of(model or self.settings.model).polygon_format
        return self.settings.output_dir / f"{rid}{kind_suffix(kinds[0], fmt)}"

    async def run(
        self, request: Request, spec: RequestSpec, out_data_format: str, model: str
    ) -> tuple[str, ImageRequestOutput]:
        """Fetch the inputs, run the request and wait for it, unless the client leaves first.

        ``spec``'s inputs are as the client named them (fetched here, every path and URL
        vetted); it is checked against the model before anything is fetched, and the server
        gives it its id, output format and path. The request's deadline
        (``request_timeout_s``) covers downloading its inputs as well as the engine's work; a
        client that disconnects cancels both. ``model``: the served model that runs it.
        """
        t0 = time.perf_counter()  # (a model that loads first: its wait is the request's too)
        deadline = time.monotonic() + self.settings.request_timeout_s
        async with self.served.lease(model, self.settings.request_timeout_s) as eng:
            client_id = request.headers.get("x-request-id")
            if client_id is not None and not _REQUEST_ID.fullmatch(client_id):
                raise InputError("X-Request-Id may hold only letters, digits, '-' and '_' (<= 128)")
            # the engine's key and the output's file name are always the server's own: a client's
            # id is only echoed back and logged, so two clients sending the same one never meet
            rid = f"geo-{uuid.uuid4().hex}"
            if client_id is not None:
                logger.info("request %s has client id %s", rid, client_id)
            out_format = _OUT_FORMATS[out_data_format]
            spec = RequestSpec.of(spec, request_id=rid, out_format=out_format)
            spec = spec.check(eng.engine, upfront=True)  # (before anything is downloaded)
            kinds = spec.output_kind or [getattr(p, "kind", "raw") for p in eng.engine.out_procs]
            if out_data_format == "geotiff" and (len(kinds) > 1 or kinds[0] in VECTOR_KINDS):
                raise InputError(
                    "out_data_format 'geotiff' returns one GeoTIFF; for "
                    f"{'several output kinds' if len(kinds) > 1 else 'polygons'} ask for "
                    "'b64_json' or 'path'"
                )
            path = self.output_path(rid, out_format, kinds, model)
            budget = open_budget(self.settings, deadline)

            spec = RequestSpec.of(spec, output_path=path)
            held = request.scope.get("geoserve.held")
            job = self.gather_submit(spec, deadline, budget, eng, held)
            try:
                result = await unless_disconnected(request, job)
            finally:  # (done, timed out or its client left: nothing more reaches a host for it)
                budget.cancel()
        label = self.label(model)
        self.metrics.observe_latency(request.url.path, time.perf_counter() - t0, label)
        if result.error is not None:
            raise result.error
        self.metrics.observe_stages(result.timings, label)
        self.metrics.observe_outputs(result, label)
        return rid, result

    async def gather_submit(
        self,
        spec: RequestSpec,
        deadline: float,
        budget: OpenBudget,
        eng: AsyncEngine,
        held: str | None = None,
    ) -> ImageRequestOutput:
        """Vet and fetch ``spec``'s inputs (the trust rules), then run it in ``eng``.

        Inputs already read by the server (``data_format`` ``bytes``: uploads) go as they are.
        """
        if spec.data_format != "bytes":
            items = cast(Items, spec.inputs)
            inputs, fmt = await gather(self.settings, items, spec.data_format, deadline, budget)
            spec = RequestSpec.of(spec, inputs=inputs, data_format=fmt)
        return await eng.submit(
            spec,
            timeout=self.settings.request_timeout_s,
            deadline=deadline,
            held=held,
            budget=budget,
        )

    async def run_job(self, spec: RequestSpec, directory: Path) -> ImageRequestOutput:
        """A job's request (:class:`~geoserve.jobs.runner.JobRunner`), outputs in ``directory``.

        The same checks and trust rules as ``/v1/images``; its deadline is
        ``request_timeout_s`` from when it starts running. Its model is its process's (the
        job's ``process_id`` in the store, the model it was submitted to).
        """
        model = await self.job_model(spec.request_id)
        async with self.served.lease(model) as eng:
            spec = RequestSpec.of(spec, out_format="path").check(eng.engine, upfront=True)
            kinds = spec.output_kind or [getattr(p, "kind", "raw") for p in eng.engine.out_procs]
            fmt = self.settings.engine_of(model).polygon_format
            path = directory / ("out" if len(kinds) > 1 else f"out{kind_suffix(kinds[0], fmt)}")
            deadline = time.monotonic() + self.settings.request_timeout_s
            budget = open_budget(self.settings, deadline)
            try:
                return await self.gather_submit(
                    RequestSpec.of(spec, output_path=path), deadline, budget, eng
                )
            finally:
                budget.cancel()

    async def job_model(self, job_id: str | None) -> str:
        """The model a job was submitted to (one model served: that one)."""
        if not self.served.several or self.jobs is None or job_id is None:
            return self.settings.model
        store = self.jobs.current()
        assert store is not None  # (a job runs only from the store)
        job = await asyncio.to_thread(store.get, job_id)
        return self.served.pick(job.process_id)

    # -- routes ----------------------------------------------------------------------------

    async def images(self, request: Request) -> Response:
        """POST /v1/images: multipart upload or JSON; GeoTIFF bytes or JSON back."""
        items: Any
        if request.headers.get("content-type", "").startswith("multipart/form-data"):
            body, items = await parse_multipart(request)
            data_format = "bytes"
            dates = body.dates  # (else each part's tags, then its file name's stamp)
        else:
            body = await parse_json(
                ImagesRequest, await request.body(), request.headers.get("content-type", "")
            )
            items, data_format, dates = body.inputs(), body.input_format, body.dates
        model = self.served.pick(body.model)
        spec = RequestSpec(
            items,
            data_format=_IN_FORMATS[data_format],
            bands=body.options.bands,
            output_kind=body.options.kinds,
            priority=body.priority,
            seed=body.options.seed or 0,
            temperature=body.options.temperature,
            top_p=body.options.top_p,
            top_k=body.options.top_k,
            dates=dates,
        )
        rid, result = await self.run(request, spec, body.out_data_format, model)
        out = result.outputs
        assert out is not None
        timings = {k: round(v, 4) for k, v in vars(result.timings).items()}
        echo = {"X-Request-Id": request.headers.get("x-request-id") or rid}
        if body.out_data_format == "geotiff":
            headers = {**echo, "X-Geoserve-Timings": json.dumps(timings)}
            return Response(out.data, media_type="image/tiff", headers=headers)
        head = {
            "request_id": rid,
            "created_at": int(time.time()),
            "model": model,
            "data_format": body.out_data_format,
        }
        tail = {"num_patches": result.num_patches, "timings": timings}
        if len(result.outputs_by_kind) > 1:  # one entry per kind
            outputs = {
                kind: _described(o, body.out_data_format)
                for kind, o in result.outputs_by_kind.items()
            }
            return JSONResponse({**head, "outputs": outputs, **tail}, headers=echo)
        return JSONResponse({**head, **_described(out, body.out_data_format), **tail}, headers=echo)

    async def pooling(self, request: Request) -> Response:
        """POST /pooling: vLLM's IO-processor request and response shapes."""
        body = await parse_json(
            PoolingRequest, await request.body(), request.headers.get("content-type", "")
        )
        model = self.served.pick(body.model)
        bands = list(body.data.indices) if body.data.indices is not None else None
        async with self.served.lease(model) as eng:
            engine = eng.engine
            raster: list[str] = [p.kind for p in engine.out_procs if p.kind not in NOT_A_GEOTIFF]
            raster = raster or [k for k in engine.kinds_offered() if k not in NOT_A_GEOTIFF]
        spec = RequestSpec(
            body.data.data,
            data_format=_IN_FORMATS[body.data.data_format],
            bands=bands,
            output_kind=raster[:1],  # vLLM's clients take one GeoTIFF on the input's grid
            priority=body.priority,
        )
        rid, result = await self.run(request, spec, body.data.out_data_format, model)
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

    async def models(self) -> dict[str, Any]:
        """GET /v1/models: every served model and its processors, in order."""
        data = [self.served.describe(name) for name in self.served.names]
        return {"object": "list", "data": data}

    def _stopped(self) -> str | None:
        """Which engine loop stopped, if one did (never expected: every request fails alone)."""
        crashed = self.served.crashed()
        if crashed is None:
            return None
        several = self.served.several
        return f"engine loop of model {crashed[0]!r} stopped" if several else "engine loop stopped"

    async def live(self) -> Response:
        """GET /health/live: the process answers and its engine loops run."""
        if (stopped := self._stopped()) is not None:
            return JSONResponse({"status": "failed", "message": stopped}, 503)
        return JSONResponse({"status": "ok"})

    async def ready(self) -> Response:
        """GET /health/ready: 200 once the start-up loads are done.

        503 while they run, after one failed, or while draining.
        """
        if (stopped := self._stopped()) is not None:
            return JSONResponse({"status": "failed", "message": stopped}, 503)
        if self.state["draining"]:
            return JSONResponse({"status": "draining"}, 503)
        if self.state["load_error"] is not None:
            return JSONResponse({"status": "failed", "message": str(self.state["load_error"])}, 503)
        if not self.served.all_loaded_at_start:  # (the others load on their first request)
            return JSONResponse({"status": "loading"}, 503)
        return JSONResponse({"status": "ready"})

    async def metrics_route(self) -> Response:
        """GET /metrics: Prometheus text format."""
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4")


#: Kinds that are not one GeoTIFF on the input's grid (not for ``/pooling``).
NOT_A_GEOTIFF = (*VECTOR_KINDS, *TOKEN_KINDS)


def _described(out: ImageOutput, out_data_format: str) -> dict[str, Any]:
    """One output in a JSON response: its data (base64, or its server path) and shape.

    A vector output (polygons) gives its feature count as ``count`` and its format as
    ``dtype`` (``gpkg``, ``geojson`` or ``parquet``), as :class:`~geoserve.schemas.ImageOutput`
    does.
    """
    return {
        "data": out.b64 if out_data_format == "b64_json" else str(out.path),
        "width": out.width,
        "height": out.height,
        "count": out.count,
        "dtype": out.dtype,
    }


def create_app(settings: ServerSettings, *, engine: Engine | None = None) -> FastAPI:
    """Build the FastAPI app; the model loads in the background (ready is 503 until then).

    Raises:
        ConfigError: the settings name Hub weights without ``allow_hub_weights``.
    """
    if engine is None:
        settings.check_weights_source()
    svc = _Service(settings, engine)

    jobs = JobService(settings, svc.served, svc.run_job)
    svc.jobs = jobs

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        threading.Thread(target=svc.load, name="geoserve-load", daemon=True).start()
        await jobs.open()
        starting = asyncio.create_task(jobs.start_when_ready(svc.state))
        yield
        starting.cancel()
        await jobs.close()
        await asyncio.to_thread(svc.served.close)

    app = FastAPI(title="geoserve", version="0.1.0", lifespan=lifespan)
    app.state.geoserve = svc.state
    app.add_middleware(GuardMiddleware, settings=settings, state=svc.state, metrics=svc.metrics)

    @app.exception_handler(GeoServeError)
    async def on_geoserve_error(request: Request, exc: GeoServeError) -> JSONResponse:
        svc.metrics.errors.labels(kind=type(exc).__name__).inc()
        return _error_response(exc, settings)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        svc.metrics.errors.labels(kind="ValidationError").inc()
        body = error_body(validation_message(exc.errors()), 422, "ValidationError")
        return JSONResponse(body, 422)

    app.add_api_route("/v1/images", svc.images, methods=["POST"], response_model=None)
    app.add_api_route("/pooling", svc.pooling, methods=["POST"], response_model=None)
    app.add_api_route("/v1/models", svc.models, methods=["GET"])
    app.add_api_route("/health/live", svc.live, methods=["GET"], response_model=None)
    app.add_api_route("/health/ready", svc.ready, methods=["GET"], response_model=None)
    app.add_api_route("/metrics", svc.metrics_route, methods=["GET"], response_model=None)
    JobRoutes(settings, jobs.current, svc.served).register(app)
    OgcRoutes(settings, jobs.current, svc.served).register(app)
    MapRoutes(settings, svc.served, svc.metrics).register(app)  # tiles, scenes, page
    return app
