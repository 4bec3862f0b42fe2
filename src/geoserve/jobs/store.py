"""Jobs and the interface of the store that keeps them (OGC API - Processes' asynchronous jobs).

A :class:`Job` is one asynchronous execution of a process: its status (``accepted``,
``running``, ``successful``, ``failed``, ``dismissed``), the request it runs (``spec``, a JSON
object the store keeps as it was given and never reads), its times, progress, and its results
or error. A :class:`JobStore` keeps jobs across restarts and between processes:
``SQLiteJobStore`` (``jobs/sqlite.py``, the default) and ``PostgresJobStore``
(``jobs/postgres.py``, the ``jobs-postgres`` extra) behave the same.

How a job moves, and what the store does with a move that makes no sense:

- ``create`` makes an ``accepted`` job. ``claim_next`` moves the oldest ``accepted`` job to
  ``running`` (its ``attempts`` counted up, ``started`` set); no two callers, threads or
  processes, ever receive the same job.
- ``progress``, ``finish`` and ``fail`` come from the worker running the job. They change only
  a ``running`` job (``fail`` also an ``accepted`` one) and answer whether they did: ``False``
  means the job is no longer the worker's (dismissed meanwhile, already finished, or gone), so
  the worker stops and removes what it wrote. Progress never goes down. A worker names its
  claim (``attempt=``, the job's ``attempts`` when it claimed it): once the job has been
  requeued and claimed again, the earlier worker's reports change nothing.
- A running job's ``updated`` time is its worker's heartbeat: ``progress`` sets it even when
  nothing else changes, and the runner reports every half second.
- ``dismiss`` ends any job: a queued or running one is cancelled, a finished one is marked so
  that its results are no longer served. A dismissed job keeps its ``results`` and ``error`` as
  they were, so the caller can delete the files they name. Dismissing twice changes nothing.
- ``recover`` puts the ``running`` jobs whose worker is gone (no report for ``stale_after_s``
  seconds: its process stopped without finishing them) back in the queue, or fails one once
  it has started ``max_attempts`` times. Without ``stale_after_s`` every running job is taken
  to be abandoned (one process alone on its store, at start-up).
- ``expire`` removes finished (``successful``, ``failed``, ``dismissed``) jobs older than a
  time to live and returns them, so the caller deletes their files.

Job ids are the store's own (``job-`` and 32 hex digits). An id read from a URL is untrusted:
every method checks it against that pattern before any query, and a malformed id is simply an
unknown job (:class:`~geoserve.errors.NotFoundError`).

This module imports nothing from geoserve but its errors.
"""

from __future__ import annotations

import json
import re
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any

from geoserve.errors import InputError, NotFoundError

ACCEPTED = "accepted"
RUNNING = "running"
SUCCESSFUL = "successful"
FAILED = "failed"
DISMISSED = "dismissed"

#: Every status, in the order a job goes through them.
STATUSES = (ACCEPTED, RUNNING, SUCCESSFUL, FAILED, DISMISSED)
#: The statuses a job never leaves (but for ``dismiss``); ``expire`` removes jobs in them.
FINAL_STATUSES = frozenset({SUCCESSFUL, FAILED, DISMISSED})

JOB_ID_PATTERN = re.compile(r"job-[0-9a-f]{32}")

#: The most jobs one ``list`` call returns (OGC API - Processes' largest ``limit``).
MAX_LIMIT = 10_000
_MAX_PROCESS_ID = 200
_MAX_OWNER = 200

JSONObject = dict[str, Any]


@dataclass(frozen=True)
class Job:
    """One job as the store holds it (a snapshot: the store's copy moves on without it)."""

    job_id: str
    process_id: str
    status: str
    #: the request the job runs, a JSON object the store never reads
    spec: JSONObject
    created: datetime
    #: when it last started running; ``None`` while queued
    started: datetime | None
    #: when it reached a final status (for a finished job dismissed later: when it finished)
    finished: datetime | None
    #: the last change of any kind
    updated: datetime
    #: 0 to 100, never lower than before
    progress: int
    message: str
    #: what the process returned (for a dismissed job: what it had returned, if anything)
    results: JSONObject | None
    #: the OGC exception body of a failed job
    error: JSONObject | None
    #: how many times the job has started running
    attempts: int
    #: who made the job (an API key's id), ``None`` when nobody in particular
    owner: str | None

    @property
    def is_final(self) -> bool:
        """Whether the job has ended (``successful``, ``failed`` or ``dismissed``)."""
        return self.status in FINAL_STATUSES


