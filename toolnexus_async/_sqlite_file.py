"""``SqliteFile``: the connection plumbing of a store kept in one SQLite file.

Rules of this module:

- A store holds one connection, opened on first use (or by ``async with``) in autocommit
  mode (``isolation_level=None``): the only transactions are the ones the store begins.
  :meth:`SqliteFile.aclose` closes it, and aiosqlite's worker thread with it.
- Within a process, that connection (one worker thread) is shared by every task, so a lock
  keeps one task's statements from interleaving with another's.
- Opening checks the file inside ``BEGIN IMMEDIATE`` (the subclass's ``_check_schema``: is
  the file ours and current, creating the schema in a new file); only then is WAL asked
  for. A file that fails is closed again, unchanged.
- A write is shielded from cancel scopes: once sent, a time limit must not orphan it, leave
  the connection inside ``BEGIN``, nor lose a change another statement depends on.
- ``sqlite3`` errors are mapped to :class:`StoreError` naming the store (its ``_label``)
  and the file.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, ClassVar, Self, TypeVar

import aiosqlite
import anyio

from ._closing import Closing
from ._errors import StoreError, UsageError

__all__ = ("Conn", "SqliteFile", "rows")

T = TypeVar("T")

Conn = aiosqlite.Connection


async def rows(conn: Conn, sql: str, params: Iterable[Any] = ()) -> list[Any]:
    """Every row ``sql`` yields, as a list."""
    return list(await conn.execute_fetchall(sql, tuple(params)))


async def _transaction(conn: Conn, op: Callable[[Conn], Awaitable[T]]) -> T:
    """Run ``op`` inside ``BEGIN IMMEDIATE``: committed if it returns, rolled back if not."""
    # IMMEDIATE takes SQLite's write lock up front, so two processes are serialised here
    # rather than failing halfway when one upgrades a read lock.
    await conn.execute("BEGIN IMMEDIATE")
    try:
        result = await op(conn)
    except BaseException:
        await conn.execute("ROLLBACK")
        raise
    await conn.execute("COMMIT")
    return result


class SqliteFile(Closing):
    """A store's connection to its SQLite file; a subclass adds the tables and the calls.

    A subclass sets ``_label`` (how messages name it, e.g. ``"run store"``) and ``_log``
    (where a missing WAL is reported), and implements :meth:`_check_schema`.

    Args:
        path: the database file (created if missing).
        timeout: seconds to wait for another process's write lock before giving up.
    """

    _label: ClassVar[str]
    _log: ClassVar[logging.Logger]

    def __init__(self, path: str | os.PathLike[str], *, timeout: float = 10.0) -> None:
        self.path = os.fspath(path)
        self._timeout = timeout
        self._conn: Conn | None = None
        self._closed = False
        self._lock = anyio.Lock()

    async def aclose(self) -> None:
        """Close the connection and its worker thread; idempotent."""
        async with self._lock:
            self._closed = True
            conn, self._conn = self._conn, None
            if conn is not None:
                with anyio.CancelScope(shield=True):
                    await conn.close()

    async def __aenter__(self) -> Self:
        await self._locked(self._noop)
        return self

    @staticmethod
    async def _noop(conn: Conn) -> None:
        return None

    async def _locked(self, op: Callable[[Conn], Awaitable[T]]) -> T:
        """Run ``op`` alone on the connection: a read, or one statement, needs no transaction
        of its own (autocommit makes a single statement atomic)."""
        async with self._lock:
            conn = await self._connection()
            try:
                return await op(conn)
            except sqlite3.Error as exc:
                raise StoreError(f"{self._label} {self.path}: {exc}") from exc

    async def _write(self, op: Callable[[Conn], Awaitable[T]]) -> T:
        """Run a one-statement write shielded: once sent, a cancel scope cannot orphan it."""

        async def shielded(conn: Conn) -> T:
            with anyio.CancelScope(shield=True):
                result = await op(conn)
            return result

        return await self._locked(shielded)

    async def _atomic(self, op: Callable[[Conn], Awaitable[T]]) -> T:
        """Run ``op`` in one write transaction, committed only if it returns."""

        async def transaction(conn: Conn) -> T:
            with anyio.CancelScope(shield=True):
                result = await _transaction(conn, op)
            return result

        return await self._locked(transaction)

    async def _connection(self) -> Conn:
        if self._closed:
            raise UsageError(f"this {self._label} is closed")
        if self._conn is None:
            try:
                conn = await aiosqlite.connect(
                    self.path, isolation_level=None, timeout=self._timeout
                )
            except sqlite3.Error as exc:
                raise StoreError(f"{self._label} {self.path} cannot be opened: {exc}") from exc
            try:
                # Shielded: a cancelled opener must not leave the check's BEGIN open.
                with anyio.CancelScope(shield=True):
                    await self._prepare(conn)
            except BaseException:
                # Closed even when cancelled, or its worker thread would outlive the store.
                with anyio.CancelScope(shield=True):
                    await conn.close()
                raise
            self._conn = conn
        return self._conn

    async def _prepare(self, conn: Conn) -> None:
        """Check the file is ours and current (creating the schema in a new file), then WAL."""
        try:
            await _transaction(conn, self._check_schema)
            # After the check: a foreign file must not have its journal mode changed.
            mode = await rows(conn, "PRAGMA journal_mode=WAL")
            if str(mode[0][0]).lower() != "wal":
                # The template is built from the label, not passed as an argument, so each
                # store's records keep the message template they have always had.
                self._log.warning(
                    self._label + " %s: WAL unavailable, journal mode %s", self.path, mode
                )
        except sqlite3.Error as exc:
            raise StoreError(f"{self._label} {self.path} cannot be opened: {exc}") from exc

    async def _check_schema(self, conn: Conn) -> None:
        """Refuse a file that is not this store's, or not current; create a new file's
        schema. Runs inside the opening transaction, so a refusal changes nothing."""
        raise NotImplementedError
