"""The job store's behaviour written once, in SQL that both SQLite and PostgreSQL run.

:class:`SqlJobStore` holds every method of :class:`~geoserve.jobs.store.JobStore`; a subclass
says how to connect, how a transaction begins, how times are stored, and what locks the claim
takes (``jobs/sqlite.py``, ``jobs/postgres.py``). Each thread gets its own connection, made on
its first call; a connection is used by its thread alone and closed when the store is (or, for
a thread that has ended, when another thread connects).

Every change is one conditional ``UPDATE`` (``... WHERE job_id = ? AND status = 'running'``)
inside a write transaction, so a move that makes no sense changes no row and the caller is told
so; no status is read first and written later.
"""

from __future__ import annotations

import threading
from abc import abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, suppress
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

from geoserve.errors import (
    ConfigError,
    InputError,
    JobStoreError,
    NotFoundError,
    ShuttingDownError,
)
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


class Cursor(Protocol):
    """What the store uses of a DB-API cursor (``sqlite3``'s and ``psycopg``'s alike)."""

    def execute(self, sql: Any, params: Any, /) -> object:
        """Run one statement."""

    def fetchall(self) -> list[Any]:
        """Every row the statement returned."""

    @property
    def rowcount(self) -> int:
        """How many rows the statement changed."""


class Tx:
    """One open transaction: statements written with ``?`` placeholders, run on its cursor."""

    def __init__(self, cursor: Cursor, placeholder: str) -> None:
        self._cursor = cursor
        self._placeholder = placeholder

    def run(self, sql: str, params: Sequence[object] = ()) -> int:
        """Run ``sql``; how many rows it changed."""
        self._cursor.execute(sql.replace("?", self._placeholder), tuple(params))
        return self._cursor.rowcount

    def rows(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        """Run ``sql``; every row it returned."""
        self._cursor.execute(sql.replace("?", self._placeholder), tuple(params))
        return [tuple(row) for row in self._cursor.fetchall()]

    def one(self, sql: str, params: Sequence[object] = ()) -> tuple[Any, ...] | None:
        """Run ``sql``; its first row, or ``None``."""
        rows = self.rows(sql, params)
        return rows[0] if rows else None


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


def _claim(attempt: int | None) -> tuple[str, tuple[object, ...]]:
    """The condition (and its parameter) that a job is still at the worker's ``attempt``."""
    attempt = checked_attempt(attempt)
    return ("", ()) if attempt is None else (" AND attempts = ?", (attempt,))


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join('?' * len(values))})"


class SqlJobStore(JobStore):
    """A :class:`JobStore` over an SQL database (see the module's docstring)."""

    #: how the database driver writes a parameter
    placeholder = "?"
    #: added to the claim's row choice (PostgreSQL: take a row no other claim holds)
    claim_lock = ""
    #: added to a read of rows about to change (PostgreSQL: lock them)
    row_lock = ""
    #: the statements that make the tables when missing (the version table first)
    schema: tuple[str, ...] = ()
    #: run first in the transaction that makes the tables (PostgreSQL: one process at a time)
    schema_guard: str | None = None
    #: the driver's errors: any of them raised by a call is a :class:`JobStoreError`
    db_errors: tuple[type[Exception], ...] = ()

    def __init__(self, where: str, clock: Callable[[], datetime] | None = None) -> None:
        #: the store's file or server, as messages name it (never a password)
        self.where = where
        self._clock = clock or _utc_now
        self._local = threading.local()
        self._connections: dict[threading.Thread, Any] = {}
        self._lock = threading.Lock()
        self._closed = False

    # -- what a database says ------------------------------------------------------------------

    @abstractmethod
    def connect(self) -> Any:
        """A new connection, in autocommit mode (transactions are begun explicitly)."""

    @abstractmethod
    def transaction(self, conn: Any, write: bool) -> AbstractContextManager[Cursor]:
        """A transaction on ``conn`` (taking the write lock at once if ``write``)."""

    @abstractmethod
    def time_param(self, when: datetime) -> object:
        """A UTC datetime as the database stores it."""

    @abstractmethod
    def time_value(self, value: Any) -> datetime:
        """A stored time back as a UTC datetime."""

    def is_broken(self, conn: Any) -> bool:
        """Whether ``conn`` can no longer be used (a server that went away)."""
        return False

    def store_error(self, exc: Exception) -> JobStoreError:
        """The :class:`JobStoreError` for a driver's error: the store and the first line."""
        lines = str(exc).strip().splitlines()
        reason = lines[0].strip() if lines else type(exc).__name__
        return JobStoreError(f"the job store {self.where} failed: {reason}")

    def close_connection(self, conn: Any) -> None:
        """Close one connection, never raising."""
        with suppress(Exception):  # closing is best effort
            conn.close()

    # -- connections and transactions ----------------------------------------------------------

    def _connection(self) -> Any:
        if self._closed:
            raise ShuttingDownError(f"the job store {self.where} is closed")
        conn = getattr(self._local, "conn", None)
        if conn is not None and not self.is_broken(conn):
            return conn
        try:
            conn = self.connect()
        except self.db_errors as exc:
            raise self.store_error(exc) from exc
        with self._lock:
            if self._closed:
                self.close_connection(conn)
                raise ShuttingDownError(f"the job store {self.where} is closed")
            for thread in [t for t in self._connections if not t.is_alive()]:
                self.close_connection(self._connections.pop(thread))
            old = self._connections.pop(threading.current_thread(), None)
            if old is not None:
                self.close_connection(old)
            self._connections[threading.current_thread()] = conn
        self._local.conn = conn
        return conn

    @contextmanager
    def _tx(self, write: bool = False) -> Iterator[Tx]:
        """A transaction on this thread's connection; a driver's error is a JobStoreError."""
        try:
            with ExitStack() as stack:
                yield Tx(self._begin(stack, write), self.placeholder)
        except self.db_errors as exc:
            raise self.store_error(exc) from exc

    def _begin(self, stack: ExitStack, write: bool) -> Cursor:
        """Begin a transaction in ``stack`` on this thread's connection.

        Once more on a new connection if that one was dropped while idle (a database
        restarted): nothing had run on it yet.
        """
        conn = self._connection()
        try:
            return stack.enter_context(self.transaction(conn, write))
        except self.db_errors:
            if not self.is_broken(conn):
                raise
        return stack.enter_context(self.transaction(self._connection(), write))

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

    def close(self) -> None:
        """See :meth:`JobStore.close`."""
        with self._lock:
            self._closed = True
            connections, self._connections = list(self._connections.values()), {}
        for conn in connections:
            self.close_connection(conn)


def _interrupted(attempts: int) -> JSONObject:
    """The OGC exception body of a job ``recover`` gives up on."""
    detail = (
        f"the server stopped while this job was running, on each of its {attempts} attempts;"
        " it is not tried again"
    )
    return {"type": INTERRUPTED, "title": "Job interrupted", "status": 500, "detail": detail}
