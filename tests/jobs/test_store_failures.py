"""A job store whose database fails once it is open: a JobStoreError naming the store and the
reason (never a driver's exception, never a password), and the store usable again once the
database is (SQLite: a lock released, the file put back; PostgreSQL: connections dropped, the
database refusing and then accepting connections again)."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from geoserve.errors import GeoServeError, JobStoreError
from geoserve.jobs import ACCEPTED, DISMISSED, SQLiteJobStore
from tests.jobs.conftest import new_database
from tests.jobs.pg_server import PgServer


def test_sqlite_locked_past_its_wait(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    with SQLiteJobStore(path, timeout_s=0.2) as store:
        job = store.create("p", {})
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process holding the write lock
        try:
            t0 = time.monotonic()
            with pytest.raises(JobStoreError) as info:
                store.dismiss(job.job_id)
            assert time.monotonic() - t0 < 5
            message = str(info.value)
            assert message.startswith(f"the job store {path} failed: database is locked")
            assert "held its lock for over 0.2 s" in message
            assert isinstance(info.value, GeoServeError)
            assert store.get(job.job_id).status == ACCEPTED  # reads go on (WAL); nothing changed
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert store.dismiss(job.job_id).status == DISMISSED


def test_sqlite_file_removed_then_put_back(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    with SQLiteJobStore(path) as store:
        job = store.create("p", {"x": 1})
        with sqlite3.connect(path) as src, sqlite3.connect(tmp_path / "backup.db") as dst:
            src.backup(dst)
        for file in tmp_path.glob("jobs.db*"):
            file.unlink()
        errors: list[BaseException] = []

        def from_another_thread() -> None:  # (a thread with no connection yet)
            try:
                store.create("p", {})
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=from_another_thread)
        thread.start()
        thread.join(timeout=30)
        with pytest.raises(JobStoreError, match=r"is gone \(removed or moved") as info:
            store.get(job.job_id)
        assert str(path) in str(info.value)
        assert [type(e) for e in errors] == [JobStoreError]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["backup.db"]  # none made anew
        (tmp_path / "backup.db").replace(path)
        assert store.get(job.job_id).spec == {"x": 1}  # the file back: the same jobs
        assert store.count() == 1


def test_sqlite_file_replaced_by_another_kind_of_file(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    with SQLiteJobStore(path) as store:
        job = store.create("p", {})
        for file in tmp_path.glob("jobs.db*"):
            file.unlink()
        path.write_bytes(b"not a database at all, " * 200)  # the wrong file put back
        with pytest.raises(JobStoreError, match="failed: file is not a database"):
            store.get(job.job_id)
        assert path.read_bytes().startswith(b"not a database")  # left as it is


def _drop_connections(server: PgServer, dbname: str) -> int:
    """Terminate every connection to ``dbname`` (as a restart or a proxy would); how many."""
    import psycopg

    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
            (dbname,),
        ).fetchall()
    return len(rows)


def _store_pid(store: object) -> int:
    conn = store._local.conn  # type: ignore[attr-defined]  # this thread's connection
    return int(conn.info.backend_pid)


def test_postgres_connection_dropped_while_idle_is_replaced(pg_server: PgServer) -> None:
    from geoserve.jobs.postgres import PostgresJobStore

    dsn = new_database(pg_server)
    with PostgresJobStore(dsn) as store:
        job = store.create("p", {})
        before = _store_pid(store)
        assert _drop_connections(pg_server, dsn.rsplit("/", 1)[1]) >= 1
        time.sleep(0.1)
        assert store.get(job.job_id).status == ACCEPTED  # nothing had run on it: once more
        assert _store_pid(store) != before


def test_postgres_unreachable_then_back(pg_server: PgServer) -> None:
    import psycopg

    from geoserve.jobs.postgres import PostgresJobStore

    dsn = new_database(pg_server)
    dbname = dsn.rsplit("/", 1)[1]
    with_password = dsn.replace("geoserve@", "geoserve:s3cret@")  # (trust: not checked)
    with PostgresJobStore(with_password) as store:
        job = store.create("p", {})
        with psycopg.connect(pg_server.dsn(), autocommit=True) as admin:
            admin.execute(f"ALTER DATABASE {dbname} ALLOW_CONNECTIONS false")
            try:
                _drop_connections(pg_server, dbname)
                time.sleep(0.1)
                with pytest.raises(JobStoreError) as info:
                    store.get(job.job_id)
                message = str(info.value)
                where = f"host=127.0.0.1 port={pg_server.port} dbname={dbname} user=geoserve"
                assert message.startswith(f"the job store PostgreSQL ({where}) failed: ")
                assert "not currently accepting connections" in message
                assert "s3cret" not in message
                with pytest.raises(JobStoreError):
                    store.create("p", {})
            finally:
                admin.execute(f"ALTER DATABASE {dbname} ALLOW_CONNECTIONS true")
        assert store.dismiss(job.job_id).status == DISMISSED  # back: a new connection
        assert store.count() == 1  # the refused create made nothing


def test_postgres_connection_dropped_mid_change(pg_server: PgServer) -> None:
    """The connection lost while a change waits on a row lock: a JobStoreError, the change not
    made (it is not run again: it may have been half-way), the store fine at the next call."""
    import psycopg

    from geoserve.jobs.postgres import PostgresJobStore

    dsn = new_database(pg_server)
    with PostgresJobStore(dsn) as store:
        job = store.create("p", {})
        pid = _store_pid(store)
        errors: list[BaseException] = []
        with psycopg.connect(dsn) as holder:  # a transaction holding the job's row
            holder.execute("SELECT 1 FROM geoserve_jobs FOR UPDATE").fetchall()

            def dismiss() -> None:
                try:
                    store.dismiss(job.job_id)
                except BaseException as exc:
                    errors.append(exc)

            # (the store's connections are per thread: this thread's own is made there)
            thread = threading.Thread(target=dismiss)
            thread.start()
            with psycopg.connect(pg_server.dsn(), autocommit=True) as admin:
                deadline = time.monotonic() + 10
                waiting: list[tuple[int]] = []
                while not waiting and time.monotonic() < deadline:
                    waiting = admin.execute(
                        "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                        " AND pid <> %s",
                        (pid,),
                    ).fetchall()
                    time.sleep(0.02)
                assert len(waiting) == 1, "the dismissal never waited on the row"
                admin.execute("SELECT pg_terminate_backend(%s)", waiting[0])
            thread.join(timeout=10)
            holder.rollback()
        assert [type(e) for e in errors] == [JobStoreError]
        assert "terminating connection" in str(errors[0])
        assert store.get(job.job_id).status == ACCEPTED
