"""``PostgresJobStore``: jobs kept in a PostgreSQL database (the ``jobs-postgres`` extra).

It behaves as ``SQLiteJobStore`` does, for servers on several hosts sharing one queue. A claim
takes the oldest queued row no other claim holds (``SELECT ... FOR UPDATE SKIP LOCKED``), so
claimers on any number of connections never wait for one another nor receive the same job.
The tables (``geoserve_jobs``, ``geoserve_job_meta``) are made if missing, one process at a
time (a transaction-scoped advisory lock). Each thread has its own connection; one the server
dropped is replaced on the thread's next call (a call that finds it dropped before anything
ran on it makes a new one at once, so a server restarted between calls goes unnoticed). A
server that cannot be reached, or a connection lost mid-call, is a
:class:`~geoserve.errors.JobStoreError` naming the server (never a password).

Needs psycopg 3: ``pip install 'geoserve[jobs-postgres]'``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

import psycopg
from psycopg import conninfo

from geoserve.errors import ConfigError, JobStoreError
from geoserve.jobs.sql import SqlJobStore
from geoserve.jobs.sql_connections import Cursor

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS geoserve_job_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS geoserve_jobs (
        seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        job_id TEXT NOT NULL UNIQUE,
        process_id TEXT NOT NULL,
        status TEXT NOT NULL,
        spec TEXT NOT NULL,
        created TIMESTAMPTZ NOT NULL,
        started TIMESTAMPTZ,
        finished TIMESTAMPTZ,
        updated TIMESTAMPTZ NOT NULL,
        progress INTEGER NOT NULL,
        message TEXT NOT NULL,
        results TEXT,
        error TEXT,
        attempts INTEGER NOT NULL,
        owner TEXT
    )""",
    "CREATE INDEX IF NOT EXISTS geoserve_jobs_status ON geoserve_jobs (status, seq)",
    "CREATE INDEX IF NOT EXISTS geoserve_jobs_process ON geoserve_jobs (process_id, seq)",
    "CREATE INDEX IF NOT EXISTS geoserve_jobs_finished ON geoserve_jobs (finished)",
)

#: the advisory lock key making the tables takes ("geoserve" in ASCII)
_SCHEMA_LOCK_KEY = 0x67656F7365727665


def describe_dsn(dsn: str) -> str:
    """Where ``dsn`` points (host, port, database, user), for messages: never its password."""
    try:
        parts = conninfo.conninfo_to_dict(dsn)
    except psycopg.Error:
        return "PostgreSQL (a connection string it cannot parse)"
    shown = [f"{key}={parts[key]}" for key in ("host", "port", "dbname", "user") if key in parts]
    return f"PostgreSQL ({' '.join(shown) or 'default connection'})"


class PostgresJobStore(SqlJobStore):
    """A job store in the PostgreSQL database ``dsn`` names (a URL or ``key=value`` text)."""

    placeholder = "%s"
    claim_lock = " FOR UPDATE SKIP LOCKED"
    row_lock = " FOR UPDATE"
    schema = _SCHEMA
    schema_guard = f"SELECT pg_advisory_xact_lock({_SCHEMA_LOCK_KEY})"
    db_errors = (psycopg.Error,)

    def __init__(
        self,
        dsn: str,
        *,
        clock: Callable[[], datetime] | None = None,
        connect_timeout_s: int = 10,
    ) -> None:
        self._dsn = dsn
        self._connect_timeout_s = connect_timeout_s
        super().__init__(describe_dsn(dsn), clock)
        try:
            self._init_schema()
        except JobStoreError as exc:
            self.close()
            cause = exc.__cause__ or exc
            reason = str(cause).strip().splitlines()[0] if str(cause).strip() else "failed"
            raise ConfigError(f"job_store: cannot use {self.where}: {reason}") from None
        except BaseException:
            self.close()
            raise

    def connect(self) -> psycopg.Connection[Any]:
        """A new connection in autocommit mode (each transaction is begun explicitly)."""
        return psycopg.connect(self._dsn, autocommit=True, connect_timeout=self._connect_timeout_s)

    @contextmanager
    def transaction(self, conn: Any, write: bool) -> Iterator[Cursor]:
        """A transaction (``READ COMMITTED``; the claim's row locks keep claims apart)."""
        with conn.transaction(), conn.cursor() as cursor:
            yield cursor

    def is_broken(self, conn: Any) -> bool:
        """Whether the server closed ``conn`` or it failed."""
        return bool(conn.closed or conn.broken)

    def time_param(self, when: datetime) -> datetime:
        """``when`` as it is (a ``TIMESTAMPTZ`` parameter)."""
        return when

    def time_value(self, value: Any) -> datetime:
        """A ``TIMESTAMPTZ`` (in the session's time zone) as a UTC datetime."""
        assert isinstance(value, datetime)
        return value.astimezone(timezone.utc)
