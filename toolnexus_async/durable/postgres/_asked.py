"""A request's write, and a request kept with the turn that raised it: one write, one
statement (PostgreSQL).

Rules of this module:

- The turn's part (as ``PgOps.turn``, or ``PgOps.start`` for a run not stored yet) and the
  request's (as ``PgOps.suspend``) are one statement (``_statements``' way: data-modifying
  ``WITH`` parts gated on the first), so a refusal of either writes neither: the first part
  writes only when the run is held here (or, new, not stored) and the request's id is free,
  and the request is inserted from the first part's row.
- Its events are the turn's, then the request's, in that order, after the first part's
  row (what ``EventTail`` relies on).
- In a batch with others alike (:meth:`Asked.many`), the turns go as one statement and
  their requests as another (``_grouped``); should a request not be written where its
  turn was, the batch fails whole and each write goes again alone (``_committer``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ..._core.errors import StoreError, UsageError
from ..._core.results import RunResult
from ..._core.types import Request
from .._rows import encode, plain, prompt_of, state_text
from .._run_events import pending, started_events, tool_calls
from ._grouped import AGAIN, Grouped
from ._ops import PgOps, _arrays
from ._statements import _close, _events

__all__ = ("Asked",)

_HELD = "run_id = $1 AND owner = $2 AND status = 'running'"


class Asked:
    """The writes of a request with its turn, on schema ``s``: :meth:`turn` (the run is
    stored), :meth:`start` (it is not) and :meth:`many` (the first, grouped)."""

    def __init__(self, s: str, ops: PgOps, grouped: Grouped) -> None:
        self.s = s
        self._ops = ops
        self._grouped = grouped
        free = f"NOT EXISTS (SELECT 1 FROM {s}.requests WHERE request_id = $9)"
        # $1 run_id, $2 owner, $3 turn, $4 state, $5 now, $6..$8 events, $9 request_id,
        # $10 call_id, $11 body, $12 expires_at, $13 kind, $14 prompt.
        self._turn = (
            f"WITH u AS (UPDATE {s}.runs SET turn = $3, state = $4, updated = $5 WHERE {_HELD}"
            f" AND {free} RETURNING 1),"
            f" d AS (DELETE FROM {s}.results WHERE run_id = $1 AND $3 > 1"
            " AND EXISTS (SELECT 1 FROM u)),"
            f" c AS ({_close(s, 'u', ' AND turn < $3 AND $3 > 1')}),"
            f" q AS (INSERT INTO {s}.requests (request_id, run_id, call_id, turn, body, status,"
            " expires_at, kind, prompt, raised_at) SELECT $9, $1, $10, $3, $11, 'pending', $12,"
            " $13, $14, $5 FROM u ON CONFLICT (request_id) DO NOTHING RETURNING 1),"
            f" e AS ({_events(s, 'u', 6, 5)})"
            " SELECT count(*) FROM q"
        )
        # $1 run_id, $2 owner, $3 turn, $4 state, $5 prompt, $6 now, $7 lease_until,
        # $8..$10 events, $11 request_id, $12 call_id, $13 body, $14 expires_at, $15 kind,
        # $16 the request's prompt.
        self._start = (
            f"WITH r AS (INSERT INTO {s}.runs (run_id, status, owner, turn, state, prompt,"
            " created, updated) SELECT $1, 'running', $2, $3, $4, $5, $6, $6 WHERE NOT EXISTS"
            f" (SELECT 1 FROM {s}.requests WHERE request_id = $11)"
            " ON CONFLICT (run_id) DO NOTHING RETURNING run_id),"
            f" w AS (INSERT INTO {s}.workers (name, alive_until) SELECT $2, $7 FROM r"
            f" WHERE NOT EXISTS (SELECT 1 FROM {s}.workers WHERE name = $2"
            " AND alive_until >= $6) ON CONFLICT (name) DO UPDATE SET alive_until ="
            f" GREATEST({s}.workers.alive_until, excluded.alive_until)),"
            f" q AS (INSERT INTO {s}.requests (request_id, run_id, call_id, turn, body, status,"
            " expires_at, kind, prompt, raised_at) SELECT $11, run_id, $12, $3, $13, 'pending',"
            " $14, $15, $16, $6 FROM r ON CONFLICT (request_id) DO NOTHING RETURNING 1),"
            f" e AS ({_events(s, 'r', 8, 6)})"
            " SELECT count(*) FROM q"
        )

    def write(
        self,
        run_id: str,
        call_id: str,
        request: Request,
        owner: str,
        state: RunResult | None,
        turn: int,
        lease_until: float | None,
    ) -> tuple[Any, tuple[Any, ...]]:
        """The op and its arguments that keep ``request`` (``PgOps.suspend``), or with
        ``state``, it and ``state`` through turn ``turn`` (a new run, with ``lease_until``):
        see ``RunStore.suspend``. Its values encoded here, before anything is queued."""
        body = encode(request.to_dict(), f"request {request.id!r}")
        left = request.seconds_left()
        now = time.time()
        expires = None if left is None else now + left
        kind, prompt, row = plain(request.kind), plain(request.prompt), pending(run_id, request)
        asked = (run_id, call_id, owner, request.id, body, expires, kind, prompt, row, now)
        if state is None:
            return self._ops.suspend, asked
        text = state_text(state)
        if lease_until is None:
            return self.turn, (run_id, turn, owner, text, now, tool_calls(state), *asked)
        first = (run_id, owner, lease_until, turn, text, prompt_of(state), now)
        return self.start, (*first, started_events(state, turn), *asked)

    async def _taken(self, conn: Any, request_id: str) -> bool:
        sql = f"SELECT 1 FROM {self.s}.requests WHERE request_id = $1"
        return bool(await conn.fetchval(sql, request_id))

    async def turn(self, conn: Any, *args: Any) -> None:
        """``PgOps.turn``'s arguments, then ``PgOps.suspend``'s (after the connection)."""
        run_id, turn, owner, state, now, events = args[:6]
        _, call_id, _, request_id, body, expires, kind, prompt, event, _ = args[6:]
        if await conn.fetchval(
            self._turn,
            run_id,
            owner,
            turn,
            state,
            now,
            *_arrays([*events, event]),
            request_id,
            call_id,
            body,
            expires,
            kind,
            prompt,
        ):
            return
        if await self._taken(conn, request_id):
            raise UsageError(f"request id {request_id!r} is stored already; ids must be unique")
        raise await self._ops._lost(conn, run_id, owner)

    async def start(self, conn: Any, *args: Any) -> None:
        """``PgOps.start``'s arguments, then ``PgOps.suspend``'s (after the connection)."""
        run_id, owner, lease_until, turn, state, prompt, now, events = args[:8]
        _, call_id, _, request_id, body, expires, kind, asking, event, _ = args[8:]
        if await conn.fetchval(
            self._start,
            run_id,
            owner,
            turn,
            state,
            prompt,
            now,
            lease_until,
            *_arrays([*events, event]),
            request_id,
            call_id,
            body,
            expires,
            kind,
            asking,
        ):
            return
        if await self._taken(conn, request_id):
            raise UsageError(f"request id {request_id!r} is stored already; ids must be unique")
        raise UsageError(f"a run {run_id!r} is stored already; run ids must be unique")

    async def many(self, conn: Any, writes: Sequence[tuple[Any, ...]]) -> list[Any]:
        """:meth:`turn` for each of ``writes``: the turns as one statement, then the
        requests of those written as another."""
        turns = await self._grouped.turn(conn, [w[:6] for w in writes])
        written = [i for i, outcome in enumerate(turns) if outcome is not AGAIN]
        if written:
            asked = await self._grouped.suspend(conn, [writes[i][6:] for i in written])
            if any(outcome is AGAIN for outcome in asked):
                # A turn written without its request: undone with the batch, which goes
                # again write by write, where each finds why.
                raise StoreError("a request was not written with its turn")
        return turns
