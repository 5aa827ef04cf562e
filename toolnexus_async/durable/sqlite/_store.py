"""``SqliteRunStore``: the run journal in one SQLite file, shared safely between processes.

Rules of this module:

- **Group commit.** Every write is queued and committed with others in one transaction
  by the store's committer (``_committer.GroupCommit``, whose rules hold here), never by
  its caller. A write's caller resumes only after its transaction committed: with WAL
  and ``synchronous=FULL`` what it wrote survives ``kill -9`` of the process (and power
  loss); ``synchronous="NORMAL"`` keeps the first and trades the second for speed.
- ``BEGIN IMMEDIATE`` takes SQLite's write lock up front, so two processes (or two tasks)
  answering the same request are serialised by SQLite: exactly one is accepted.
- The connection, its worker thread, the schema check and what a fault leaves of the
  connection are ``_file.RunFile``'s (its rules hold here); reads and the committer's
  batches go through it alike.
- **Passing faults.** The file locked by another process past ``timeout``, a full disk, a
  read-only file, an I/O error, no memory: :class:`StoreUnavailableError`, naming the file
  and the cause. Every write of a batch that failed so is failed with it, none is
  committed (but after an I/O error, which may strike after the commit record is written)
  and none is retried (``_committer``). The same store object works again once the fault
  is gone.
- Values are encoded on the caller's side, before anything is queued (see the contract's
  section below).
- :class:`MemoryRunStore` is the same store over a private in-memory database: one
  implementation of the contract, nothing on disk.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, Literal, Self, TypeVar

import anyio

from ..._core.audit import AnswerRecord, check_answered_by
from ..._core.errors import UsageError
from ..._core.results import RunResult, ToolCallRecord, record_to_json
from ..._core.types import Answer, Request
from ..._core.wire import approval_claim
from .. import _run_events as run_events
from .._decide import saved
from .._listing import RequestPage, RequestQuery, RunPage, RunQuery, RunView
from .._rows import encode, plain, prompt_of, state_text
from .._run_events import EventRead, Watchers, expired_request, saved_events, started_events
from .._store import Accepted, RunSummary, StoredRequest, StoredRun, StoreEvent
from . import _queries as queries
from ._asked import asked_with_turn
from ._committer import GroupCommit
from ._file import RunFile
from ._ops import Ops
from ._schema import APPLICATION_ID

__all__ = ("APPLICATION_ID", "MemoryRunStore", "SqliteRunStore")

log = logging.getLogger("toolnexus_async.durable")

T = TypeVar("T")

# Ended runs kept for listings and late answers; older ones are forgotten.
DEFAULT_KEEP_FINISHED = 10_000


class SqliteRunStore:
    """A :class:`RunStore` in one SQLite file; the embedded default for durable hosts.

    The file is opened on first use, or by ``async with``; :meth:`aclose` closes it.
    Several stores, in one process or many, may share one file.

    Args:
        path: the database file (created if missing).
        timeout: seconds to wait for another process's write lock before giving up.
        keep_finished: how many ended runs are kept (for listings, and so that a late
            answer to one of their requests is told it came too late).
        synchronous: ``"FULL"`` (the default: a commit survives power loss) or
            ``"NORMAL"`` (it survives a crash of the process only; faster on slow disks).

    A passing fault of the file raises :class:`StoreUnavailableError` naming the file and
    the cause: locked by another process for longer than ``timeout``, disk full,
    read-only, cannot be opened, a disk I/O error, out of memory. Unlike a network
    database's, such a failed write is known not to be committed (SQLite commits a
    transaction whole or not at all, and these faults stop it before its commit record),
    except after a disk I/O error, which may come after the commit record was written. The
    same store object works again once the fault is gone; what was committed is intact. A
    damaged file, or one that is not a SQLite database, raises a plain :class:`StoreError`.
    """

    _label = "run store"
    # The connection's class: tests replace it to hold or trace the worker thread.
    _file_class: ClassVar[type[RunFile]] = RunFile

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        timeout: float = 10.0,
        keep_finished: int = DEFAULT_KEEP_FINISHED,
        synchronous: Literal["FULL", "NORMAL"] = "FULL",
    ) -> None:
        if keep_finished < 0:
            raise UsageError(f"keep_finished must be >= 0, got {keep_finished}")
        if synchronous not in ("FULL", "NORMAL"):
            raise UsageError(f"synchronous must be 'FULL' or 'NORMAL', got {synchronous!r}")
        self.path = os.fspath(path)
        self._keep = keep_finished
        self._file = self._file_class(
            self.path, label=self._label, timeout=timeout, synchronous=synchronous
        )
        self._run = self._file.run
        # ``aclose()`` refuses new calls at once, but the writes queued before it still
        # need the connection: only the file's own close, after them, shuts it for good.
        self._closed = False
        self._committed = Watchers()
        self._commits = GroupCommit(
            self._run,
            lambda exc: self._file.error(exc, writing=True),
            name=f"{self._label} {self.path}",
            task_name=f"{self} commits",
            timeout=timeout,
            keep=keep_finished,
            committed=self._committed,
        )
        self._listeners: list[Callable[[StoreEvent], None]] = []

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path!r})"

    # -- lifecycle --------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        self._check_open()
        await self._run(lambda conn: None)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection; idempotent. Writes queued before are committed first,
        and a call already in the worker thread (opening the connection, say) ends first."""
        self._closed = True
        with anyio.CancelScope(shield=True):
            await self._commits.flushed()
            await self._file.close()

    def _check_open(self) -> None:
        if self._closed:
            raise UsageError(f"this {self._label} is closed")

    # -- writes and reads -------------------------------------------------------------------

    def _write(self, op: Callable[..., T | Exception], args: tuple[Any, ...]) -> Awaitable[T]:
        """Queue ``op(ops, *args)`` for the committer (``GroupCommit.write``); the future
        is done once the transaction it went into committed."""
        self._check_open()
        return self._commits.write(op, args)

    async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        self._check_open()

        def job(conn: sqlite3.Connection) -> T:
            conn.execute("BEGIN")
            try:
                return fn(conn)
            finally:
                # A read that failed may have had its transaction ended by SQLite already.
                if conn.in_transaction:
                    conn.execute("COMMIT")

        try:
            return await self._run(job)
        except sqlite3.Error as exc:
            raise self._file.error(exc) from None

    # -- the contract --------------------------------------------------------------------------
    # Values are encoded here, on the caller's side: a queued write then holds strings
    # and numbers only (not the run's objects), which the garbage collector need not walk
    # while the write waits for its commit; and a value that is not JSON is refused
    # before anything is queued.

    async def start(self, state: RunResult, owner: str, lease_until: float, turn: int = 0) -> None:
        await self._write(Ops.start, _started(state, owner, lease_until, turn, time.time()))

    async def turn(self, state: RunResult, turn: int, owner: str) -> None:
        await self._write(Ops.turn, _turned(state, turn, owner, time.time()))

    async def record(self, run_id: str, record: ToolCallRecord, owner: str) -> None:
        text = encode(record_to_json(record), f"the result of call {record.call.id!r}")
        event, request_id = run_events.tool_result(run_id, record), expired_request(record)
        await self._write(
            Ops.record, (run_id, record.call.id, owner, text, event, request_id, time.time())
        )

    async def suspend(
        self,
        run_id: str,
        call_id: str,
        request: Request,
        owner: str,
        *,
        state: RunResult | None = None,
        turn: int = 0,
        lease_until: float | None = None,
    ) -> None:
        body = encode(request.to_dict(), f"request {request.id!r}")
        left = request.seconds_left()
        now = time.time()
        expires = None if left is None else now + left
        event = run_events.pending(run_id, request)
        kind, prompt = plain(request.kind), plain(request.prompt)
        asked = (run_id, call_id, owner, request.id, body, expires, kind, prompt, event, now)
        if state is None:
            await self._write(Ops.suspend, asked)
        elif lease_until is None:
            turned = _turned(state, turn, owner, now)
            await self._write(asked_with_turn, (Ops.turn, turned, asked))
        else:
            started = _started(state, owner, lease_until, turn, now)
            await self._write(asked_with_turn, (Ops.start, started, asked))
        self._tell(StoreEvent("requested", request.id, run_id, owner))

    async def halt(self, run_id: str, owner: str) -> None:
        await self._write(Ops.halt, (run_id, owner, time.time()))

    async def finish(self, result: RunResult, owner: str) -> None:
        final, event = state_text(result), run_events.done(result)
        await self._write(
            Ops.finish,
            (result.run_id, owner, final, time.time(), result.status, plain(result.text), event),
        )

    async def fail(self, run_id: str, error: str, owner: str) -> None:
        await self._write(Ops.fail, (run_id, error, owner, time.time()))

    async def release(self, run_id: str, owner: str) -> None:
        await self._write(Ops.release, (run_id, owner, time.time()))

    async def save(self, run: RunResult) -> None:
        await self._write(Ops.save, (saved(run), time.time(), saved_events(run)))

    async def accept(
        self,
        answer: Answer,
        now: float,
        *,
        delivered: bool = False,
        by: str | None = None,
        answered_by: str | None = None,
    ) -> Accepted:
        text = encode(answer.to_dict(), f"the answer to {answer.id!r}")
        who = check_answered_by(answered_by)
        claim = approval_claim(answer)
        taken: Accepted = await self._write(
            Ops.accept,
            (answer.id, text, now, delivered, claim, answer.ok, answer.reason, by, who),
        )
        self._tell(StoreEvent("answered", answer.id, taken.run_id, taken.owner, delivered))
        return taken

    async def claim(
        self, run_id: str, owner: str, lease_until: float, now: float
    ) -> StoredRun | None:
        return await self._write(Ops.claim, (run_id, owner, lease_until, now))

    async def renew(self, owner: str, lease_until: float) -> None:
        await self._write(Ops.renew, (owner, lease_until))

    async def delivered(self, request_ids: list[str]) -> None:
        await self._write(Ops.delivered, (list(request_ids),))

    async def ready(self, now: float, limit: int) -> list[str]:
        return await self._read(lambda conn: queries.ready(conn, now, limit))

    async def deliveries(self, owner: str) -> list[tuple[str, Answer]]:
        return await self._read(lambda conn: queries.deliveries(conn, owner))

    async def requests(self, now: float | None = None) -> list[Request]:
        at = time.time() if now is None else now
        return await self._read(lambda conn: queries.requests(conn, at))

    async def outstanding(self, now: float | None = None) -> list[StoredRequest]:
        at = time.time() if now is None else now
        return await self._read(lambda conn: queries.outstanding(conn, at))

    async def find(self, request_id: str) -> StoredRequest:
        return await self._read(lambda conn: queries.find(conn, request_id))

    async def load(self, run_id: str) -> StoredRun:
        return await self._read(lambda conn: queries.load(conn, run_id))

    async def runs(self, limit: int = 1000) -> list[RunSummary]:
        return await self._read(lambda conn: queries.runs(conn, limit))

    async def list_runs(self, query: RunQuery) -> RunPage:
        at = time.time()
        return await self._read(lambda conn: queries.list_runs(conn, query, at))

    async def list_requests(self, query: RequestQuery) -> RequestPage:
        at = time.time()
        return await self._read(lambda conn: queries.list_requests(conn, query, at))

    async def answers(self, run_id: str) -> list[AnswerRecord]:
        return await self._read(lambda conn: list(queries.answers(conn, run_id)))

    async def run_view(self, run_id: str) -> RunView:
        at = time.time()
        return await self._read(lambda conn: queries.view(conn, run_id, at))

    async def events(self, after: int, limit: int = 500) -> EventRead:
        return await self._read(lambda conn: queries.events(conn, after, limit))

    async def event_bounds(self) -> tuple[int, int]:
        return await self._read(queries.event_bounds)

    def watch(self, callback: Callable[[], None]) -> Callable[[], None]:
        """``callback()`` after each commit of this store object's writes (events of
        another process's writes to the same file are found by reading)."""
        return self._committed.add(callback)

    # -- the sign-in state of MCP servers (toolnexus_async.mcp.RunStoreTokens) -----------------

    async def mcp_token(self, key: str) -> str | None:
        """The value kept under ``key`` in ``mcp_tokens``, or ``None``."""
        row = await self._read(
            lambda conn: conn.execute(
                "SELECT value FROM mcp_tokens WHERE key = ?", (key,)
            ).fetchone()
        )
        return None if row is None else str(row[0])

    async def set_mcp_token(self, key: str, value: str | None) -> None:
        """Keep ``value`` under ``key`` in ``mcp_tokens`` (``None`` deletes it)."""
        await self._write(Ops.set_mcp_token, (key, value, time.time()))

    async def ping(self) -> None:
        """Read the file's header once; :class:`StoreUnavailableError` if it cannot."""
        # Not ``SELECT 1``: it touches no page, so it passes on a file that cannot be read.
        await self._read(lambda conn: conn.execute("PRAGMA user_version").fetchone())

    async def listen(
        self, callback: Callable[[StoreEvent], None], *, owner: str | None = None
    ) -> Callable[[], None]:
        """Events of the writes made through this store object (another process's writes
        to the same file are not seen: its hosts find them by looking); every one of
        them, ``owner`` or not (they are few: one process's)."""
        self._listeners.append(callback)
        return lambda: self._listeners.remove(callback) if callback in self._listeners else None

    def _tell(self, event: StoreEvent) -> None:
        for callback in tuple(self._listeners):
            try:
                callback(event)
            except Exception:
                log.exception("a run store listener raised on %r", event)


class MemoryRunStore(SqliteRunStore):
    """A :class:`RunStore` in this process's memory, for tests and single-process hosts:
    the SQLite store over a private in-memory database (the same contract, nothing on
    disk, gone with the process). Its one passing fault is running out of memory
    (:class:`StoreUnavailableError`, the write not committed); its connection, which is
    the database, is kept through it."""

    _label = "memory run store"

    def __init__(self, *, keep_finished: int = DEFAULT_KEEP_FINISHED) -> None:
        super().__init__(":memory:", keep_finished=keep_finished)

    def __repr__(self) -> str:
        return "MemoryRunStore()"


def _started(
    state: RunResult, owner: str, lease_until: float, turn: int, now: float
) -> tuple[Any, ...]:
    """``Ops.start``'s arguments for ``state``, new, through turn ``turn``."""
    text, prompt, events = state_text(state), prompt_of(state), started_events(state, turn)
    return (state.run_id, owner, lease_until, turn, text, prompt, now, events)


def _turned(state: RunResult, turn: int, owner: str, now: float) -> tuple[Any, ...]:
    """``Ops.turn``'s arguments for ``state``, ending with turn ``turn``'s ask."""
    return (state.run_id, turn, owner, state_text(state), now, run_events.tool_calls(state))
