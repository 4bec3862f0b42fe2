"""The job store's behaviour written once, in SQL that both SQLite and PostgreSQL run.

:class:`SqlJobStore` holds every method of :class:`~geoserve.jobs.store.JobStore`; a subclass
says how to connect, how a transaction begins, how times are stored, and what locks the claim
takes (``jobs/sqlite.py``, ``jobs/postgres.py``). The connections (one per thread) and
transactions are :class:`~geoserve.jobs.sql_connections.SqlConnections`'.

Every change is one conditional ``UPDATE`` (``... WHERE job_id = ? AND status = 'running'``)
inside a write transaction, so a move that makes no sense changes no row and the caller is told
so; no status is read first and written later.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from geoserve.errors import (
    ConfigError,
    InputError,
    NotFoundError,
)
from geoserve.jobs.sql_connections import SqlConnections, Tx
from geoserve.jobs.store import (
    ACCEPTED,
    DISMISSED,
    FAILED,
    FINAL_STATUSES,
    RUNNING,
    SUCCESSFUL,
    Job,
    JobList,
    JobStore,
    JSONObject,
    checked_attempt,
    checked_job_id,
    checked_message,
    checked_names,
    checked_owner,
    checked_page,
    checked_percent,
    checked_process_id,
    checked_seconds,
    checked_statuses,
    dump_object,
    error_message,
    load_object,
    new_job_id,
)

#: The layout of the tables; a store refuses one written in another version.
SCHEMA_VERSION = 1

_COLUMNS = (
    "job_id, process_id, status, spec, created, started, finished, updated, progress, message,"
    " results, error, attempts, owner"
)
_TABLE = "geoserve_jobs"

#: The exception type of a job failed by ``recover``.
INTERRUPTED = "JobInterrupted"


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


def _claim(attempt: int | None) -> tuple[str, tuple[object, ...]]:
    """The condition (and its parameter) that a job is still at the worker's ``attempt``."""
    attempt = checked_attempt(attempt)
    return ("", ()) if attempt is None else (" AND attempts = ?", (attempt,))


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join('?' * len(values))})"


