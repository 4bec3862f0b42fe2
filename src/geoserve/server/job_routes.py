"""Asynchronous jobs over HTTP: ``/v1/jobs`` (the job store's jobs, run by ``JobRunner``).

``POST /v1/jobs`` takes the JSON body of ``POST /v1/images`` (its ``model``, one of the served
models, optional when the server serves one, is the job's process) and answers 201 with the job's
status and ``Location: /v1/jobs/{jobId}``. ``GET /v1/jobs`` lists jobs (``status``, ``limit``,
``offset``), ``GET /v1/jobs/{jobId}`` is a job's status (OGC API - Processes' ``statusInfo``:
``jobID``, ``type: process``, ``status``, times, ``progress`` 0-100, ``message``),
``GET /v1/jobs/{jobId}/results`` its outputs by reference (download links under
``/v1/jobs/{jobId}/outputs/``), or inline (base64 ``value``, ``mediaType``, ``encoding``) with
``Prefer: return=representation`` or for the outputs its execution asked by value, each of at
most ``max_inline_mb`` (a larger one stays a link), and ``DELETE /v1/jobs/{jobId}``
dismisses it (a running job is cancelled, its outputs removed). Errors are OGC exception
bodies (``type``, ``title``, ``status``, ``detail``); past ``max_jobs`` queued or running, or
with a failing store (:class:`~geoserve.errors.JobStoreError`), a 503 with ``Retry-After``.
``POST /v1/jobs`` also takes the multipart upload of ``/v1/images`` (``file`` parts, or one
part per modality; ``options``, ``priority`` and ``dates`` fields), bounded by the body limit
as that route's uploads are: a client sends its own files so. Inputs sent inline
(``b64_json``) or uploaded are written into the job's input directory when it is submitted
(an upload's part file names kept beside them, for messages and date stamps only), so the
store holds no large values and a restart re-runs the job from disk; paths and URLs are kept
as named and vetted when the job runs. A class map's ``.aux.xml``
sidecar (its class names) is a download of its own, linked from its output as ``sidecar``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import re
import shutil
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response

from geoserve.engine.request_spec import RequestSpec
from geoserve.errors import (
    ForbiddenInputError,
    GeoServeError,
    InputError,
    JobStoreError,
    NotFoundError,
    PayloadTooLargeError,
    QueueFullError,
    count,
)
from geoserve.jobs import ACCEPTED, RUNNING, SUCCESSFUL, Job, JobStore, checked_job_id
from geoserve.jobs.runner import job_dir, remove_inputs, remove_job_dir
from geoserve.raster.input_values import NamedBytes
from geoserve.raster.source import DataFormat
from geoserve.server.api_models import ImagesRequest, parse_json, validation_message
from geoserve.server.errors import ogc_exception
from geoserve.server.gather import parse_multipart
from geoserve.server.inputs import check_url, resolve_input_path
from geoserve.server.served import ServedEngines
from geoserve.server.settings import ServerSettings
from geoserve.stac_query import StacSearch

_IN_FORMATS: dict[str, DataFormat] = {
    "b64_json": "b64",
    "path": "path",
    "url": "url",
    "auto": "auto",  # (a STAC search)
}
#: The media type of a class map's ``.aux.xml`` sidecar.
SIDECAR_TYPE = "application/xml"
#: The preference (RFC 7240) asking for a job's outputs inline in its results.
INLINE_PREFERENCE = "return=representation"
_MB = 1024 * 1024

logger = logging.getLogger("geoserve.server")


def prefers_inline(request: Request) -> bool:
    """Whether the request's ``Prefer`` header holds ``return=representation``."""
    tokens = re.split(r"[,;]", request.headers.get("prefer", ""))
    return any(t.replace(" ", "").lower() == INLINE_PREFERENCE for t in tokens)


def _read_inline(path: Path, limit: int) -> str | None:
    """``path``'s bytes in base64 if it holds at most ``limit`` bytes, else ``None``."""
    with path.open("rb") as file:
        data = file.read(limit + 1)
    return None if len(data) > limit else base64.b64encode(data).decode("ascii")