#: A list of jobs (a name the stores' signatures can use beside their own ``list`` method).
JobList = list[Job]


def new_job_id() -> str:
    """A fresh job id: ``job-`` and 32 random hex digits."""
    return f"job-{uuid.uuid4().hex}"


def is_job_id(value: object) -> bool:
    """Whether ``value`` has the shape of a job id (only those reach a query)."""
    return isinstance(value, str) and JOB_ID_PATTERN.fullmatch(value) is not None


def checked_job_id(value: object) -> str:
    """``value`` if it has the shape of a job id; else :class:`NotFoundError` (no such job)."""
    if not is_job_id(value):
        shown = repr(value) if isinstance(value, str) and len(value) <= 80 else "given"
        raise NotFoundError(f"no such job: the job id {shown} is not one this server makes")
    assert isinstance(value, str)
    return value


def checked_statuses(statuses: str | Iterable[str] | None) -> tuple[str, ...] | None:
    """Statuses to match, each one checked; ``None`` (every status) stays ``None``."""
    if statuses is None:
        return None
    wanted = (statuses,) if isinstance(statuses, str) else tuple(statuses)
    for status in wanted:
        if status not in STATUSES:
            raise InputError(f"unknown job status {status!r}; known: {', '.join(STATUSES)}")
    return wanted


def checked_names(values: str | Iterable[str] | None, field: str) -> tuple[str, ...] | None:
    """Process ids (or owners) to match; ``None`` matches every one."""
    if values is None:
        return None
    wanted = (values,) if isinstance(values, str) else tuple(values)
    for value in wanted:
        if not isinstance(value, str):
            raise InputError(f"{field} must be text, not {type(value).__name__}")
    return wanted