class SqlJobStore(SqlConnections, JobStore):
    """A :class:`JobStore` over an SQL database (see the module's docstring)."""

    #: added to the claim's row choice (PostgreSQL: take a row no other claim holds)
    claim_lock = ""
    #: added to a read of rows about to change (PostgreSQL: lock them)
    row_lock = ""
    #: the statements that make the tables when missing (the version table first)
    schema: tuple[str, ...] = ()
    #: run first in the transaction that makes the tables (PostgreSQL: one process at a time)
    schema_guard: str | None = None

    def __init__(self, where: str, clock: Callable[[], datetime] | None = None) -> None:
        super().__init__(where)
        self._clock = clock or _utc_now

    def _init_schema(self) -> None:
        """Make the tables if missing; refuse a store written in another schema version."""
        key = ("schema_version",)
        with self._tx(write=True) as tx:
            if self.schema_guard:
                tx.rows(self.schema_guard)
            tx.run(self.schema[0])
            row = tx.one("SELECT value FROM geoserve_job_meta WHERE key = ?", key)
            if row is None:
                tx.run(
                    "INSERT INTO geoserve_job_meta (key, value) VALUES (?, ?)",
                    (*key, str(SCHEMA_VERSION)),
                )
            elif row[0] != str(SCHEMA_VERSION):
                raise ConfigError(
                    f"job_store: {self.where} holds jobs in schema version {row[0]}; this "
                    f"geoserve reads version {SCHEMA_VERSION} (use another job store)"
                )
            for statement in self.schema[1:]:
                tx.run(statement)

    def _now(self) -> datetime:
        return self._clock().astimezone(timezone.utc)

    def _job(self, row: tuple[Any, ...]) -> Job:
        """A row of ``_COLUMNS`` (the order of :class:`Job`'s fields) as a job."""
        started, finished = (None if t is None else self.time_value(t) for t in row[5:7])
        created, updated = self.time_value(row[4]), self.time_value(row[7])
        spec, results, error = load_object(row[3]) or {}, load_object(row[10]), load_object(row[11])
        return Job(
            row[0], row[1], row[2], spec, created, started, finished, updated, int(row[8]),
            row[9], results, error, int(row[12]), row[13],
        )  # fmt: skip

    def _update(self, tx: Tx, sets: str, params: Sequence[object], where: str) -> JobList:
        sql = f"UPDATE {_TABLE} SET {sets} WHERE {where} RETURNING {_COLUMNS}"
        return [self._job(row) for row in tx.rows(sql, params)]

    # -- the interface -------------------------------------------------------------------------

    def create(self, process_id: str, spec: JSONObject, owner: str | None = None) -> Job:
        """See :meth:`JobStore.create`."""
        values = (checked_process_id(process_id), dump_object(spec, "spec"), checked_owner(owner))
        now = self.time_param(self._now())
        with self._tx(write=True) as tx:
            row = tx.one(
                f"INSERT INTO {_TABLE} (job_id, process_id, status, spec, created, updated,"
                " progress, message, attempts, owner) VALUES (?, ?, ?, ?, ?, ?, 0, ?, 0, ?)"
                f" RETURNING {_COLUMNS}",
                (new_job_id(), values[0], ACCEPTED, values[1], now, now, "queued", values[2]),
            )
        assert row is not None
        return self._job(row)

    def get(self, job_id: str) -> Job:
        """See :meth:`JobStore.get`."""
        job_id = checked_job_id(job_id)
        with self._tx() as tx:
            row = tx.one(f"SELECT {_COLUMNS} FROM {_TABLE} WHERE job_id = ?", (job_id,))
        if row is None:
            raise NotFoundError(f"no such job: {job_id}")
        return self._job(row)

    def list(
        self,
        status: str | Iterable[str] | None = None,
        process_id: str | Iterable[str] | None = None,
        limit: int = 10,
        offset: int = 0,
        *,
        owner: str | None = None,
    ) -> tuple[JobList, int]:
        """See :meth:`JobStore.list`."""
        limit, offset = checked_page(limit, offset)
        filters = (
            ("status", checked_statuses(status)),
            ("process_id", checked_names(process_id, "process id")),
            ("owner", checked_names(owner, "owner")),
        )
        clauses: list[str] = []
        params: list[str] = []
        for column, values in filters:
            if values is not None:
                if not values:
                    return [], 0
                clauses.append(_in(column, values))
                params.extend(values)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        with self._tx() as tx:
            total = tx.one(f"SELECT COUNT(*) FROM {_TABLE}{where}", params)
            rows = tx.rows(
                f"SELECT {_COLUMNS} FROM {_TABLE}{where} ORDER BY seq DESC LIMIT ? OFFSET ?",
                (*params, limit, offset),
            )
        assert total is not None
        return [self._job(row) for row in rows], int(total[0])

    def claim_next(self) -> Job | None:
        """See :meth:`JobStore.claim_next`."""
        now = self.time_param(self._now())
        oldest = f"SELECT seq FROM {_TABLE} WHERE status = ? ORDER BY seq LIMIT 1{self.claim_lock}"
        with self._tx(write=True) as tx:
            jobs = self._update(
                tx,
                "status = ?, attempts = attempts + 1, started = ?, updated = ?, message = ?",
                (RUNNING, now, now, "running", ACCEPTED, ACCEPTED),
                f"seq = ({oldest}) AND status = ?",
            )
        return jobs[0] if jobs else None

    def progress(
        self, job_id: str, percent: int, message: str | None = None, *, attempt: int | None = None
    ) -> bool:
        """See :meth:`JobStore.progress`."""
        job_id, percent = checked_job_id(job_id), checked_percent(percent)
        message, (claim, claimed) = checked_message(message), _claim(attempt)
        with self._tx(write=True) as tx:
            changed = tx.run(
                f"UPDATE {_TABLE} SET progress = CASE WHEN progress < ? THEN ? ELSE progress END,"
                f" message = COALESCE(?, message), updated = ? WHERE job_id = ? AND status = ?"
                f"{claim}",
                (percent, percent, message, self.time_param(self._now()), job_id, RUNNING)
                + claimed,
            )
        return changed > 0

    def finish(
        self,
        job_id: str,
        results: JSONObject,
        message: str | None = None,
        *,
        attempt: int | None = None,
    ) -> bool:
        """See :meth:`JobStore.finish`."""
        job_id, text = checked_job_id(job_id), dump_object(results, "results")
        message, (claim, claimed) = checked_message(message), _claim(attempt)
        now = self.time_param(self._now())
        with self._tx(write=True) as tx:
            changed = tx.run(
                f"UPDATE {_TABLE} SET status = ?, results = ?, progress = 100, message = ?,"
                f" finished = ?, updated = ? WHERE job_id = ? AND status = ?{claim}",
                (SUCCESSFUL, text, message or "finished", now, now, job_id, RUNNING) + claimed,
            )
        return changed > 0

    def fail(self, job_id: str, error: JSONObject, *, attempt: int | None = None) -> bool:
        """See :meth:`JobStore.fail`."""
        job_id, text = checked_job_id(job_id), dump_object(error, "error")
        claim, claimed = _claim(attempt)
        now = self.time_param(self._now())
        with self._tx(write=True) as tx:
            changed = tx.run(
                f"UPDATE {_TABLE} SET status = ?, error = ?, message = ?, finished = ?,"
                f" updated = ? WHERE job_id = ? AND status IN (?, ?){claim}",
                (FAILED, text, error_message(error), now, now, job_id, ACCEPTED, RUNNING) + claimed,
            )
        return changed > 0

    def dismiss(self, job_id: str) -> Job:
        """See :meth:`JobStore.dismiss`."""
        job_id = checked_job_id(job_id)
        now = self.time_param(self._now())
        with self._tx(write=True) as tx:
            jobs = self._update(
                tx,
                "status = ?, message = ?, finished = COALESCE(finished, ?), updated = ?",
                (DISMISSED, "dismissed", now, now, job_id, DISMISSED),
                "job_id = ? AND status <> ?",
            )
        return jobs[0] if jobs else self.get(job_id)

    def recover(self, max_attempts: int, stale_after_s: float | None = None) -> JobList:
        """See :meth:`JobStore.recover`."""
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise InputError(f"max_attempts must be a whole number >= 1, not {max_attempts!r}")
        stale = "" if stale_after_s is None else " AND updated < ?"
        found: tuple[object, ...] = (RUNNING,)
        if stale_after_s is not None:
            seconds = checked_seconds(stale_after_s, "stale_after_s")
            try:
                found += (self.time_param(self._now() - timedelta(seconds=seconds)),)
            except OverflowError:  # a lease longer than the calendar: no worker is that late
                return []
        now = self.time_param(self._now())
        recovered: JobList = []
        with self._tx(write=True) as tx:
            running = tx.rows(
                f"SELECT job_id, attempts FROM {_TABLE} WHERE status = ?{stale} ORDER BY seq"
                f"{self.row_lock}",
                found,
            )
            for job_id, attempts in running:
                if attempts >= max_attempts:
                    error = _interrupted(attempts)
                    sets = "status = ?, error = ?, message = ?, finished = ?, updated = ?"
                    params: tuple[object, ...] = (FAILED, dump_object(error, "error"))
                    params += (error["detail"], now, now)
                else:
                    sets = "status = ?, started = NULL, progress = 0, message = ?, updated = ?"
                    params = (ACCEPTED, "queued again: the server stopped while it ran", now)
                where = "job_id = ? AND status = ?"
                recovered += self._update(tx, sets, (*params, job_id, RUNNING), where)
        return recovered

    def expire(self, ttl_s: float) -> JobList:
        """See :meth:`JobStore.expire`."""
        ttl_s = checked_seconds(ttl_s, "a job time to live")
        try:
            cutoff = self.time_param(self._now() - timedelta(seconds=ttl_s))
        except OverflowError:  # a time to live longer than the calendar: nothing is that old
            return []
        final = tuple(sorted(FINAL_STATUSES))
        with self._tx(write=True) as tx:
            rows = tx.rows(
                f"DELETE FROM {_TABLE} WHERE {_in('status', final)} AND finished < ?"
                f" RETURNING {_COLUMNS}",
                (*final, cutoff),
            )
        return sorted((self._job(row) for row in rows), key=lambda job: (job.created, job.job_id))

    def count(self, statuses: str | Iterable[str] | None = None) -> int:
        """See :meth:`JobStore.count`."""
        wanted = checked_statuses(statuses)
        if wanted is not None and not wanted:
            return 0
        where = "" if wanted is None else f" WHERE {_in('status', wanted)}"
        with self._tx() as tx:
            row = tx.one(f"SELECT COUNT(*) FROM {_TABLE}{where}", wanted or ())
        assert row is not None
        return int(row[0])


def _interrupted(attempts: int) -> JSONObject:
    """The OGC exception body of a job ``recover`` gives up on."""
    detail = (
        f"the server stopped while this job was running, on each of its {attempts} attempts;"
        " it is not tried again"
    )
    return {"type": INTERRUPTED, "title": "Job interrupted", "status": 500, "detail": detail}
