"""``SQLiteJobStore``: jobs kept in one SQLite file (the default job store; stdlib only).

The file is made if missing, readable and writable by its owner only (0600; SQLite gives its
``-wal`` and ``-shm`` files beside it the same mode). It runs in WAL mode, so readers never
wait for a writer; every change takes the write lock when its transaction begins
(``BEGIN IMMEDIATE``), so two changes never interleave, whether they come from threads of one
process or from several processes on the same file (a claim among them: no two claimers
receive the same job). A writer waits up to ``timeout_s`` for another to finish.

Once open, the store keeps using the file it opened: a connection is made with the file
required to exist (never a new, empty one in its place), and one whose file was removed or
replaced meanwhile is dropped before its next call, so that call fails (a
:class:`~geoserve.errors.JobStoreError`) rather than reading or writing a file nobody else
sees. A file put back is used again.

Times are stored as ISO 8601 text in UTC with microseconds, so they sort as they compare.
"""

from __future__ import annotations

import os
import sqlite3
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from geoserve.errors import ConfigError, JobStoreError
from geoserve.jobs.sql import SqlJobStore
from geoserve.jobs.sql_connections import Cursor

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


class _Connection(sqlite3.Connection):
    """A connection that remembers which file it opened (its device and inode)."""

    opened: tuple[int, int] | None = None


def _identity(path: Path) -> tuple[int, int] | None:
    """The file at ``path`` (device, inode); ``None`` if there is none."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


class SQLiteJobStore(SqlJobStore):
    """A job store in the SQLite file ``path`` (made if missing; its folder must exist)."""

    schema = _SCHEMA
    db_errors = (sqlite3.Error,)

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
        except JobStoreError as exc:
            self.close()
            reason = exc.__cause__ or exc
            raise ConfigError(
                f"job_store: {self.path} is not a job store SQLite can open ({reason})"
            ) from None
        except BaseException:
            self.close()
            raise

    def connect(self) -> sqlite3.Connection:
        """A connection to the existing file (autocommit, WAL, ``timeout_s`` for locks)."""
        opened = _identity(self.path)
        if opened is None:
            raise JobStoreError(
                f"the job store {self.path} is gone (removed or moved while in use); put it"
                " back, or restart the server to make a new one"
            )
        uri = "file:" + urllib.parse.quote(str(self.path.absolute())) + "?mode=rw"
        conn = sqlite3.connect(
            uri,
            timeout=self._timeout_s,
            isolation_level=None,
            check_same_thread=False,
            uri=True,
            factory=_Connection,
        )
        conn.opened = opened
        try:
            conn.execute("PRAGMA journal_mode=WAL").fetchall()
        except BaseException:
            conn.close()
            raise
        return conn

    def is_broken(self, conn: Any) -> bool:
        """Whether the file ``conn`` opened is no longer the one at :attr:`path`."""
        return bool(getattr(conn, "opened", None) != _identity(self.path))

    def store_error(self, exc: Exception) -> JobStoreError:
        """A driver's error, with what to do about a lock held too long."""
        error = super().store_error(exc)
        if "locked" in str(exc) or "busy" in str(exc):
            return JobStoreError(
                f"{error} (another process or connection held its lock for over"
                f" {self._timeout_s:g} s)"
            )
        return error

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