def checked_page(limit: int, offset: int) -> tuple[int, int]:
    """``limit`` (1 to :data:`MAX_LIMIT`) and ``offset`` (0 or more), checked."""
    for name, value, low in (("limit", limit, 1), ("offset", offset, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise InputError(f"job list {name} must be a whole number >= {low}, not {value!r}")
    if limit > MAX_LIMIT:
        raise InputError(f"job list limit must be at most {MAX_LIMIT}, not {limit}")
    return limit, offset


def checked_process_id(process_id: object) -> str:
    """A job's process id: non-empty text of at most 200 characters."""
    if not isinstance(process_id, str) or not process_id or len(process_id) > _MAX_PROCESS_ID:
        raise InputError(f"a job's process id must be 1 to {_MAX_PROCESS_ID} characters of text")
    return process_id


def checked_owner(owner: object) -> str | None:
    """A job's owner: ``None`` or non-empty text of at most 200 characters."""
    if owner is not None and (not isinstance(owner, str) or not owner or len(owner) > _MAX_OWNER):
        raise InputError(f"a job's owner must be None or 1 to {_MAX_OWNER} characters of text")
    return owner


def checked_percent(percent: object) -> int:
    """A progress percentage: a whole number from 0 to 100."""
    if isinstance(percent, bool) or not isinstance(percent, int) or not 0 <= percent <= 100:
        raise InputError(f"job progress must be a whole number from 0 to 100, not {percent!r}")
    return percent


def checked_attempt(attempt: object) -> int | None:
    """A worker's claim: ``None`` (any) or the job's ``attempts`` when it claimed it (>= 1)."""
    if attempt is not None and (
        isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1
    ):
        raise InputError(f"a job attempt must be None or a whole number >= 1, not {attempt!r}")
    return attempt


def checked_seconds(value: object, what: str) -> float:
    """A span of seconds (0 or more, finite or not), checked; ``what`` names it in the error."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise InputError(f"{what} must be a number of seconds >= 0, not {value!r}")
    return float(value)


def checked_message(message: object) -> str | None:
    """A status message: ``None`` (keep the one there is) or text, cut to 1000 characters."""
    if message is not None and not isinstance(message, str):
        raise InputError(f"a job's message must be text, not {type(message).__name__}")
    return None if message is None else message[:1000]


def dump_object(value: object, field: str) -> str:
    """``value`` (a JSON object) as compact JSON text; anything else is an :class:`InputError`."""
    if not isinstance(value, dict):
        raise InputError(f"a job's {field} must be a JSON object, not {type(value).__name__}")
    try:
        return json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InputError(f"a job's {field} is not plain JSON: {exc}") from None


def load_object(text: str | None) -> JSONObject | None:
    """JSON text the store wrote back into an object (``None`` stays ``None``)."""
    if text is None:
        return None
    value = json.loads(text)
    assert isinstance(value, dict)
    return value


def error_message(error: JSONObject) -> str:
    """The status message of a job failed with ``error``: its ``detail``, else its ``title``."""
    for key in ("detail", "title"):
        text = error.get(key)
        if isinstance(text, str) and text:
            return text[:1000]
    return "failed"


class JobStore(ABC):
    """Where jobs are kept; every method is safe to call from several threads at once.

    Methods taking a ``job_id`` raise :class:`~geoserve.errors.NotFoundError` for an id that is
    malformed or names no job, except the worker's ``progress``, ``finish`` and ``fail``, which
    answer ``False`` for a job that is gone. Bad values (a status that does not exist, a spec
    that is not a JSON object, a percentage over 100) raise
    :class:`~geoserve.errors.InputError`. A closed store refuses every call.
    """

    @abstractmethod
    def create(self, process_id: str, spec: JSONObject, owner: str | None = None) -> Job:
        """A new ``accepted`` job running ``spec`` with process ``process_id``."""

    @abstractmethod
    def get(self, job_id: str) -> Job:
        """The job named ``job_id``."""

    @abstractmethod
    def list(
        self,
        status: str | Iterable[str] | None = None,
        process_id: str | Iterable[str] | None = None,
        limit: int = 10,
        offset: int = 0,
        *,
        owner: str | None = None,
    ) -> tuple[JobList, int]:
        """One page of jobs, newest first, and how many match in all.

        ``status`` and ``process_id`` each take one value or several (a job matches any of
        them); ``None`` matches every job, as does ``owner=None``.
        """

    @abstractmethod
    def claim_next(self) -> Job | None:
        """The oldest ``accepted`` job, now ``running``; ``None`` when none is queued."""

    @abstractmethod
    def progress(
        self, job_id: str, percent: int, message: str | None = None, *, attempt: int | None = None
    ) -> bool:
        """Record a running job's progress (kept if lower than before), message and heartbeat.

        ``False`` when the job is not running (dismissed, finished, requeued or gone), or, with
        ``attempt``, no longer running that attempt: nothing changed and the worker should stop.
        """

    @abstractmethod
    def finish(
        self,
        job_id: str,
        results: JSONObject,
        message: str | None = None,
        *,
        attempt: int | None = None,
    ) -> bool:
        """Make a running job ``successful`` with ``results`` (progress 100).

        ``False`` when the job is not running (or, with ``attempt``, not running that attempt):
        nothing changed.
        """

    @abstractmethod
    def fail(self, job_id: str, error: JSONObject, *, attempt: int | None = None) -> bool:
        """Make an accepted or running job ``failed`` with ``error`` (an OGC exception body).

        ``False`` when the job had already ended or is gone (or, with ``attempt``, is no
        longer at that attempt): nothing changed.
        """

    @abstractmethod
    def dismiss(self, job_id: str) -> Job:
        """End the job as ``dismissed`` (whatever its status) and return it."""

    @abstractmethod
    def recover(self, max_attempts: int, stale_after_s: float | None = None) -> JobList:
        """Requeue the ``running`` jobs a stopped process left, and return them as they are now.

        A job that has already started ``max_attempts`` times is ``failed`` instead (it may be
        what stopped the process). With ``stale_after_s``, only the jobs not reported on for
        that many seconds count as left (their worker's lease ran out), so any number of live
        processes may share the store and recover; without it, every ``running`` job does (for
        a process alone on its store, before its workers start).
        """

    @abstractmethod
    def expire(self, ttl_s: float) -> JobList:
        """Remove the jobs that finished more than ``ttl_s`` seconds ago, and return them."""

    @abstractmethod
    def count(self, statuses: str | Iterable[str] | None = None) -> int:
        """How many jobs have one of ``statuses`` (every job for ``None``)."""

    @abstractmethod
    def close(self) -> None:
        """Release the store's connections; later calls are refused. Closing twice is fine."""

    def __enter__(self) -> JobStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
