"""A run's progress on SQLite, as operations inside the caller's transaction: started, its
turns, its results, its requests, halted, released, finished, failed, or saved as halted
elsewhere (the rules: ``_ops_base``)."""

from __future__ import annotations

import sqlite3

from ..._core.errors import UsageError
from .._decide import Saved
from .._run_events import EventRow, answered, failed
from ._ops_base import HELD as _HELD
from ._ops_base import OpsBase

__all__ = ("RunOps",)


class RunOps(OpsBase):
    """The writes of a run's progress."""

    __slots__ = ()

    def start(
        self,
        run_id: str,
        owner: str,
        lease_until: float,
        turn: int,
        state: str,
        prompt: str,
        now: float,
        events: list[EventRow],
    ) -> None:
        try:
            self.conn.execute(
                "INSERT INTO runs (run_id, status, owner, turn, state, prompt, created,"
                " updated) VALUES (?, 'running', ?, ?, ?, ?, ?, ?)",
                (run_id, owner, turn, state, prompt, now, now),
            )
        except sqlite3.IntegrityError:
            raise UsageError(
                f"a run {run_id!r} is stored already; run ids must be unique"
            ) from None
        self._alive(owner, lease_until)
        self._tell(events, now)

    def turn(
        self, run_id: str, turn: int, owner: str, state: str, now: float, events: list[EventRow]
    ) -> None:
        self._guarded(
            f"UPDATE runs SET turn = ?, state = ?, updated = ? WHERE {_HELD}",
            (turn, state, now, run_id, owner),
            run_id,
            owner,
        )
        if turn > 1:  # the earlier turn's results and requests are in the state now
            self.conn.execute("DELETE FROM results WHERE run_id = ?", (run_id,))
            self._close_requests(run_id, before_turn=turn)
        self._tell(events, now)

    def record(
        self,
        run_id: str,
        call_id: str,
        owner: str,
        record: str,
        event: EventRow,
        request_id: str | None,
        now: float,
    ) -> None:
        """``request_id``: the call's request, if it may have expired where its run was
        parked (then ``answered`` is told, unless the store took an answer to it)."""
        self._guarded(
            "INSERT OR REPLACE INTO results (run_id, call_id, record)"
            f" SELECT ?, ?, ? WHERE EXISTS (SELECT 1 FROM runs WHERE {_HELD})",
            (run_id, call_id, record, run_id, owner),
            run_id,
            owner,
        )
        rows = [event]
        if request_id is not None and self._one(
            "SELECT 1 FROM requests WHERE request_id = ? AND status = 'pending'", (request_id,)
        ):
            rows.insert(0, answered(run_id, False, "expired", request_id, now, None))
        self._tell(rows, now)

    def suspend(
        self,
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
        try:
            self._guarded(
                "INSERT INTO requests (request_id, run_id, call_id, turn, body, status,"
                " expires_at, kind, prompt, raised_at)"
                f" SELECT ?, run_id, ?, turn, ?, 'pending', ?, ?, ?, ? FROM runs WHERE {_HELD}",
                (request_id, call_id, body, expires_at, kind, prompt, now, run_id, owner),
                run_id,
                owner,
            )
        except sqlite3.IntegrityError:
            raise UsageError(
                f"request id {request_id!r} is stored already; ids must be unique"
            ) from None
        self._tell([event], now)

    def halt(self, run_id: str, owner: str, now: float) -> None:
        self._guarded(
            f"UPDATE runs SET status = 'halted', owner = NULL, updated = ? WHERE {_HELD}",
            (now, run_id, owner),
            run_id,
            owner,
        )

    def release(self, run_id: str, owner: str, now: float) -> None:
        self.conn.execute(
            "UPDATE runs SET owner = NULL, updated = ? WHERE run_id = ? AND owner = ?",
            (now, run_id, owner),
        )

    def finish(
        self,
        run_id: str,
        owner: str,
        final: str,
        now: float,
        outcome: str,
        text: str | None,
        event: EventRow,
    ) -> None:
        self._guarded(
            "UPDATE runs SET status = 'done', owner = NULL, final = ?, updated = ?,"
            f" outcome = ?, text = ? WHERE {_HELD}",
            (final, now, outcome, text, run_id, owner),
            run_id,
            owner,
        )
        self.conn.execute("DELETE FROM results WHERE run_id = ?", (run_id,))
        self._close_requests(run_id)
        self.ended = True
        self._tell([event], now)

    def fail(self, run_id: str, error: str, owner: str, now: float) -> None:
        self._guarded(
            "UPDATE runs SET status = 'failed', owner = NULL, error = ?, updated = ?"
            f" WHERE {_HELD}",
            (error, now, run_id, owner),
            run_id,
            owner,
        )
        self._close_requests(run_id)
        self.ended = True
        self._tell([failed(run_id, error)], now)

    def save(self, saved: Saved, now: float, events: list[EventRow]) -> None:
        """A run halted elsewhere (see :func:`saved`), held by nobody."""
        run_id = saved.run_id
        for request_id, _, _, _ in saved.requests:
            owner = self._one("SELECT run_id FROM requests WHERE request_id = ?", (request_id,))
            if owner is not None and owner[0] != run_id:
                raise UsageError(f"request {request_id!r} is already filed under run {owner[0]!r}")
        for table in ("requests", "results", "runs"):
            self.conn.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
        self.conn.execute(
            "INSERT INTO runs (run_id, status, owner, turn, state, prompt, created, updated)"
            " VALUES (?, 'halted', NULL, ?, ?, ?, ?, ?)",
            (run_id, saved.turn, saved.state, saved.prompt, now, now),
        )
        self.conn.executemany(
            "INSERT INTO results (run_id, call_id, record) VALUES (?, ?, ?)",
            [(run_id, call_id, record) for call_id, record in saved.results],
        )
        self.conn.executemany(
            "INSERT INTO requests (request_id, run_id, call_id, turn, body, status,"
            " expires_at, kind, prompt) VALUES (?, ?, ?, ?, ?, 'pending', ?,"
            " json_extract(?, '$.kind'), json_extract(?, '$.prompt'))",
            # Plain question marks only, the body given again for each json_extract: sqlite3
            # refuses numbered placeholders beside a sequence from Python 3.14 (3.12 warns).
            [
                (rid, run_id, cid, saved.turn, body, exp, body, body)
                for rid, cid, body, exp in saved.requests
            ],
        )
        self._tell(events, now)
