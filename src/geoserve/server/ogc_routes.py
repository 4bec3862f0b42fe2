"""OGC API - Processes (Part 1: Core 1.0) under ``/ogcapi``, over the same jobs as ``/v1/jobs``.

``GET /ogcapi`` (landing page), ``/ogcapi/conformance``, ``/ogcapi/processes``,
``/ogcapi/processes/{processId}``, ``POST /ogcapi/processes/{processId}/execution`` and the
job routes under ``/ogcapi/jobs`` (:class:`~geoserve.server.job_routes.JobRoutes`). An
execution with ``Prefer: respond-async`` answers 201 with the job's status and
``Location: /ogcapi/jobs/{jobId}``; without it the server runs the same job and answers with
its results (outputs by reference) once it ends, or the job's status with 201 if it is still
running when the request's time (``request_timeout_s``) is up. The execute request's
``outputs`` may ask for an output by value (``{"raw": {"transmissionMode": "value"}}``): the
job's results then give it inline, in base64, if it is at most ``max_inline_mb`` (else still
by reference); ``Prefer: return=representation`` on the results asks so for every output.
Errors are the standard's exception bodies.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from geoserve.engine.request_spec import RequestSpec
from geoserve.errors import InputError, NotFoundError, UnknownNameError
from geoserve.jobs import SUCCESSFUL, JobStore
from geoserve.raster.source import DataFormat
from geoserve.seeds import SEED_RANGE, is_seed
from geoserve.server.job_routes import JobRoutes, status_info
from geoserve.server.ogc_documents import (
    CONFORMANCE,
    landing,
    process_description,
    process_summary,
)
from geoserve.server.served import ServedEngines
from geoserve.server.settings import ServerSettings

PREFIX = "/ogcapi"
_INPUTS = frozenset({"image", "output_kind", "bands", "dates", "seed"})
_SYNC_POLL_S = 0.1


def _scene(value: Any, where: str) -> tuple[str, DataFormat]:
    """One scene of an execution's ``image``: its text and how it is read."""
    if isinstance(value, dict) and "qualifiedValue" in value:
        value = value["qualifiedValue"]
    if isinstance(value, dict) and isinstance(value.get("href"), str):
        href: str = value["href"]
        return href, "url" if href.lower().startswith(("http://", "https://")) else "path"
    if isinstance(value, dict) and isinstance(value.get("value"), str):
        return value["value"], "b64"
    raise InputError(f"{where}: give a scene as {{'href': URL or path}} or {{'value': base64}}")


def spec_of(inputs: Any) -> RequestSpec:
    """An execution's ``inputs`` as a request (every scene read one way: URL, path or base64)."""
    if not isinstance(inputs, dict):
        raise InputError("inputs: a JSON object of input name to value is needed")
    unknown = sorted(set(inputs) - _INPUTS)
    if unknown:
        raise InputError(f"inputs: unknown input {unknown[0][:60]!r}; known: {sorted(_INPUTS)}")
    if "image" not in inputs:
        raise InputError("inputs: 'image' (the scene to run) is required")
    image = inputs["image"]
    formats: set[str] = set()

    def scene(value: Any, where: str) -> str:
        text, fmt = _scene(value, where)
        formats.add(fmt)
        return text

    data: Any
    if isinstance(image, list):
        data = [scene(v, f"image[{i}]") for i, v in enumerate(image)]
    elif isinstance(image, dict) and not ({"href", "value", "qualifiedValue"} & set(image)):
        data = {
            str(k): [scene(x, f"image[{k!r}]") for x in (v if isinstance(v, list) else [v])]
            for k, v in image.items()
        }
    else:
        data = scene(image, "image")
    if len(formats) > 1:
        raise InputError("image: give every scene the same way (all URLs, paths or base64)")
    kinds = inputs.get("output_kind")
    bands = inputs.get("bands")
    for name, value in (("output_kind", kinds), ("bands", bands)):
        if value is not None and not isinstance(value, (str, list)):
            raise InputError(f"inputs.{name}: a string or a list")
    seed = inputs.get("seed")
    if seed is not None and not is_seed(seed):
        raise InputError(f"inputs.seed: {SEED_RANGE}, got {seed!r:.40}")
    return RequestSpec(
        data,
        data_format=next(iter(formats)),  # type: ignore[arg-type]
        output_kind=kinds,
        bands=[bands] if isinstance(bands, (str, int)) else bands,
        seed=seed or 0,
        dates=inputs.get("dates"),
    )


