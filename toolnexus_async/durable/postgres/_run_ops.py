"""A run's progress on PostgreSQL, each write over a connection in its caller's
transaction: started, its turns, its results, its requests, halted, released, finished,
failed, or saved as halted elsewhere (the rules: ``_ops_base``)."""

from __future__ import annotations

from typing import Any

from ..._core.errors import UsageError
from .._decide import Saved
from .._run_events import EventRow, answered, failed
from ._ops_base import HELD as _HELD
from ._ops_base import PgOpsBase
from ._statements import arrays as _arrays
from ._statements import ask_args, start_args, turn_args

__all__ = ("PgRunOps",)


class PgRunOps(PgOpsBase):
    """The writes of a run's progress."""

    async def start(
        self,
        conn: Any,
        run_id: str,
        owner: str,
        lease_until: float,
        turn: int,
        state: str,
        prompt: str,
        now: float,
        events: list[EventRow],
    ) -> None:
        inserted = await conn.fetchval(
            self._one.start,
            *start_args((run_id, owner, lease_until, turn, state, prompt, now), events),
        )
        if not inserted:
            raise UsageError(f"a run {run_id!r} is stored already; run ids must be unique")

    async def turn(
        self,
        conn: Any,
        run_id: str,
        turn: int,
        owner: str,
        state: str,
        now: float,
        events: list[EventRow],
    ) -> None:
        if not await conn.fetchval(
            self._one.turn, *turn_args((run_id, turn, owner, state, now), events)
        ):
            raise await self._lost(conn, run_id, owner)

    async def record(
        self,
        conn: Any,
        run_id: str,
        call_id: str,
        owner: str,
        record: str,
        event: EventRow,
        request_id: str | None,
        now: float,
    ) -> None:
        rows = [event]
        if request_id is not None:  # written only if that request is still pending
            rows.insert(0, answered(run_id, False, "expired", request_id, now, None))
        if not await conn.fetchval(
            self._one.record, run_id, owner, call_id, record, request_id, *_arrays(rows), now
        ):
            raise await self._lost(conn, run_id, owner)

    async def suspend(
        self,
        conn: Any,
        run_id: str,
        call_id: str,
        owner: str,
        request_id: str,
        body: str,
        expires_at: float | None,
        kind: str,
        prompt: str,
        event: EventRow,
        now: float,
    ) -> None:
        asked = (run_id, call_id, owner, request_id, body, expires_at, kind, prompt, event, now)
        inserted = await conn.fetchval(
            self._one.suspend, run_id, owner, *ask_args(asked), *_arrays([event]), now
        )
        if not inserted:
            if await conn.fetchval(
                f"SELECT 1 FROM {self.s}.requests WHERE request_id = $1", request_id
            ):
                raise UsageError(f"request id {request_id!r} is stored already; ids must be unique")
            raise await self._lost(conn, run_id, owner)

    async def halt(self, conn: Any, run_id: str, owner: str, now: float) -> None:
        await self._guarded(
            conn,
            f"UPDATE {self.s}.runs SET status = 'halted', owner = NULL, updated = $3 WHERE {_HELD}",
            run_id,
            owner,
            now,
        )

    async def release(self, conn: Any, run_id: str, owner: str, now: float) -> None:
        await conn.execute(
            f"UPDATE {self.s}.runs SET owner = NULL, updated = $3 WHERE run_id = $1 AND owner = $2",
            run_id,
            owner,
            now,
        )

    async def finish(
        self,
        conn: Any,
        run_id: str,
        owner: str,
        final: str,
        now: float,
        outcome: str,
        text: str | None,
        event: EventRow,
    ) -> None:
        if not await conn.fetchval(
            self._one.finish, run_id, owner, final, now, outcome, text, *_arrays([event])
        ):
            raise await self._lost(conn, run_id, owner)

    async def fail(self, conn: Any, run_id: str, error: str, owner: str, now: float) -> None:
        await self._guarded(
            conn,
            f"UPDATE {self.s}.runs SET status = 'failed', owner = NULL, error = $3, updated = $4"
            f" WHERE {_HELD}",
            run_id,
            owner,
            error,
            now,
        )
        await self._close_requests(conn, run_id)
        await self._tell(conn, [failed(run_id, error)], now)

    async def save(self, conn: Any, saved: Saved, now: float, events: list[EventRow]) -> None:
        """A run halted elsewhere (see ``_ops.saved``), held by nobody."""
        run_id = saved.run_id
        taken = await conn.fetchrow(
            f"SELECT request_id, run_id FROM {self.s}.requests"
            " WHERE request_id = ANY($1) AND run_id <> $2 LIMIT 1",
            [r[0] for r in saved.requests],
            run_id,
        )
        if taken is not None:
            raise UsageError(f"request {taken[0]!r} is already filed under run {taken[1]!r}")
        for table in ("requests", "results", "runs"):
            await conn.execute(f"DELETE FROM {self.s}.{table} WHERE run_id = $1", run_id)
        await conn.execute(
            f"INSERT INTO {self.s}.runs (run_id, status, owner, turn, state, prompt, created,"
            " updated) VALUES ($1, 'halted', NULL, $2, $3, $4, $5, $5)",
            run_id,
            saved.turn,
            saved.state,
            saved.prompt,
            now,
        )
        await conn.executemany(
            f"INSERT INTO {self.s}.results (run_id, call_id, record) VALUES ($1, $2, $3)",
            [(run_id, call_id, record) for call_id, record in saved.results],
        )
        await conn.executemany(
            f"INSERT INTO {self.s}.requests (request_id, run_id, call_id, turn, body, status,"
            " expires_at, kind, prompt) VALUES ($1, $2, $3, $4, $5, 'pending', $6,"
            " $5::text::json->>'kind', $5::text::json->>'prompt')",
            [(rid, run_id, cid, saved.turn, body, exp) for rid, cid, body, exp in saved.requests],
        )
        await self._tell(conn, events, now)
