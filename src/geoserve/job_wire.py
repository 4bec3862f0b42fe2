"""What travels between :class:`geoserve.Client` and a server's job routes (``/v1/jobs``).

Out: ``job_request``, a job's body: local files (and bytes) as a multipart upload (``file``
parts, or one part per modality, each named by its file's name, streamed from the open file),
URLs and server paths as JSON. Back, read as untrusted:
``JobStatus`` (OGC API - Processes' ``statusInfo``: status, progress 0-100, message, times, a
failed job's exception), ``JobResults`` and ``JobOutput`` (the results document: each output
kind's download link, media type, size and class-name sidecar, and the STAC Item's link), each
read from JSON that is checked first: a job id must have the job id pattern of
:mod:`geoserve.jobs.store`, a link must lead to this job's own downloads on the same server and
end in a plain file name. ``answer_error`` turns an error answer (the server's problem JSON)
into the :class:`~geoserve.errors.GeoServeError` to raise, ``job_outcome`` a failed or
dismissed job into its error, and ``JobsBar`` draws the command line's progress bar
(:class:`geoserve.progress.Progress`) over one or more jobs from their statuses.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from geoserve.errors import (
    InputError,
    JobDismissedError,
    JobFailedError,
    RasterReadError,
    ServerAuthError,
    ServerError,
    UntrustedAnswerError,
)
from geoserve.jobs.store import FINAL_STATUSES, STATUSES, is_job_id
from geoserve.stac_query import StacSearch

#: The header that also names a job's model (Ray Serve's: its proxy sends the request to a
#: replica that has that model loaded; a geoserve server reads it where the body names none).
MODEL_HEADER = "serve_multiplexed_model_id"

#: A file name a download may be written under: no path, no leading dot, no encoding.
FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
#: The status message of a running job: ``<done>/<total> patches``.
_PATCHES = re.compile(r"(\d+)/(\d+) patches")

#: A job's inputs: a file (or URL), a list (the dates of one place), or modality -> file(s).
JobInputs = str | os.PathLike[str] | bytes | StacSearch | Sequence[Any] | Mapping[str, Any]


@dataclass(frozen=True)
class JobStatus:
    """A job as its server last described it (OGC API - Processes' ``statusInfo``)."""

    job_id: str
    #: ``accepted``, ``running``, ``successful``, ``failed`` or ``dismissed``
    status: str
    #: 0 to 100: patches done out of all
    progress: int
    message: str
    created: datetime | None
    started: datetime | None
    finished: datetime | None
    updated: datetime | None
    #: a failed job's OGC exception body (``type``, ``title``, ``status``, ``detail``)
    error: dict[str, Any] | None = None

    @property
    def done(self) -> bool:
        """Whether the job has ended (``successful``, ``failed`` or ``dismissed``)."""
        return self.status in FINAL_STATUSES

    @property
    def patches(self) -> tuple[int, int] | None:
        """(patches done, patches in all) when the server's message says; else ``None``."""
        match = _PATCHES.fullmatch(self.message)
        if match is None:
            return None
        done, total = int(match[1]), int(match[2])
        return (min(done, total), total)

    @property
    def seconds(self) -> float | None:
        """How long it ran (started to finished), when the server says."""
        if self.started is None or self.finished is None:
            return None
        with contextlib.suppress(TypeError):  # (one with a time zone, one without)
            return max(0.0, (self.finished - self.started).total_seconds())
        return None


@dataclass(frozen=True)
class JobOutput:
    """One output of a successful job: its download link, media type, size and sidecar."""

    kind: str
    href: str
    media_type: str
    #: bytes, as the results document says (a download may be no larger)
    size: int | None
    #: the download link of a class map's ``.aux.xml`` sidecar (its class names), or ``None``
    sidecar: str | None = None

    @property
    def name(self) -> str:
        """The file name the server gives it (the link's last part, checked)."""
        return self.href.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class JobResults:
    """A successful job's results document: each output kind's, and its STAC Item's link."""

    job_id: str
    outputs: dict[str, JobOutput]
    stac_item: str | None


def checked_job_id(value: Any, where: str) -> str:
    """``value`` if it has the job id pattern (only then is it put into a URL)."""
    if not is_job_id(value):
        shown = str(value)[:80] if isinstance(value, str) else type(value).__name__
        raise UntrustedAnswerError(f"{where}: {shown!r} is not a job id (job- and 32 hex digits)")
    return str(value)


def _when(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def parse_status(data: Mapping[str, Any], job_id: str, where: str) -> JobStatus:
    """A ``statusInfo`` document of job ``job_id`` as a :class:`JobStatus`."""
    status = data.get("status")
    if data.get("jobID") != job_id or status not in STATUSES:
        raise UntrustedAnswerError(f"{where}: not the status of job {job_id}")
    progress = data.get("progress")
    error = data.get("exception")
    message = data.get("message")
    return JobStatus(
        job_id,
        str(status),
        min(max(progress, 0), 100) if isinstance(progress, int) else 0,
        message[:1000] if isinstance(message, str) else "",
        _when(data.get("created")),
        _when(data.get("started")),
        _when(data.get("finished")),
        _when(data.get("updated")),
        error if isinstance(error, dict) else None,
    )


def checked_link(href: Any, prefix: str, where: str) -> str:
    """``href`` if it starts with ``prefix`` (this job's downloads) and then names a file."""
    if not isinstance(href, str) or not href.startswith(prefix):
        raise UntrustedAnswerError(
            f"{where}: the link {str(href)[:120]!r} is not a download of this job on this server"
        )
    name = href[len(prefix) :]
    if not FILE_NAME.fullmatch(name):
        raise UntrustedAnswerError(f"{where}: {name[:120]!r} is not a plain file name")
    return href


def parse_results(data: Mapping[str, Any], job_id: str, prefix: str, where: str) -> JobResults:
    """A results document as :class:`JobResults`; every link under ``prefix``."""
    outputs: dict[str, JobOutput] = {}
    item = None
    for key, value in data.items():
        if not isinstance(value, dict):
            raise UntrustedAnswerError(f"{where}: {str(key)[:40]!r} is not a link")
        href = checked_link(value.get("href"), prefix, where)
        if key == "stac-item":
            item = href
            continue
        if not FILE_NAME.fullmatch(str(key)):
            raise UntrustedAnswerError(f"{where}: {str(key)[:40]!r} is not an output kind")
        side, size = value.get("sidecar"), value.get("size")
        outputs[str(key)] = JobOutput(
            str(key),
            href,
            str(value.get("type") or "application/octet-stream")[:200],
            size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None,
            checked_link(side.get("href"), prefix, where) if isinstance(side, dict) else None,
        )
    return JobResults(job_id, outputs, item)


def answer_error(method: str, url: str, status: int, body: bytes, location: str) -> ServerError:
    """The error to raise for an answer with ``status`` (3xx, 4xx or 5xx), in the server's words.

    A redirect is never followed: it is an :class:`UntrustedAnswerError`; 401 is a
    :class:`ServerAuthError`.
    """
    if status < 400:
        return UntrustedAnswerError(
            f"{method} {url}: redirected ({status}) to {location[:200]!r}; not followed"
        )
    text = body[:300].decode("utf-8", "replace").strip()
    message, title = "".join(c for c in text if c.isprintable()), ""
    with contextlib.suppress(ValueError, RecursionError):
        doc = json.loads(body)
        if isinstance(doc, dict):
            said = doc.get("detail") or doc.get("message")
            message = str(said)[:1000] if said else message
            title = str(doc.get("title") or doc.get("type") or "")[:80]
    what = f"{method} {url}: {status}" + (f" {title}" if title else "")
    if status == 401:
        return ServerAuthError(f"{what}: {message} (give the server's API key)", 401)
    return ServerError(f"{what}: {message or 'no message'}", status)


def job_outcome(st: JobStatus) -> JobStatus:
    """A final status as it is when successful; a failed or dismissed job's error raised."""
    if st.status == "failed":
        detail = (st.error or {}).get("detail") or st.message or "failed"
        raise JobFailedError(f"job {st.job_id} failed: {detail}", st.error)
    if st.status == "dismissed":
        raise JobDismissedError(f"job {st.job_id} was dismissed", st.error)
    return st


class JobsBar:
    """The command line's progress bar over one or more jobs (their patches added up).

    Drawn once a job's status says its patch count; a successful job counts as all done.
    """

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.counts: dict[str, tuple[int, int]] = {}
        self.progress: Any = None
        self.started = time.perf_counter()  # (the rate counts from here, not the first count)

    def show(self, statuses: Sequence[JobStatus], *, final: bool = False) -> None:
        """Record the jobs' latest statuses and draw.

        The last line is drawn when ``final``, or when every one of ``statuses`` has ended.
        """
        from geoserve.progress import Progress

        for st in statuses:
            known = st.patches
            if known is not None:
                whole = st.status == "successful"
                self.counts[st.job_id] = (known[1], known[1]) if whole else known
        total = sum(t for _, t in self.counts.values())
        if not total:
            return
        final = final or (bool(statuses) and all(st.done for st in statuses))
        if self.progress is None:
            self.progress = Progress(total, self.stream, tty=self.stream.isatty())
            self.progress.start = self.started
        self.progress.total = total
        self.progress.update(sum(d for d, _ in self.counts.values()), final=final)

    @property
    def patches(self) -> int:
        """Patches counted so far, over every job."""
        return sum(d for d, _ in self.counts.values())


# -- the request -------------------------------------------------------------------------------


@contextlib.contextmanager
def job_request(
    inputs: JobInputs,
    options: dict[str, Any],
    dates: Any,
    priority: int,
    server_paths: bool,
    model: str | None = None,
) -> Iterator[dict[str, Any]]:
    """The keyword arguments of httpx's ``POST /v1/jobs`` for ``inputs`` (files kept open).

    ``model``: the served model to run it (sent only when given).

    Raises:
        InputError: inputs of mixed kinds (URLs and files), none, a local STAC Item, or dates
            with uploaded modalities; RasterReadError: a local file that cannot be opened.
    """
    if isinstance(inputs, StacSearch):  # run by the server, at its catalogue
        search = {k: v for k, v in inputs.to_json().items() if v is not None}
        asked: dict[str, Any] = {"stac": search, "options": options, "priority": priority}
        if model is not None:
            asked["model"] = model
        yield {"json": asked}
        return
    kind = _kind_of(_leaves(inputs), server_paths)
    if kind != "upload":
        body: dict[str, Any] = {"data": _texts(inputs), "data_format": kind, "options": options}
        body["priority"] = priority
        if model is not None:
            body["model"] = model
        if dates is not None:
            body["dates"] = _dates(dates)
        yield {"json": body}
        return
    if isinstance(inputs, Mapping) and dates is not None:
        raise InputError(
            "dates of uploaded modalities: the server reads them from each file's tags or "
            "name; give URLs or server paths to send dates with modalities"
        )
    form: dict[str, str] = {"options": json.dumps(options), "priority": str(priority)}
    if model is not None:
        form["model"] = model
    if dates is not None:
        given = _dates(dates)
        if None in given:
            raise InputError("dates: with uploads, give every input's date (or none)")
        form["dates"] = ",".join(given)
    with _opened(inputs) as files:
        yield {"data": form, "files": files}


def _dates(value: Any) -> Any:
    """Dates as JSON: ISO text (``None`` kept: that input's own), a list or modality -> list."""
    if isinstance(value, Mapping):
        return {str(k): _dates(v) for k, v in value.items()}

    def text(d: Any) -> str | None:
        return None if d is None else d.isoformat() if hasattr(d, "isoformat") else str(d)

    one = isinstance(value, str) or hasattr(value, "isoformat")
    return [text(d) for d in ([value] if one else list(value))]


def _texts(value: Any) -> Any:
    """Inputs (or dates) as JSON text: a list, or modality -> list."""
    if isinstance(value, Mapping):
        return {str(k): _as_text_list(v) for k, v in value.items()}
    return _as_text_list(value)


def _leaves(inputs: JobInputs) -> list[Any]:
    if isinstance(inputs, Mapping):
        if not inputs:
            raise InputError("inputs: no modality given")
        return [x for v in inputs.values() for x in _as_list(v)]
    return _as_list(inputs)


def _as_list(value: Any) -> list[Any]:
    if isinstance(value, str | bytes | os.PathLike):
        return [value]
    if isinstance(value, Sequence):
        return list(value)
    return [value]


def _as_text_list(value: Any) -> list[str]:
    return [os.fspath(x) if isinstance(x, os.PathLike) else str(x) for x in _as_list(value)]


def _is_url(value: Any) -> bool:
    return isinstance(value, str) and value.lower().startswith(("http://", "https://"))


def _kind_of(leaves: list[Any], server_paths: bool) -> str:
    """How a job's inputs travel: ``upload``, ``url`` or ``path`` (all of them one way)."""
    if not leaves:
        raise InputError("inputs: no input given")
    urls = [_is_url(x) for x in leaves]
    if all(urls):
        return "url"
    if any(urls):
        raise InputError(
            "a job's inputs are all URLs or all files: this one mixes them (one job per kind)"
        )
    for x in leaves:
        if not isinstance(x, str | bytes | os.PathLike):
            raise InputError(f"inputs: a {type(x).__name__} is no file, bytes or URL")
    if server_paths:
        if any(isinstance(x, bytes) for x in leaves):
            raise InputError("inputs: bytes are uploaded; leave out server_paths for them")
        return "path"
    return "upload"


@contextlib.contextmanager
def _opened(inputs: JobInputs) -> Iterator[list[tuple[str, tuple[str, Any, str]]]]:
    """The multipart parts of local inputs (files opened for streaming, closed after)."""
    from geoserve.raster.stac_item import is_stac_input

    groups: list[tuple[str, list[Any]]] = (
        [(str(k), _as_list(v)) for k, v in inputs.items()]
        if isinstance(inputs, Mapping)
        else [("file", _as_list(inputs))]
    )
    with contextlib.ExitStack() as stack:
        parts: list[tuple[str, tuple[str, Any, str]]] = []
        for field, values in groups:
            for i, value in enumerate(values):
                if isinstance(value, bytes):
                    parts.append((field, (f"{field}-{i}.tif", value, "image/tiff")))
                    continue
                path = Path(value)
                try:
                    handle = stack.enter_context(path.open("rb"))
                except FileNotFoundError:
                    raise RasterReadError(f"{path}: no such file") from None
                except OSError as exc:
                    raise RasterReadError(f"{path}: {exc.strerror or exc}") from None
                if not path.is_file():
                    raise RasterReadError(f"{path}: not a regular file")
                if is_stac_input(path):
                    raise InputError(
                        f"{path}: a STAC Item names files of this machine, which the server "
                        "cannot read; give the Item's URL"
                    )
                parts.append((field, (path.name, handle, "image/tiff")))
        yield parts