def inline_outputs(outputs: Any, kinds: Iterable[str]) -> set[str]:
    """The outputs an execute request's ``outputs`` asks by value (each name one of ``kinds``)."""
    if outputs is None:
        return set()
    if not isinstance(outputs, dict):
        raise InputError("outputs: a JSON object of output name to its options is needed")
    known = list(kinds)
    wanted = set()
    for name, options in outputs.items():
        if name not in known:
            raise InputError(f"outputs: unknown output {name[:60]!r}; known: {known}")
        mode = options.get("transmissionMode", "reference") if isinstance(options, dict) else None
        if mode not in ("value", "reference"):
            raise InputError(f"outputs.{name}: give {{'transmissionMode': 'value' or 'reference'}}")
        if mode == "value":
            wanted.add(name)
    return wanted


class OgcRoutes:
    """The ``/ogcapi`` routes (see the module docstring)."""

    def __init__(
        self,
        settings: ServerSettings,
        store: Callable[[], JobStore | None],
        served: ServedEngines,
    ) -> None:
        self.settings = settings
        self._store = store
        self.served = served
        self.jobs = JobRoutes(settings, store, served, prefix=PREFIX + "/jobs")

    def register(self, app: FastAPI) -> None:
        """Add the routes."""
        w = self.jobs.wrap
        app.add_api_route(PREFIX, w(self.landing), methods=["GET"])
        app.add_api_route(PREFIX + "/conformance", w(self.conformance), methods=["GET"])
        app.add_api_route(PREFIX + "/processes", w(self.processes), methods=["GET"])
        app.add_api_route(PREFIX + "/processes/{process_id}", w(self.process), methods=["GET"])
        app.add_api_route(
            PREFIX + "/processes/{process_id}/execution", w(self.execute), methods=["POST"]
        )
        self.jobs.register(app, submit=False)

    @staticmethod
    def _base(request: Request) -> str:
        return str(request.base_url).rstrip("/") + PREFIX

    def _check_process(self, process_id: str) -> str:
        """The served model ``process_id`` names (each served model is one process)."""
        try:
            return self.served.pick(process_id)
        except UnknownNameError:
            names = self.served.names
            runs = f"{names[0]!r}" if len(names) == 1 else ", ".join(map(repr, names))
            raise NotFoundError(
                f"no such process {process_id[:80]!r}; this server runs {runs}"
            ) from None

    async def landing(self, request: Request) -> Response:
        """GET /ogcapi: the landing page."""
        on = self._store() is not None and self.settings.output_dir is not None
        return JSONResponse(landing(self._base(request), on))

    async def conformance(self, request: Request) -> Response:
        """GET /ogcapi/conformance."""
        return JSONResponse({"conformsTo": CONFORMANCE})

    async def processes(self, request: Request) -> Response:
        """GET /ogcapi/processes: one process per served model."""
        base = self._base(request)
        summaries = [process_summary(name, base) for name in self.served.names]
        links = [{"href": f"{base}/processes", "rel": "self", "type": "application/json"}]
        return JSONResponse({"processes": summaries, "links": links})

    async def process(self, request: Request, process_id: str) -> Response:
        """GET /ogcapi/processes/{processId}: its inputs and outputs."""
        model = self._check_process(process_id)
        async with self.served.lease(model) as eng:
            return JSONResponse(process_description(model, self._base(request), eng))

    async def execute(self, request: Request, process_id: str) -> Response:
        """POST .../execution: a job; async with ``Prefer: respond-async``, else awaited."""
        model = self._check_process(process_id)
        store = self.jobs.store()
        try:
            body = json.loads(await request.body())
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise InputError("the execute request must be a JSON object") from None
        if not isinstance(body, dict):
            raise InputError("the execute request must be a JSON object")
        spec = spec_of(body.get("inputs"))
        async with self.served.lease(model) as eng:
            offered = eng.engine.kinds_offered()
        inline = inline_outputs(body.get("outputs"), offered)
        job = await self.jobs.create_job(spec, inline, model=model)
        info = status_info(job, self.jobs.base(request))
        location = {"Location": info["links"][0]["href"]}
        if "respond-async" in request.headers.get("prefer", ""):
            return JSONResponse(info, 201, headers=location)
        deadline = time.monotonic() + self.settings.request_timeout_s
        while time.monotonic() < deadline:
            job = await asyncio.to_thread(store.get, job.job_id)
            if job.is_final:
                break
            await asyncio.sleep(_SYNC_POLL_S)
        if not job.is_final:
            return JSONResponse(status_info(job, self.jobs.base(request)), 201, headers=location)
        if job.status != SUCCESSFUL:
            error = job.error or {"status": 500, "title": "failed", "detail": job.message}
            status = error.get("status")
            return JSONResponse(error, status if isinstance(status, int) else 500)
        return await self.jobs.results(request, job.job_id)
