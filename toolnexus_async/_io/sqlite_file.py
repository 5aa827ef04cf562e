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
  and the file, by :func:`store_error`: a passing fault of the file (locked by another
  process past the timeout, disk full, read-only, an I/O error, out of memory) is a
  :class:`StoreUnavailableError` that names the cause; anything else (a corrupt file, not
  a database, a foreign schema) stays a plain :class:`StoreError`.
- After a fault that may have spoilt the connection (read-only, cannot open, an I/O
  error: :func:`spoilt`), or any failure that leaves it inside a transaction, the
  connection is closed and the next call opens the file afresh. A lock or a full disk
  spoils nothing: the connection is kept, and reads go on while another process holds the
  write lock. An in-memory database's connection is always kept: it is the database.
- SQLite opens a file it may not write read-only, silently, and the connection stays so.
  One opened so (:func:`writable` says no) is opened afresh by the first call to find
  the file writable again, so the first write after the fault is not refused.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, ClassVar, Self, TypeVar

import aiosqlite
import anyio

from .._core.closing import Closing
from .._core.errors import StoreError, StoreUnavailableError, UsageError

__all__ = ("Conn", "SqliteFile", "rows", "spoilt", "store_error", "writable")

T = TypeVar("T")

Conn = aiosqlite.Connection


# The primary result codes (the low byte of ``sqlite_errorcode``) of a passing fault: the
# file, its disk or its lock, not its content. SQLITE_PROTOCOL is a race for the WAL's
# locks that SQLite lost several times over; SQLITE_NOMEM, memory that may come back. A
# corrupt file (SQLITE_CORRUPT, SQLITE_NOTADB) will not mend by waiting, nor will a
# statement's own error (SQLITE_ERROR, SQLITE_CONSTRAINT).
_PASSING = frozenset(
    {
        sqlite3.SQLITE_BUSY,
        sqlite3.SQLITE_LOCKED,
        sqlite3.SQLITE_NOMEM,
        sqlite3.SQLITE_READONLY,
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_FULL,
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_PROTOCOL,
    }
)


# Of those, the faults after which the connection is not to be trusted: one opened while
# the file was read-only stays read-only, even once the file is writable again; after an
# I/O error, or a WAL or shared-memory file it could not open, what it holds of the file
# may be stale.
_SPOILING = frozenset({sqlite3.SQLITE_READONLY, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_CANTOPEN})