def ogc_error(exc: GeoServeError, retry_after_s: int) -> JSONResponse:
    """An OGC exception response for ``exc``."""
    body = ogc_exception(exc)
    headers = {"Retry-After": str(retry_after_s)} if body["status"] == 503 else None
    return JSONResponse(body, body["status"], headers=headers)


def status_info(job: Job, base: str) -> dict[str, Any]:
    """A job as OGC API - Processes 1.0's ``statusInfo``."""

    def when(value: Any) -> str | None:
        return None if value is None else value.isoformat()

    links = [{"href": f"{base}/{job.job_id}", "rel": "self", "type": "application/json"}]
    if job.status == SUCCESSFUL:
        links.append(
            {
                "href": f"{base}/{job.job_id}/results",
                "rel": "http://www.opengis.net/def/rel/ogc/1.0/results",
                "type": "application/json",
            }
        )
    info: dict[str, Any] = {
        "jobID": job.job_id,
        "processID": job.process_id,
        "type": "process",
        "status": job.status,
        "message": job.message,
        "created": when(job.created),
        "started": when(job.started),
        "finished": when(job.finished),
        "updated": when(job.updated),
        "progress": job.progress,
        "links": links,
    }
    if job.error is not None:
        info["exception"] = job.error
    return info


class JobRoutes:
    """The ``/v1/jobs`` routes over one store (``None``: jobs are off, without --output-dir)."""

    def __init__(
        self,
        settings: ServerSettings,
        store: Callable[[], JobStore | None],
        served: ServedEngines,
        prefix: str = "/v1/jobs",
    ) -> None:
        self.settings = settings
        self.prefix = prefix
        self._store = store
        self.served = served

    def store(self) -> JobStore:
        """The job store, or why there is none."""
        store = self._store()
        if store is None or self.settings.output_dir is None:
            raise ForbiddenInputError(
                "jobs are disabled on this server (start it with --output-dir DIR)"
            )
        return store

    @property
    def output_dir(self) -> Path:
        """Where jobs write (set whenever there is a store)."""
        assert self.settings.output_dir is not None
        return self.settings.output_dir

    def register(self, app: FastAPI, *, submit: bool = True) -> None:
        """Add the routes under the prefix (``submit``: with ``POST`` of a new job)."""
        prefix = self.prefix
        if submit:
            app.add_api_route(prefix, self._wrap(self.submit), methods=["POST"])
        app.add_api_route(prefix, self._wrap(self.list_jobs), methods=["GET"])
        app.add_api_route(prefix + "/{job_id}", self._wrap(self.status), methods=["GET"])
        app.add_api_route(prefix + "/{job_id}", self._wrap(self.dismiss), methods=["DELETE"])
        app.add_api_route(prefix + "/{job_id}/results", self._wrap(self.results), methods=["GET"])
        app.add_api_route(
            prefix + "/{job_id}/outputs/{name}", self._wrap(self.download), methods=["GET"]
        )

    def wrap(self, route: Callable[..., Any]) -> Callable[..., Any]:
        """``route`` as a handler whose errors are OGC exception responses."""
        return self._wrap(route)

    def _wrap(self, route: Callable[..., Any]) -> Callable[..., Any]:
        async def handler(request: Request) -> Response:
            try:
                return await route(request, **request.path_params)  # type: ignore[no-any-return]
            except GeoServeError as exc:
                if isinstance(exc, JobStoreError):  # the operator's to mend: in the log too
                    logger.error("%s %s: %s", request.method, request.url.path, exc)
                return ogc_error(exc, self.settings.retry_after_s)
            except RequestValidationError as exc:  # a body of the wrong shape
                return ogc_error(InputError(validation_message(exc.errors())), 0)

        handler.__name__ = route.__name__
        return handler

    def base(self, request: Request) -> str:
        """The jobs' URL, as the client reached this server."""
        return str(request.base_url).rstrip("/") + self.prefix

    async def submit(self, request: Request) -> Response:
        """POST: a new job running the body (as ``/v1/images``'s JSON), 201 + Location."""
        self.store()
        items: Any
        data_format: DataFormat
        if request.headers.get("content-type", "").startswith("multipart/form-data"):
            body, items = await parse_multipart(request)
            data_format = "bytes"
        else:
            body = await parse_json(
                ImagesRequest, await request.body(), request.headers.get("content-type", "")
            )
            items, data_format = body.inputs(), _IN_FORMATS[body.input_format]
        model = self.served.pick(body.model)
        spec = RequestSpec(
            items,
            data_format=data_format,
            bands=body.options.bands,
            output_kind=body.options.kinds,
            priority=body.priority,
            seed=body.options.seed or 0,
            temperature=body.options.temperature,
            top_p=body.options.top_p,
            top_k=body.options.top_k,
            dates=body.dates,
        )
        job = await self.create_job(spec, model=model)
        info = status_info(job, self.base(request))
        return JSONResponse(info, 201, headers={"Location": info["links"][0]["href"]})

    async def create_job(
        self, spec: RequestSpec, inline: Iterable[str] = (), *, model: str | None = None
    ) -> Job:
        """A new job of ``model`` running ``spec``, checked and vetted first (503: max_jobs).

        ``inline``: the outputs its results give inline (when small enough); ``model``: a
        served model (``None``: the one served), the job's process.
        """
        store = self.store()
        model = self.served.pick(model)
        async with self.served.lease(model) as eng:
            spec = RequestSpec.of(spec, out_format="path").check(eng.engine, upfront=True)
        queued = await asyncio.to_thread(store.count, (ACCEPTED, RUNNING))
        if queued >= self.settings.max_jobs:
            raise QueueFullError(
                f"{count(queued, 'job')} queued or running, the most this server takes"
                f" (max_jobs {self.settings.max_jobs}); submit again once one has finished"
            )
        self._vet(spec)
        stored, staging = self._stored(spec)
        if inline:
            stored["job_inline"] = sorted(set(inline))
        try:
            return await asyncio.to_thread(store.create, model, stored)
        except BaseException:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
            raise

    def _vet(self, spec: RequestSpec) -> None:
        """Refuse paths outside the allowed roots and URLs of other hosts at submission.

        They are vetted again, and fetched, when the job runs.
        """
        given: Any = spec.inputs
        values = [x for v in given.values() for x in v] if isinstance(given, dict) else given
        for value in values:
            if isinstance(value, StacSearch):
                check_url(value.url, self.settings.allowed_url_domains)
            elif spec.data_format == "path":
                resolve_input_path(str(value), self.settings.allowed_input_dirs)
            elif spec.data_format == "url":
                check_url(str(value), self.settings.allowed_url_domains)

    def _stored(self, spec: RequestSpec) -> tuple[dict[str, Any], Path | None]:
        """The spec to store; base64 and uploaded inputs written to files of a fresh directory.

        An upload's part file names are kept in ``job_names`` (for messages and date stamps).
        """
        if spec.data_format not in ("b64", "bytes"):
            return spec.to_json(), None
        limit = int(self.settings.max_inline_mb * 1024 * 1024)
        name = f"in-{uuid.uuid4().hex}"
        staging = self.output_dir / "jobs" / name
        staging.mkdir(parents=True)
        names: dict[str, str] = {}

        def write(value: Any) -> str:
            file = f"input-{len(names)}.tif"
            if isinstance(value, NamedBytes):  # an upload (bounded by the body limit)
                raw, shown = value.data, value.name[:200]
            elif not isinstance(value, str) or len(value) * 3 // 4 > limit:
                raise PayloadTooLargeError(
                    f"an inline job input is over {self.settings.max_inline_mb:g} MB"
                )
            else:
                try:
                    raw, shown = base64.b64decode(value, validate=True), file
                except (binascii.Error, ValueError):
                    raise InputError(f"inputs[{len(names)}]: not valid base64") from None
            names[file] = shown
            (staging / file).write_bytes(raw)
            return file

        try:
            given: Any = spec.inputs
            files: Any
            if isinstance(given, dict):
                files = {k: [write(x) for x in v] for k, v in given.items()}
            else:
                files = [write(x) for x in given]
            data = RequestSpec.of(spec, inputs=files, data_format="b64").to_json()
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        data["data_format"] = "bytes"
        data["job_files"] = name
        if spec.data_format == "bytes":
            data["job_names"] = names
        return data, staging

    async def list_jobs(self, request: Request) -> Response:
        """GET: a page of jobs, newest first (``status``, ``limit``, ``offset``)."""
        store = self.store()
        q = request.query_params
        try:
            limit, offset = int(q.get("limit", "10")), int(q.get("offset", "0"))
        except ValueError:
            raise InputError("limit and offset must be whole numbers") from None
        statuses = q.getlist("status") or None
        jobs, total = await asyncio.to_thread(store.list, statuses, None, limit, offset)
        base = self.base(request)
        links = [{"href": base, "rel": "self", "type": "application/json"}]
        if offset + len(jobs) < total:
            links.append({"href": f"{base}?limit={limit}&offset={offset + limit}", "rel": "next"})
        return JSONResponse(
            {"jobs": [status_info(j, base) for j in jobs], "numberMatched": total, "links": links}
        )

    async def status(self, request: Request, job_id: str) -> Response:
        """GET: the job's status."""
        job = await asyncio.to_thread(self.store().get, job_id)
        return JSONResponse(status_info(job, self.base(request)))

    async def results(self, request: Request, job_id: str) -> Response:
        """GET: a successful job's outputs, as download links or inline (see the module)."""
        job = await asyncio.to_thread(self.store().get, job_id)
        if job.status != SUCCESSFUL or job.results is None:
            raise NotFoundError(f"job {job.job_id} has no results (it is {job.status})")
        base = f"{self.base(request)}/{job.job_id}/outputs"
        every = prefers_inline(request)
        asked = job.spec.get("job_inline")
        by_value = set(asked) if isinstance(asked, list) else set()
        limit = int(self.settings.max_inline_mb * _MB)
        outputs = job.results.get("outputs", {})
        answer: dict[str, Any] = {}
        inlined = False
        for kind, o in outputs.items():
            entry: dict[str, Any] = {
                "href": f"{base}/{o['file']}",
                "type": o["media_type"],
                "size": o["size"],
            }
            if (every or kind in by_value) and o["size"] <= limit:
                path = job_dir(self.output_dir, job.job_id) / o["file"]
                try:
                    value = await asyncio.to_thread(_read_inline, path, limit)
                except OSError:  # (dismissed or expired since)
                    raise NotFoundError(f"job {job.job_id}: its output {kind!r} is gone") from None
                if value is not None:  # OGC API - Processes' qualified value
                    entry = {"value": value, "mediaType": o["media_type"], "encoding": "base64"}
                    inlined = True
            if isinstance(o.get("sidecar"), str):  # a class map's class names, for GIS tools
                entry["sidecar"] = {"href": f"{base}/{o['sidecar']}", "type": SIDECAR_TYPE}
            answer[kind] = entry
        item = job.results.get("item")
        if isinstance(item, str):  # the outputs described as a STAC Item
            answer["stac-item"] = {"href": f"{base}/{item}", "type": "application/geo+json"}
        applied = {"Preference-Applied": INLINE_PREFERENCE} if every and inlined else None
        return JSONResponse(answer, headers=applied)

    async def download(self, request: Request, job_id: str, name: str) -> Response:
        """GET: one output file of a successful job (only the files its results name)."""
        job = await asyncio.to_thread(self.store().get, job_id)
        files: dict[str, str] = {}
        for o in (job.results or {}).get("outputs", {}).values():
            if job.status == SUCCESSFUL:
                files[o["file"]] = o["media_type"]
                if isinstance(o.get("sidecar"), str):
                    files[o["sidecar"]] = SIDECAR_TYPE
        item = (job.results or {}).get("item")
        if job.status == SUCCESSFUL and isinstance(item, str):
            files[item] = "application/geo+json"
        if name not in files:
            raise NotFoundError(f"job {job.job_id} has no output {name[:80]!r}")
        return FileResponse(job_dir(self.output_dir, job.job_id) / name, media_type=files[name])

    async def dismiss(self, request: Request, job_id: str) -> Response:
        """DELETE: dismiss the job; a running one is cancelled by its worker."""
        store = self.store()
        job_id = checked_job_id(job_id)
        before = await asyncio.to_thread(store.get, job_id)
        job = await asyncio.to_thread(store.dismiss, job_id)
        if before.status != RUNNING:  # (a running job's worker removes what it wrote)
            remove_job_dir(self.output_dir, job.job_id)
        remove_inputs(self.output_dir, job)
        return JSONResponse(status_info(job, self.base(request)))
