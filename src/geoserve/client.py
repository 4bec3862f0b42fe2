"""``geoserve.Client``: run requests on a geoserve server as jobs (``/v1/jobs``) from Python.

::

    import geoserve

    with geoserve.Client("http://127.0.0.1:8000", api_key=None) as client:
        job_id = client.submit("scene.tif", output_kind="classes")
        client.wait(job_id, progress=True)           # the CLI's progress bar, on stderr
        paths = client.results(job_id, dest="out")   # {"classes": Path("out/out.tif"), ...}

A local file is uploaded with the job (``POST /v1/jobs`` as a multipart upload: ``file``
parts, or one part per modality, named by the file's name); an ``http(s)://`` URL is sent as
a URL for the server to fetch (its ``--allowed-url-domain`` rules); ``server_paths=True`` sends
paths of files on the server (its ``--allowed-input-dir`` rules). The API key goes as
``Authorization: Bearer KEY``.

Whatever the server answers is untrusted: a job id must have the job id pattern of
:mod:`geoserve.jobs.store` before it is put into a URL, a download link must lead to this
server's own ``/v1/jobs/<job id>/outputs/`` and end in a plain file name, and a download may be
no larger than the size the results document gave it. Every file is written under a temporary
name beside its target and renamed into place once complete, so no partial file is ever left
under its final name. Every failure is a :class:`~geoserve.errors.GeoServeError`:
:class:`~geoserve.errors.ServerError` (the method, URL, status and the server's message),
:class:`~geoserve.errors.ServerUnreachableError`, :class:`~geoserve.errors.ServerAuthError`,
:class:`~geoserve.errors.UntrustedAnswerError`, and for a job that ended badly
:class:`~geoserve.errors.JobFailedError` or :class:`~geoserve.errors.JobDismissedError`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

import httpx

from geoserve.config import check_request_options
from geoserve.errors import (
    ConfigError,
    OutputWriteError,
    RequestTimeoutError,
    ServerError,
    ServerUnreachableError,
    UntrustedAnswerError,
)
from geoserve.job_wire import (
    MODEL_HEADER,
    JobInputs,
    JobOutput,
    JobResults,
    JobsBar,
    JobStatus,
    answer_error,
    checked_job_id,
    job_outcome,
    job_request,
    parse_results,
    parse_status,
)
from geoserve.seeds import SEED_RANGE, is_seed

#: Largest answer read whole (status and results documents, a STAC Item, a sidecar).
MAX_DOCUMENT_BYTES = 16 * 1024 * 1024
_CHUNK = 1 << 20


class Client:
    """A geoserve server's jobs: submit, status, wait, results, dismiss (see the module).

    ``url``: the server's base URL (``http://127.0.0.1:8000``); ``api_key``: its
    ``--api-key``; ``timeout``: seconds for each connection, read and write of one HTTP call
    (an upload or download may take longer in all).
    """

    def __init__(self, url: str, api_key: str | None = None, *, timeout: float = 60.0) -> None:
        parts = urlsplit(str(url).strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"server URL {str(url)[:200]!r}: give http(s)://HOST[:PORT]")
        if parts.query or parts.fragment or parts.username or parts.password:
            raise ConfigError(f"server URL {url!r}: no query, fragment or user name in it")
        self.url = f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(timeout=timeout, headers=headers, follow_redirects=False)
        self._models: list[dict[str, Any]] | None = None

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- HTTP ------------------------------------------------------------------------------

    def _call(self, method: str, path: str, **kwargs: Any) -> bytes:
        """One request to the server; its answer (at most :data:`MAX_DOCUMENT_BYTES`).

        An error status raises, naming the URL and the server's message.
        """
        url = self.url + path
        try:
            with self._http.stream(method, url, **kwargs) as answer:
                body = _read_capped(answer, method, url)
        except httpx.TimeoutException:
            raise ServerUnreachableError(
                f"{method} {url}: the server did not answer in time"
            ) from None
        except httpx.HTTPError as exc:
            raise ServerUnreachableError(
                f"{method} {url}: cannot reach the server ({exc})"
            ) from None
        if answer.status_code >= 300:
            raise answer_error(
                method, url, answer.status_code, body, answer.headers.get("location", "")
            )
        return body

    def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        body = self._call(method, path, **kwargs)
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):
            raise UntrustedAnswerError(
                f"{method} {self.url + path}: the answer is not JSON ({body[:80]!r})"
            ) from None
        if not isinstance(data, dict):
            raise UntrustedAnswerError(f"{method} {self.url + path}: the answer is no object")
        return data

    def _job_path(self, job_id: str) -> str:
        return f"/v1/jobs/{checked_job_id(job_id, self.url)}"

    # -- the served models ---------------------------------------------------------------------

    def models(self) -> list[dict[str, Any]]:
        """Every served model as ``GET /v1/models`` describes it (``id``, ``input``, ...)."""
        if self._models is None:
            data = self._json("GET", "/v1/models").get("data")
            if not isinstance(data, list) or not data:
                raise UntrustedAnswerError(f"GET {self.url}/v1/models: no model listed")
            for entry in data:
                if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
                    raise UntrustedAnswerError(f"GET {self.url}/v1/models: a model has no name")
            if not all(entry.get("ready") and "input" in entry for entry in data):
                return data  # (asked again next time: one loads, or has never loaded)
            self._models = data
        return self._models

    def model(self, name: str | None = None) -> dict[str, Any]:
        """The served model ``name`` as ``GET /v1/models`` describes it.

        Its ``id``, ``input``, ``output`` and ``runtime``; ``None``: the one the server serves.

        Raises:
            ConfigError: ``name`` is not served there, or ``None`` and several are.
        """
        models = self.models()
        ids = [entry["id"] for entry in models]
        if name is None:
            if len(models) > 1:
                raise ConfigError(
                    f"the server at {self.url} serves {len(ids)} models "
                    f"({', '.join(ids)}); name one (--model NAME, or model=NAME)"
                )
            return models[0]
        if name not in ids:
            served = f"model {ids[0]!r}" if len(ids) == 1 else f"models {', '.join(ids)}"
            raise ConfigError(f"the server at {self.url} serves {served}, not {name!r}")
        return models[ids.index(name)]

    # -- jobs -------------------------------------------------------------------------------

    def submit(
        self,
        inputs: JobInputs,
        *,
        model: str | None = None,
        output_kind: str | Sequence[str] | None = None,
        bands: Sequence[int | str] | None = None,
        dates: Any = None,
        priority: int = 0,
        seed: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        server_paths: bool = False,
    ) -> str:
        """Start a job running ``inputs``; its job id.

        ``inputs``: one scene, a list (the dates of one place) or a dict of modality name to a
        scene or its dates. Each is a local file (uploaded), bytes (uploaded), an
        ``http(s)://`` URL, or with ``server_paths`` a path on the server; one job's inputs
        are all of one of these. ``model``: the served model to run it, checked against those
        the server serves (needed when it serves several). ``output_kind``, ``bands``,
        ``dates``, ``priority`` and ``seed`` (of a generative model's random draws; None: the
        server's default, 0), ``temperature``, ``top_p`` and ``top_k`` (a generative model's
        sampling; None: the server's) mean what they mean for ``Engine.generate_image`` and
        ``POST /v1/images``.

        Raises:
            ConfigError: a model the server does not serve, or a seed that is not an integer
                from 0 to 2**63 - 1 (naming ``seed``); InputError: inputs of mixed
                kinds, or dates with uploaded modalities; RasterReadError: a local file that
                does not exist; ServerError: the server refused the job (its message).
        """
        sent = None
        if model is not None:
            self.model(model)  # (refused here, before any upload, if it is not served)
            # a one-model server runs it without the name (as servers before several did)
            sent = model if len(self.models()) > 1 else None
        options: dict[str, Any] = {}
        if seed is not None:
            if not is_seed(seed):
                raise ConfigError(f"seed: {SEED_RANGE}, got {seed!r:.40}")
            options["seed"] = seed
        sampling = {"temperature": temperature, "top_p": top_p, "top_k": top_k}
        options.update(check_request_options({k: v for k, v in sampling.items() if v is not None}))
        if bands is not None:
            options["bands"] = list(bands)
        if isinstance(output_kind, str):
            options["output_kind"] = output_kind
        elif output_kind is not None:
            options["output_kinds"] = list(output_kind)
        # (the model also in Ray Serve's header: behind Ray, it goes to a replica holding it)
        headers = {MODEL_HEADER: sent} if sent is not None else {}
        with job_request(inputs, options, dates, priority, server_paths, sent) as body:
            answer = self._json("POST", "/v1/jobs", headers=headers, **body)
        return checked_job_id(answer.get("jobID"), f"POST {self.url}/v1/jobs")

    def status(self, job_id: str) -> JobStatus:
        """The job's status, progress, message and times."""
        path = self._job_path(job_id)
        return parse_status(self._json("GET", path), job_id, f"GET {self.url}{path}")

    def wait(
        self,
        job_id: str,
        *,
        progress: bool | Callable[[JobStatus], None] = False,
        poll: float = 0.5,
        timeout: float | None = None,
    ) -> JobStatus:
        """Poll the job every ``poll`` seconds until it ends; its final status.

        ``progress``: ``True`` draws the CLI's progress bar on stderr
        (:class:`geoserve.progress.Progress`: patches done out of all); a callable is given
        each status polled.

        Raises:
            JobFailedError: the job failed (the server's message); JobDismissedError: it was
                dismissed; RequestTimeoutError: it had not ended after ``timeout`` seconds.
        """
        bar = JobsBar() if progress is True else None
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            st = self.status(job_id)
            if callable(progress):
                progress(st)
            if bar is not None:
                bar.show([st])
            if st.done:
                return job_outcome(st)
            if deadline is not None and time.monotonic() >= deadline:
                raise RequestTimeoutError(f"job {job_id} is still {st.status} after {timeout:g} s")
            time.sleep(poll)

    def results_document(self, job_id: str) -> JobResults:
        """A successful job's results document, every link checked (see the module)."""
        path = self._job_path(job_id)
        where = f"GET {self.url}{path}/results"
        data = self._json("GET", f"{path}/results")
        return parse_results(data, job_id, f"{self.url}{path}/outputs/", where)

    def stac_item(self, job_id: str) -> dict[str, Any] | None:
        """A successful job's STAC Item as JSON; ``None`` when the server gives none.

        Its asset hrefs are relative to its own download link: the outputs' file names.
        """
        link = self.results_document(job_id).stac_item
        if link is None:
            return None
        item = self._json("GET", link[len(self.url) :])
        if item.get("type") != "Feature" or not isinstance(item.get("assets"), dict):
            raise UntrustedAnswerError(f"GET {link}: not a STAC Item")
        return item

    def results(
        self,
        job_id: str,
        dest: str | os.PathLike[str] | None = None,
        *,
        names: Mapping[str, str | os.PathLike[str]] | None = None,
    ) -> dict[str, Path]:
        """Download a successful job's outputs; each kind's local path (``stac-item``: its Item).

        Each goes to ``names[kind]`` if given, else into the directory ``dest`` (created)
        under the server's file name (``out.tif``; use one directory per job). A class map's
        sidecar goes beside it as ``<file>.aux.xml``. Nothing is renamed into place until
        every file has arrived whole; on any error none is left.

        Raises:
            JobFailedError / JobDismissedError: the job did not succeed; ServerError: a
                download failed; UntrustedAnswerError: a link or size the client refuses.
        """
        st = self.status(job_id)
        if st.status != "successful":
            job_outcome(st)  # (raises for a failed or dismissed job)
            raise ServerError(f"job {job_id} has no results yet: it is {st.status}")
        doc = self.results_document(job_id)
        chosen = dict(names or {})
        folder = Path(dest) if dest is not None else None
        plan: list[_Download] = []
        found: dict[str, Path] = {}
        links = [(k, o.href, o.size) for k, o in doc.outputs.items()]
        if doc.stac_item is not None:
            links.append(("stac-item", doc.stac_item, None))
        for key, href, size in links:
            if key in chosen:
                target = Path(chosen[key])
            elif folder is not None:
                target = folder / href.rsplit("/", 1)[-1]
            else:
                continue
            found[key] = target
            plan.append(_Download(href, target, size))
            sidecar = doc.outputs[key].sidecar if key in doc.outputs else None
            if sidecar is not None:
                plan.append(_Download(sidecar, target.with_name(target.name + ".aux.xml")))
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
        self._download_all(plan)
        return found

    def _download_all(self, plan: Sequence[_Download]) -> None:
        """Every link to a temporary beside its target, then all renamed into place."""
        from geoserve.raster import tempfiles

        done: list[tuple[Path, Path]] = []
        target = None
        try:
            for item in plan:
                target = item.target
                tmp = tempfiles.new_temporary(target)
                done.append((tmp, target))
                with tmp.open("wb") as out:
                    self._stream(item, out)
            for tmp, target in sorted(done, key=lambda d: not d[1].name.endswith(".aux.xml")):
                os.replace(tmp, target)  # (a sidecar first, as a local run commits it)
                tempfiles.release(tmp, remove=False)
        except OSError as exc:
            raise OutputWriteError(f"{target}: cannot write it ({exc.strerror or exc})") from None
        finally:
            for tmp, _ in done:
                if tmp.exists():
                    tempfiles.release(tmp, remove=True)

    def _stream(self, item: _Download, out: IO[bytes]) -> None:
        """Copy one download into ``out``.

        Exactly its announced size, or at most :data:`MAX_DOCUMENT_BYTES` when none was.
        """
        got, href = 0, item.href
        cap = item.size if item.size is not None else MAX_DOCUMENT_BYTES
        try:
            with self._http.stream("GET", href) as answer:
                if answer.status_code >= 300:
                    body = _read_capped(answer, "GET", href)
                    where = answer.headers.get("location", "")
                    raise answer_error("GET", href, answer.status_code, body, where)
                for chunk in answer.iter_bytes(_CHUNK):
                    got += len(chunk)
                    if got > cap:
                        raise UntrustedAnswerError(
                            f"GET {href}: more than the {cap} bytes "
                            f"{'the results document said' if item.size is not None else 'taken'}"
                        )
                    out.write(chunk)
        except httpx.HTTPError as exc:
            raise ServerUnreachableError(f"GET {href}: the download broke off ({exc})") from None
        if item.size is not None and got != item.size:
            raise ServerError(f"GET {href}: {got} bytes arrived of the {item.size} announced")

    def dismiss(self, job_id: str) -> JobStatus:
        """Dismiss the job; its status after.

        A queued job never runs, a running one is cancelled; its outputs are removed.
        """
        self._json("DELETE", self._job_path(job_id))
        return self.status(job_id)

    def run(
        self,
        inputs: JobInputs,
        dest: str | os.PathLike[str],
        *,
        progress: bool = False,
        **options: Any,
    ) -> dict[str, Path]:
        """:meth:`submit`, :meth:`wait` and :meth:`results` into ``dest``, in one call."""
        job_id = self.submit(inputs, **options)
        self.wait(job_id, progress=progress)
        return self.results(job_id, dest)


@dataclass(frozen=True)
class _Download:
    """One file to fetch: its link, where it goes, the size the server announced."""

    href: str
    target: Path
    size: int | None = None


def _read_capped(answer: httpx.Response, method: str, url: str) -> bytes:
    """The answer's body, refused past :data:`MAX_DOCUMENT_BYTES`."""
    chunks, got = [], 0
    for chunk in answer.iter_bytes(_CHUNK):
        got += len(chunk)
        if got > MAX_DOCUMENT_BYTES:
            raise UntrustedAnswerError(
                f"{method} {url}: an answer over {MAX_DOCUMENT_BYTES // (1 << 20)} MB"
            )
        chunks.append(chunk)
    return b"".join(chunks)


__all__ = ["Client", "JobOutput", "JobResults", "JobStatus"]