def _code(exc: sqlite3.Error) -> int | None:
    # Errors Python raises itself (a closed connection, a bad parameter) carry no code.
    code = getattr(exc, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


def spoilt(exc: BaseException) -> bool:
    """Whether ``exc`` is a fault after which the connection is to be opened afresh."""
    return isinstance(exc, sqlite3.Error) and _code(exc) in _SPOILING


def writable(path: str) -> bool:
    """Whether this process may write the file now (not on a read-only mount, not
    immutable, permitted); an in-memory database is."""
    return path == ":memory:" or os.access(path, os.W_OK)


def _read_only_mount(path: str) -> bool:
    try:
        return bool(os.statvfs(os.path.dirname(os.path.abspath(path))).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _cause(code: int | None, path: str, timeout: float) -> str:
    """The fault in words, for the message: SQLite's own text does not say which file, and
    "unable to open database file" does not say why."""
    memory = path == ":memory:"
    if code in (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN) and _read_only_mount(path):
        return "read-only (its file system is mounted read-only)"
    if code == sqlite3.SQLITE_READONLY:
        return "read-only"
    if code == sqlite3.SQLITE_CANTOPEN:
        if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            return "cannot be opened: its directory does not exist"
        return "cannot be opened (no permission, or no file descriptor left)"
    if code == sqlite3.SQLITE_BUSY:
        return f"locked by another process for longer than the {timeout:g} s timeout"
    if code == sqlite3.SQLITE_LOCKED:
        return "locked by another connection of this process"
    if code in (sqlite3.SQLITE_NOMEM, sqlite3.SQLITE_FULL) and memory:
        return "out of memory"
    if code == sqlite3.SQLITE_FULL:
        return "disk full"
    if code == sqlite3.SQLITE_NOMEM:
        return "out of memory"
    if code == sqlite3.SQLITE_IOERR:
        return "disk I/O error"
    return "its WAL locks are contended"  # SQLITE_PROTOCOL


def store_error(
    exc: sqlite3.Error,
    label: str,
    path: str,
    *,
    timeout: float,
    writing: bool = False,
    opening: bool = False,
) -> StoreError:
    """The :class:`StoreError` a ``sqlite3`` error of the store at ``path`` amounts to.

    A passing fault is a :class:`StoreUnavailableError` naming the file and the cause.
    For a write (``writing``) it also says what became of it: SQLite commits all of a
    transaction or none, and every such fault but an I/O error stops it before its commit
    record is written; an I/O error may strike after (a failed ``fsync``), and then the
    write may have reached the disk. ``opening``: the error came while the file was being
    opened and checked, before the call's own statements.
    """
    code = _code(exc)
    if code not in _PASSING:
        where = f"{label} {path}" + (" cannot be opened" if opening else "")
        if code in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
            return StoreError(f"{where}: it is damaged or not a SQLite database ({exc})")
        return StoreError(f"{where}: {exc}")
    message = f"{label} {path} is unavailable: {_cause(code, path, timeout)} ({exc})"
    if opening:
        message += "; it could not be opened, so no write of this call was committed"
    elif writing and code == sqlite3.SQLITE_IOERR:
        message += "; this write may or may not have been committed"
    elif writing:
        message += "; this write was not committed"
    return StoreUnavailableError(message + "; what was committed before is intact, retry later")


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
        await conn.execute("COMMIT")
    except BaseException:
        # A COMMIT that failed (disk full, an I/O error) may leave the transaction open,
        # or SQLite may have rolled it back itself already.
        if conn.in_transaction:
            await conn.execute("ROLLBACK")
        raise
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
        self._read_only = False  # the connection was opened while the file was not writable
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

    async def _locked(self, op: Callable[[Conn], Awaitable[T]], *, writing: bool = False) -> T:
        """Run ``op`` alone on the connection: a read, or one statement, needs no transaction
        of its own (autocommit makes a single statement atomic)."""
        async with self._lock:
            conn = await self._connection()
            try:
                return await op(conn)
            except BaseException as exc:
                if self.path != ":memory:" and (spoilt(exc) or conn.in_transaction):
                    self._conn = None
                    # Closing rolls back whatever is open; the error told is the fault.
                    with anyio.CancelScope(shield=True), contextlib.suppress(sqlite3.Error):
                        await conn.close()
                if isinstance(exc, sqlite3.Error):
                    raise self._error(exc, writing=writing) from exc
                raise

    def _error(
        self, exc: sqlite3.Error, *, writing: bool = False, opening: bool = False
    ) -> StoreError:
        return store_error(
            exc, self._label, self.path, timeout=self._timeout, writing=writing, opening=opening
        )

    async def _write(self, op: Callable[[Conn], Awaitable[T]]) -> T:
        """Run a one-statement write shielded: once sent, a cancel scope cannot orphan it.
        A write that raises :class:`StoreUnavailableError` says whether it was committed
        (it was not, unless the fault was an I/O error)."""

        async def shielded(conn: Conn) -> T:
            with anyio.CancelScope(shield=True):
                result = await op(conn)
            return result

        return await self._locked(shielded, writing=True)

    async def _atomic(self, op: Callable[[Conn], Awaitable[T]]) -> T:
        """Run ``op`` in one write transaction, committed only if it returns."""

        async def transaction(conn: Conn) -> T:
            with anyio.CancelScope(shield=True):
                result = await _transaction(conn, op)
            return result

        return await self._locked(transaction, writing=True)

    async def _connection(self) -> Conn:
        if self._closed:
            raise UsageError(f"this {self._label} is closed")
        if self._conn is not None and self._read_only and writable(self.path):
            conn, self._conn = self._conn, None
            with anyio.CancelScope(shield=True):
                await conn.close()
        if self._conn is None:
            try:
                conn = await aiosqlite.connect(
                    self.path, isolation_level=None, timeout=self._timeout
                )
            except sqlite3.Error as exc:
                raise self._error(exc, opening=True) from exc
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
            self._read_only = not writable(self.path)
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
            raise self._error(exc, opening=True) from exc

    async def _check_schema(self, conn: Conn) -> None:
        """Refuse a file that is not this store's, or not current; create a new file's
        schema. Runs inside the opening transaction, so a refusal changes nothing."""
        raise NotImplementedError
