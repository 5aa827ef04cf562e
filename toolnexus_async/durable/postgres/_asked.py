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
from ._ops import PgOps
from ._statements import _events, ask_args, free, request, start_args, started, turn_args, turned

__all__ = ("Asked",)


class Asked:
    """The writes of a request with its turn, on schema ``s``: :meth:`turn` (the run is
    stored), :meth:`start` (it is not) and :meth:`many` (the first, grouped)."""

    def __init__(self, s: str, ops: PgOps, grouped: Grouped) -> None:
        self.s = s
        self._ops = ops
        self._grouped = grouped
        # $1..$8 the turn's (``turn_args``, its events followed by the request's),
        # $9..$14 the request's (``ask_args``).
        self._turn = (
            f"{turned(s, free(s, 9))},"
            f" q AS ({request(s, 9, '$1', '$3', 5, 'u')}),"
            f" e AS ({_events(s, 'u', 6, 5)})"
            " SELECT count(*) FROM q"
        )
        # $1..$10 the start's (``start_args``, its events followed by the request's),
        # $11..$16 the request's (``ask_args``).
        self._start = (
            f"{started(s, free(s, 11))},"
            f" q AS ({request(s, 11, 'run_id', '$3', 6, 'r')}),"
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

    async def _check_free(self, conn: Any, request_id: str) -> None:
        """Raise if the request's id was why nothing was written."""
        sql = f"SELECT 1 FROM {self.s}.requests WHERE request_id = $1"
        if await conn.fetchval(sql, request_id):
            raise UsageError(f"request id {request_id!r} is stored already; ids must be unique")

    async def turn(self, conn: Any, *args: Any) -> None:
        """``PgOps.turn``'s arguments, then ``PgOps.suspend``'s (after the connection)."""
        asked = args[6:]
        first = turn_args(args, [*args[5], asked[8]])  # the turn's events, the request's
        if await conn.fetchval(self._turn, *first, *ask_args(asked)):
            return
        await self._check_free(conn, asked[3])
        raise await self._ops._lost(conn, args[0], args[2])

    async def start(self, conn: Any, *args: Any) -> None:
        """``PgOps.start``'s arguments, then ``PgOps.suspend``'s (after the connection)."""
        asked = args[8:]
        first = start_args(args, [*args[7], asked[8]])  # the start's events, the request's
        if await conn.fetchval(self._start, *first, *ask_args(asked)):
            return
        await self._check_free(conn, asked[3])
        raise UsageError(f"a run {args[0]!r} is stored already; run ids must be unique")

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
