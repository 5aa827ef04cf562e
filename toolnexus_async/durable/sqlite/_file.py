"""``RunFile``: the run store's one connection to its SQLite file, and what a fault leaves.

Rules of this module:

- One ``sqlite3`` connection per store, used by one worker thread at a time (a capacity
  limiter of one), never on the event loop: :meth:`RunFile.run` is the only way to it, for
  the committer's batches as for every read. It is opened on first use.
- Opening checks the file inside ``BEGIN IMMEDIATE``: a file stamped by another
  application, or by a newer release, is refused and never written to; a new file gets
  the schema, an older one is migrated (``_ops.migrate``). Only then are WAL and the
  ``synchronous`` level asked for, so a foreign file keeps its journal mode.
- ``sqlite3`` errors become :class:`StoreError` naming the file (:meth:`RunFile.error`,
  ``_sqlite_file.store_error``); a passing fault is a :class:`StoreUnavailableError`.
- **What a fault leaves.** A connection the fault may have spoilt
  (``_sqlite_file.spoilt``), or one left inside a transaction, is closed, and the next
  call opens the file afresh, so the same store works again once the fault is gone. One
  opened while the file was not writable (SQLite then opens it read-only, for good) is
  opened afresh by the first call to find the file writable again. An in-memory
  database's connection is its database: it is kept, and rolled back instead.
- :meth:`RunFile.close` runs in the worker thread after the job in it, so a connection
  being opened by that job is closed too, not leaked; after it nothing opens the file.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
from collections.abc import Callable
from typing import Literal, TypeVar

import anyio
import anyio.to_thread

from ..._core.errors import StoreError, UsageError
from ..._io.sqlite_file import spoilt, store_error, writable
from . import _queries as queries
from ._ops import migrate
from ._schema import APPLICATION_ID, SCHEMA_VERSION, create

__all__ = ("RunFile",)

log = logging.getLogger("toolnexus_async.durable")

T = TypeVar("T")


class RunFile:
    """The connection of one run store to ``path`` (``":memory:"`` for a private database).

    ``label`` names the store in errors ("run store", "memory run store"); ``timeout`` is
    how long to wait for another process's write lock; ``synchronous`` is SQLite's level
    (``"FULL"`` or ``"NORMAL"``), checked by the store.
    """

    def __init__(
        self,
        path: str,
        *,
        label: str,
        timeout: float,
        synchronous: Literal["FULL", "NORMAL"],
    ) -> None:
        self.path = path
        self.label = label
        self.timeout = timeout
        self._synchronous = synchronous
        self._conn: sqlite3.Connection | None = None
        # The connection was opened while the file was not writable: SQLite then opens it
        # read-only, for good (``_sqlite_file.writable``).
        self._read_only = False
        # Set by the close itself, in the worker thread after the jobs queued before it:
        # from then on the connection is never (re)opened.
        self._shut = False
        self._thread = anyio.CapacityLimiter(1)
        # Held in the worker thread by whatever uses the connection. The limiter alone is
        # not enough: a task cancelled natively (asyncio's own cancel, which anyio's shields
        # do not stop) lets go of it while its job goes on in the thread, and the next job,
        # or the close, would then use the connection beside it (SQLite can crash on that).
        self._using = threading.Lock()

    def error(
        self, exc: sqlite3.Error, *, writing: bool = False, opening: bool = False
    ) -> StoreError:
        """``exc`` as the :class:`StoreError` that names this store and its file."""
        return store_error(
            exc, self.label, self.path, timeout=self.timeout, writing=writing, opening=opening
        )

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn(connection)`` in the store's worker thread, on an open connection."""

        def job() -> T:
            with self._using:
                conn = self._open()
                try:
                    return fn(conn)
                except BaseException as exc:
                    self._after_failure(conn, exc)
                    raise

        return await anyio.to_thread.run_sync(job, limiter=self._thread)

    async def close(self) -> None:
        """Close the connection for good; idempotent (the store shields it)."""

        def close() -> None:
            with self._using:
                self._shut = True
                conn, self._conn = self._conn, None
                if conn is not None:
                    conn.close()

        await anyio.to_thread.run_sync(close, limiter=self._thread)

    def _open(self) -> sqlite3.Connection:
        if self._shut:
            raise UsageError(f"this {self.label} is closed")
        if self._conn is not None and self._read_only and writable(self.path):
            conn, self._conn = self._conn, None
            with contextlib.suppress(sqlite3.Error):
                conn.close()
        if self._conn is None:
            self._conn = self._connect()
            self._read_only = not writable(self.path)
        return self._conn

    def _connect(self) -> sqlite3.Connection:
        """Open the file, check it is ours and current (creating or migrating it), WAL."""
        try:
            conn = sqlite3.connect(
                self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise self.error(exc, opening=True) from exc
        try:
            conn.create_function("tnx_lower", 1, queries.lower, deterministic=True)
            conn.execute("BEGIN IMMEDIATE")
            try:
                self._check_schema(conn)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            if self.path != ":memory:":
                # After the check: a foreign file must not have its journal mode changed.
                mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    log.warning("run store %s: WAL unavailable, journal mode %s", self.path, mode)
            conn.execute(f"PRAGMA synchronous={self._synchronous}")
        except sqlite3.Error as exc:
            conn.close()
            raise self.error(exc, opening=True) from exc
        except BaseException:
            conn.close()
            raise
        return conn

    def _check_schema(self, conn: sqlite3.Connection) -> None:
        app = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if app == 0 and version == 0:
            if conn.execute("SELECT name FROM sqlite_master LIMIT 1").fetchone():
                raise StoreError(f"{self.path} is a SQLite file of another application")
            create(conn)
            return
        if app != APPLICATION_ID:
            raise StoreError(f"{self.path} is a SQLite file of another application (id {app})")
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"run store {self.path} has schema version {version}, from a newer release;"
                f" this release reads version {SCHEMA_VERSION}"
            )
        if version < SCHEMA_VERSION:
            migrate(conn, version, self.path)

    def _after_failure(self, conn: sqlite3.Connection, exc: BaseException) -> None:
        """Leave no transaction open, nor a connection a fault may have spoilt (one opened
        while the file was read-only stays read-only); in the worker thread."""
        if self.path == ":memory:":
            # Its connection is its database: kept, and rolled back if a ROLLBACK failed.
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
        elif spoilt(exc) or conn.in_transaction:
            self._conn = None
            # Closing rolls back whatever is open; the error told is the fault.
            with contextlib.suppress(sqlite3.Error):
                conn.close()
