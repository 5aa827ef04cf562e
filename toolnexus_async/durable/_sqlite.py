"""``SqliteRunStore``: halted runs in one SQLite file, shared safely between processes.

Rules of this module:

- One file, WAL journal, three tables: ``runs`` (run id, save order, time, JSON text),
  ``requests`` (request id -> run id) and ``claimed`` (tombstones of resumed request ids,
  bounded). The file is stamped with an application id and a schema version; a file that is
  not ours, or is from a newer release, is refused with :class:`StoreError` and never
  written to.
- Every change is one ``BEGIN IMMEDIATE`` transaction, which takes SQLite's write lock up
  front: two processes (or two tasks) claiming the same request are serialised by SQLite,
  so exactly one gets the run and the other sees the tombstone.
- The connection is :class:`~toolnexus_async._sqlite_file.SqliteFile`'s, and so are its
  rules: one connection per store behind a lock, and ``sqlite3`` errors mapped to
  :class:`StoreError` naming the file. Every transaction goes through ``_atomic``, which
  shields it from cancel scopes: a time limit must not leave the connection inside
  ``BEGIN``, nor lose a run that a committed claim already removed.
"""

from __future__ import annotations

import logging
import os
import time

from .._errors import AlreadyResumedError, StoreError, UnknownRequestError, UsageError
from .._results import RunResult
from .._sqlite_file import Conn, SqliteFile, rows
from .._types import Request
from ._store import DEFAULT_REMEMBER, decode_run, encode_run, outstanding_requests

__all__ = ("SqliteRunStore",)

log = logging.getLogger("toolnexus_async.durable")

# "TnxA": SQLite's header field for telling one application's files from another's.
APPLICATION_ID = 0x546E7841
SCHEMA_VERSION = 1

_SCHEMA = (
    """CREATE TABLE runs (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id TEXT NOT NULL UNIQUE,
        created REAL NOT NULL,
        body TEXT NOT NULL)""",
    """CREATE TABLE requests (
        request_id TEXT PRIMARY KEY,
        run_id TEXT NOT NULL)""",
    "CREATE INDEX requests_by_run ON requests(run_id)",
    """CREATE TABLE claimed (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        request_id TEXT NOT NULL UNIQUE,
        run_id TEXT NOT NULL,
        claimed REAL NOT NULL)""",
)


def _marks(n: int) -> str:
    return ",".join("?" * n)


class SqliteRunStore(SqliteFile):
    """A :class:`RunStore` in one SQLite file; the embedded default for durable hosts.

    The file is opened on first use, or by ``async with``; :meth:`aclose` closes it (and
    the connection's worker thread). Several stores, in one process or many, may share one
    file.

    Args:
        path: the database file (created if missing).
        timeout: seconds to wait for another process's write lock before giving up.
        remember: how many claimed request ids are kept as tombstones.
    """

    _label = "run store"
    _log = log

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        timeout: float = 10.0,
        remember: int = DEFAULT_REMEMBER,
    ) -> None:
        if remember < 0:
            raise UsageError(f"remember must be >= 0, got {remember}")
        super().__init__(path, timeout=timeout)
        self._remember = remember

    def __repr__(self) -> str:
        return f"SqliteRunStore({self.path!r})"

    async def save(self, run: RunResult) -> None:
        text, ids = encode_run(run)

        async def op(conn: Conn) -> None:
            owners = await rows(
                conn,
                f"SELECT request_id, run_id FROM requests WHERE request_id IN ({_marks(len(ids))})",
                ids,
            )
            for request_id, owner in owners:
                if owner != run.run_id:
                    raise UsageError(f"request {request_id!r} is already filed under run {owner!r}")
            await conn.execute("DELETE FROM requests WHERE run_id = ?", (run.run_id,))
            await conn.execute("DELETE FROM runs WHERE run_id = ?", (run.run_id,))
            await conn.execute(
                "INSERT INTO runs (run_id, created, body) VALUES (?, ?, ?)",
                (run.run_id, time.time(), text),
            )
            await conn.executemany(
                "INSERT INTO requests (request_id, run_id) VALUES (?, ?)",
                [(request_id, run.run_id) for request_id in ids],
            )
            # Put back after a failed resume: those ids are outstanding again.
            await conn.execute(f"DELETE FROM claimed WHERE request_id IN ({_marks(len(ids))})", ids)

        await self._atomic(op)

    async def load(self, request_id: str) -> RunResult:
        async def op(conn: Conn) -> RunResult:
            run_id, body = await self._find(conn, request_id)
            return decode_run(body, run_id, request_id)

        return await self._locked(op)

    async def claim(self, request_id: str) -> RunResult:
        async def op(conn: Conn) -> RunResult:
            run_id, body = await self._find(conn, request_id)
            # Decoded before anything is deleted: a corrupt row stays for a human to inspect.
            run = decode_run(body, run_id, request_id)
            ids = await rows(conn, "SELECT request_id FROM requests WHERE run_id = ?", (run_id,))
            await conn.execute("DELETE FROM requests WHERE run_id = ?", (run_id,))
            await conn.execute("DELETE FROM runs WHERE run_id = ?", (run_id,))
            now = time.time()
            await conn.executemany(
                "INSERT OR REPLACE INTO claimed (request_id, run_id, claimed) VALUES (?, ?, ?)",
                [(row[0], run_id, now) for row in ids],
            )
            await conn.execute(
                "DELETE FROM claimed WHERE seq <= (SELECT MAX(seq) FROM claimed) - ?",
                (self._remember,),
            )
            return run

        return await self._atomic(op)

    async def requests(self) -> list[Request]:
        async def op(conn: Conn) -> list[Request]:
            out: list[Request] = []
            for run_id, body in await rows(conn, "SELECT run_id, body FROM runs ORDER BY seq"):
                try:
                    out.extend(outstanding_requests(decode_run(body, str(run_id))))
                except StoreError as exc:
                    log.warning("skipping a stored run in %s: %s", self.path, exc)
            return out

        return await self._locked(op)

    async def _find(self, conn: Conn, request_id: str) -> tuple[str, object]:
        found = await rows(
            conn,
            "SELECT runs.run_id, runs.body FROM requests JOIN runs USING (run_id)"
            " WHERE requests.request_id = ?",
            (request_id,),
        )
        if found:
            return str(found[0][0]), found[0][1]
        tomb = await rows(conn, "SELECT run_id FROM claimed WHERE request_id = ?", (request_id,))
        if tomb:
            raise AlreadyResumedError(
                request_id, f"request {request_id!r} (run {tomb[0][0]!r}) was resumed already"
            )
        raise UnknownRequestError(request_id, f"no stored run waits for request {request_id!r}")

    async def _check_schema(self, conn: Conn) -> None:
        app = (await rows(conn, "PRAGMA application_id"))[0][0]
        version = (await rows(conn, "PRAGMA user_version"))[0][0]
        if app == 0 and version == 0:
            if await rows(conn, "SELECT name FROM sqlite_master LIMIT 1"):
                raise StoreError(f"{self.path} is a SQLite file of another application")
            for statement in _SCHEMA:
                await conn.execute(statement)
            await conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            await conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            return
        if app != APPLICATION_ID:
            raise StoreError(f"{self.path} is a SQLite file of another application (id {app})")
        if version != SCHEMA_VERSION:
            newer = "a newer release" if version > SCHEMA_VERSION else "an unknown release"
            raise StoreError(
                f"run store {self.path} has schema version {version}, from {newer};"
                f" this release reads version {SCHEMA_VERSION}"
            )
