"""Fixtures of the job store's tests: each store test runs on SQLite and on a real PostgreSQL."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from geoserve.jobs import JobStore, open_job_store
from geoserve.jobs.sqlite import SQLiteJobStore
from tests.jobs.pg_server import INSTALL_HINT, PgServer, find_bin_dir

_databases = itertools.count()


class FakeClock:
    """A clock the test moves by hand (the stores take ``clock=``)."""

    def __init__(self) -> None:
        self.now = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """One PostgreSQL server for the whole session; fails (not skips) when it cannot start."""
    bin_dir = find_bin_dir()
    if bin_dir is None:
        pytest.fail(INSTALL_HINT, pytrace=False)
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.fail(
            "psycopg is missing: .venv/bin/pip install 'psycopg[binary]' (the dev extra has it)",
            pytrace=False,
        )
    server = PgServer.start(bin_dir)
    yield server
    server.stop()


def new_database(server: PgServer) -> str:
    """The DSN of a new, empty database on ``server``."""
    import psycopg

    name = f"jobs_{next(_databases)}"
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return server.dsn(name)


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a fresh, empty store lives: a SQLite file, or a new PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "jobs.db")
    return new_database(request.getfixturevalue("pg_server"))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def open_store(store_url: str) -> Iterator[Callable[..., JobStore]]:
    """Opens the store at ``store_url`` (``clock=`` optional); closes every one at the end."""
    opened: list[JobStore] = []

    def _open(clock: Callable[[], datetime] | None = None) -> JobStore:
        if clock is None:
            store = open_job_store(store_url)
        elif store_url.startswith("postgresql://"):
            from geoserve.jobs.postgres import PostgresJobStore

            store = PostgresJobStore(store_url, clock=clock)
        else:
            store = SQLiteJobStore(store_url, clock=clock)
        opened.append(store)
        return store

    yield _open
    for store in opened:
        store.close()


@pytest.fixture
def store(open_store: Callable[..., JobStore], clock: FakeClock) -> JobStore:
    """A fresh store whose clock the test moves."""
    return open_store(clock)
