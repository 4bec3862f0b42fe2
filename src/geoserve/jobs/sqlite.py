"""``SQLiteJobStore``: jobs kept in one SQLite file (the default job store; stdlib only).

The file is made if missing, readable and writable by its owner only (0600; SQLite gives its
``-wal`` and ``-shm`` files beside it the same mode). It runs in WAL mode, so readers never
wait for a writer; every change takes the write lock when its transaction begins
(``BEGIN IMMEDIATE``), so two changes never interleave, whether they come from threads of one
process or from several processes on the same file (a claim among them: no two claimers
receive the same job). A writer waits up to ``timeout_s`` for another to finish.

Times are stored as ISO 8601 text in UTC with microseconds, so they sort as they compare.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from geoserve.errors import ConfigError
from geoserve.jobs.sql import Cursor, SqlJobStore

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS geoserve_job_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS geoserve_jobs (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id TEXT NOT NULL UNIQUE,
        process_id TEXT NOT NULL,
        status TEXT NOT NULL,
        spec TEXT NOT NULL,
        created TEXT NOT NULL,
        started TEXT,
        finished TEXT,
        updated TEXT NOT NULL,
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


class SQLiteJobStore(SqlJobStore):
    """A job store in the SQLite file ``path`` (made if missing; its folder must exist)."""

    schema = _SCHEMA

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Callable[[], datetime] | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self.path = Path(path)
        self._timeout_s = timeout_s
        super().__init__(str(self.path), clock)
        _make_file(self.path)
        try:
            self._init_schema()
        except sqlite3.DatabaseError as exc:
            self.close()
            raise ConfigError(
                f"job_store: {self.path} is not a job store SQLite can open ({exc})"
            ) from None
        except BaseException:
            self.close()
            raise

    def connect(self) -> sqlite3.Connection:
        """A connection in autocommit mode, WAL journal, waiting ``timeout_s`` for locks."""
        conn = sqlite3.connect(
            self.path, timeout=self._timeout_s, isolation_level=None, check_same_thread=False
        )
        try:
            conn.execute("PRAGMA journal_mode=WAL").fetchall()
        except BaseException:
            conn.close()
            raise
        return conn

    @contextmanager
    def transaction(self, conn: Any, write: bool) -> Iterator[Cursor]:
        """``BEGIN IMMEDIATE`` (the write lock at once) for a change, ``BEGIN`` for a read."""
        conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        try:
            yield conn.cursor()
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def time_param(self, when: datetime) -> str:
        """``when`` as fixed-width ISO 8601 text in UTC."""
        return when.astimezone(timezone.utc).isoformat(timespec="microseconds")

    def time_value(self, value: Any) -> datetime:
        """Stored ISO 8601 text back as a UTC datetime."""
        return datetime.fromisoformat(value).astimezone(timezone.utc)


def _make_file(path: Path) -> None:
    """Make the store's file if missing, owner-only (0600); refuse a folder or no folder."""
    if path.is_dir():
        raise ConfigError(f"job_store: {path} is a folder; name the job store's file")
    if not path.parent.is_dir():
        raise ConfigError(f"job_store: the folder of {path} does not exist")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise ConfigError(f"job_store: cannot open {path}: {exc.strerror}") from None
    os.close(fd)
