"""Asynchronous jobs kept across restarts: :class:`Job`, :class:`JobStore` and its two stores.

``open_job_store(setting)`` opens the store the ``job_store`` setting names: a file path or
``sqlite:///PATH`` for SQLite (``sqlite:///jobs.db`` is relative, ``sqlite:////var/jobs.db``
absolute, as SQLAlchemy writes them), ``postgresql://...`` or ``postgres://...`` for PostgreSQL
(the ``jobs-postgres`` extra). The package imports nothing from the engine or the server.
"""

from __future__ import annotations

import os
import re

from geoserve.errors import ConfigError
from geoserve.jobs.sqlite import SQLiteJobStore
from geoserve.jobs.store import (
    ACCEPTED,
    DISMISSED,
    FAILED,
    FINAL_STATUSES,
    RUNNING,
    STATUSES,
    SUCCESSFUL,
    Job,
    JobStore,
    checked_job_id,
    is_job_id,
)

__all__ = [
    "ACCEPTED",
    "DISMISSED",
    "FAILED",
    "FINAL_STATUSES",
    "RUNNING",
    "STATUSES",
    "SUCCESSFUL",
    "Job",
    "JobStore",
    "SQLiteJobStore",
    "checked_job_id",
    "is_job_id",
    "open_job_store",
]

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
_SQLITE_PREFIX = "sqlite:///"


def open_job_store(setting: str | os.PathLike[str]) -> JobStore:
    """The job store ``setting`` names (see the package docstring); a bad one is a ConfigError."""
    if isinstance(setting, os.PathLike):
        return SQLiteJobStore(setting)
    if not isinstance(setting, str) or not setting.strip():
        raise ConfigError("job_store: name a file, sqlite:///PATH or postgresql://...")
    match = _SCHEME.match(setting)
    if match is None:
        return SQLiteJobStore(setting)
    scheme = match.group(1).lower()
    text = scheme + setting[len(match.group(1)) :]
    if scheme in ("postgresql", "postgres"):
        try:
            from geoserve.jobs.postgres import PostgresJobStore
        except ImportError:
            raise ConfigError(
                "job_store: a PostgreSQL job store needs psycopg; install it with"
                " pip install 'geoserve[jobs-postgres]'"
            ) from None
        return PostgresJobStore(text)
    if scheme == "sqlite":
        path = text[len(_SQLITE_PREFIX) :] if text.startswith(_SQLITE_PREFIX) else ""
        if not path:
            raise ConfigError(
                "job_store: a SQLite URL names a file: sqlite:///relative.db or"
                " sqlite:////absolute/path.db"
            )
        return SQLiteJobStore(path)
    # the scheme alone: the rest may hold a password
    raise ConfigError(
        f"job_store: unknown scheme {scheme + '://'!r}; use a file path, sqlite:///PATH,"
        " postgresql://... or postgres://..."
    )
