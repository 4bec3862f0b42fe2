"""Opening a job store: the ``job_store`` setting, the SQLite file and its schema version."""

from __future__ import annotations

import sqlite3
import stat
import threading
from pathlib import Path

import pytest

from geoserve.errors import ConfigError
from geoserve.jobs import SQLiteJobStore, open_job_store
from tests.jobs.conftest import new_database
from tests.jobs.pg_server import PgServer


def test_sqlite_file_is_owner_only_and_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    with open_job_store(path) as store:
        store.create("p", {})
        files = sorted(p.name for p in tmp_path.iterdir())
        assert files == ["jobs.db", "jobs.db-shm", "jobs.db-wal"]
        for name in files:
            assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600, name
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert conn.execute("SELECT value FROM geoserve_job_meta").fetchall() == [("1",)]


@pytest.mark.parametrize("form", ["path", "str", "url"])
def test_setting_forms_name_sqlite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, form: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    setting = {
        "path": tmp_path / "sub" / "a.db",
        "str": str(tmp_path / "sub" / "a.db"),
        "url": "sqlite:///sub/a.db",  # relative to the working folder
    }[form]
    with open_job_store(setting) as store:
        assert isinstance(store, SQLiteJobStore)
        job = store.create("p", {"x": 1})
    with open_job_store(f"sqlite:///{tmp_path}/sub/a.db") as store:  # sqlite:////abs/path
        assert store.get(job.job_id).spec == {"x": 1}


def test_postgres_urls(pg_server: PgServer) -> None:
    from geoserve.jobs.postgres import PostgresJobStore

    dsn = new_database(pg_server)
    for url in (dsn, dsn.replace("postgresql://", "postgres://"), "POSTGRESQL" + dsn[10:]):
        with open_job_store(url) as store:
            assert isinstance(store, PostgresJobStore)
            store.create("p", {})
    with open_job_store(dsn) as store:
        assert store.count() == 3


def test_unreachable_postgres_is_a_config_error_without_the_password() -> None:
    with pytest.raises(ConfigError, match=r"^job_store: cannot use PostgreSQL") as info:
        open_job_store("postgresql://me:s3cret@127.0.0.1:1/jobs")
    assert "s3cret" not in str(info.value)
    assert "dbname=jobs" in str(info.value)


@pytest.mark.parametrize(
    ("setting", "match"),
    [
        ("mysql://user:pw@db/jobs", "unknown scheme 'mysql://'"),
        ("redis://cache:6379", "unknown scheme 'redis://'"),
        ("sqlite://", "a SQLite URL names a file"),
        ("sqlite:///", "a SQLite URL names a file"),
        ("", "job_store: name a file"),
        ("   ", "job_store: name a file"),
    ],
)
def test_bad_settings_name_job_store(setting: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        open_job_store(setting)
    assert str(info.value).startswith("job_store: ")
    assert "pw@" not in str(info.value)


def test_bad_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a folder"):
        open_job_store(tmp_path)
    with pytest.raises(ConfigError, match="does not exist"):
        open_job_store(tmp_path / "missing" / "jobs.db")
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database, " * 100)
    with pytest.raises(ConfigError, match=r"job_store: .*garbage\.db is not a job store"):
        open_job_store(garbage)
    assert garbage.read_bytes().startswith(b"this is not")  # left as it was


def test_other_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    with open_job_store(path) as store:
        job = store.create("p", {})
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE geoserve_job_meta SET value = '2' WHERE key = 'schema_version'")
    with pytest.raises(ConfigError, match="schema version 2; this geoserve reads version 1"):
        open_job_store(path)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE geoserve_job_meta SET value = '1'")
    with open_job_store(path) as store:
        assert store.get(job.job_id) == job


def test_two_stores_open_one_new_file_at_once(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    stores: list[SQLiteJobStore] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def open_one() -> None:
        try:
            barrier.wait()
            stores.append(SQLiteJobStore(path))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    assert len(stores) == 4
    job = stores[0].create("p", {})
    assert all(store.get(job.job_id) == job for store in stores)
    for store in stores:
        store.close()
