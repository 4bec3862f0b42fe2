"""One SQL database's connections for the job store: one per thread, transactions, errors.

:class:`SqlConnections` is what :class:`~geoserve.jobs.sql.SqlJobStore` stands on: a subclass
says how to connect, how a transaction begins and how times are stored; each thread gets its
own connection, made on its first call, used by its thread alone and closed when the store is
(or, for a thread that has ended, when another thread connects). A driver's error is a
:class:`~geoserve.errors.JobStoreError` naming the store.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, suppress
from datetime import datetime
from typing import Any, Protocol

from geoserve.errors import JobStoreError, ShuttingDownError


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


class SqlConnections(ABC):
    """Per-thread connections and transactions to one database (see the module docstring)."""

    #: how the database driver writes a parameter
    placeholder = "?"
    #: the driver's errors: any of them raised by a call is a :class:`JobStoreError`
    db_errors: tuple[type[Exception], ...] = ()

    def __init__(self, where: str) -> None:
        #: the store's file or server, as messages name it (never a password)
        self.where = where
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

    def close(self) -> None:
        """Close every connection; later calls raise ShuttingDownError."""
        with self._lock:
            self._closed = True
            connections, self._connections = list(self._connections.values()), {}
        for conn in connections:
            self.close_connection(conn)
