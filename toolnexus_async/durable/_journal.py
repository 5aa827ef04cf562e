"""One durable run's journal, and how a stored run becomes a run again.

Rules of this module:

- :class:`RunJournal` is the run's side of the store: every step the run awaits
  (``_journal.Journal``) is one store write naming the worker that holds the run, so a
  worker that lost its lease is stopped by its next write.
- :func:`plan_of` rebuilds a stored run exactly where it stood: the current turn's recorded
  results are kept (never executed again), an answered call goes on from the answer that
  was accepted, a call whose request is still pending waits for that same request again,
  one whose request expired is answered as expired, and a call that has nothing (it was
  running when its worker died) runs again. A run with no turn in progress asks the model.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Awaitable
from datetime import UTC, datetime

from .._loop import CallOutcome, HaltedTurn, RunLoop
from .._messages import AssistantMessage, ToolCall, ToolReturn
from .._results import RunResult, ToolCallRecord
from .._resume import ResumePlan
from .._types import Answer, Request, ToolResult
from ._store import RunStore, StoredRun

__all__ = ("RunJournal", "plan_of", "worker_name")


class RunJournal:
    """What one run tells the store as it goes, as the worker ``owner``.

    A journal made with ``lease`` is of a run the store does not have yet: its first
    write (a turn, or the end of a run that asked for no tool) starts it there, held for
    ``lease`` seconds. Until then nothing of the run was told anyone but its caller, in
    this process, so nothing is lost that anyone else knew of.
    """

    __slots__ = ("_lease", "_owner", "_run_id", "_store", "_turn")

    def __init__(
        self,
        store: RunStore,
        run_id: str,
        owner: str,
        turn: int = 0,
        *,
        lease: float | None = None,
    ) -> None:
        self._store = store
        self._run_id = run_id
        self._owner = owner
        self._turn = turn
        self._lease = lease

    @property
    def run_id(self) -> str:
        return self._run_id

    async def start(self, state: RunResult, lease: float) -> None:
        """Keep the run in the store now, before anything else happens to it."""
        await self._store.start(state, self._owner, time.time() + lease)
        self._lease = None

    async def turn(self, loop: RunLoop) -> None:
        self._turn = loop.turns
        if self._lease is not None:
            await self._store.start(
                loop.snapshot(), self._owner, time.time() + self._lease, turn=loop.turns
            )
            self._lease = None
        else:
            await self._store.turn(loop.snapshot(), loop.turns, self._owner)

    # Not coroutines: the store's awaitable is handed back as it is, so a run waiting for
    # the write holds no frame of the journal's (nor the record, once it is encoded).
    def suspended(self, call: ToolCall, request: Request) -> Awaitable[None]:
        return self._store.suspend(self._run_id, call.id, request, self._owner)

    def settled(self, call: ToolCall, outcome: CallOutcome) -> Awaitable[None]:
        record = ToolCallRecord(
            call, outcome.result, self._turn, outcome.request, outcome.answered_ok
        )
        return self._store.record(self._run_id, record, self._owner)

    async def finished(self, result: RunResult) -> None:
        if self._lease is not None:  # it never asked for a tool: kept for the listings
            await self.start(result, self._lease)
        if result.status == "pending":
            await self._store.halt(self._run_id, self._owner)
        else:
            await self._store.finish(result, self._owner)

    async def failed(self, loop: RunLoop, error: str) -> None:
        """The run raised ``error``: recorded, so that it is listed and not resumed."""
        if self._lease is not None:
            await self.start(loop.snapshot(), self._lease)
        await self._store.fail(self._run_id, error, self._owner)

    async def release(self) -> None:
        """This worker stops driving the run mid-way (a shutdown): the next one goes on."""
        if self._lease is None:  # a run never written has nothing to go on from
            await self._store.release(self._run_id, self._owner)


def worker_name() -> str:
    """A name for a worker in the store: host name, process id and a random part."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def plan_of(
    stored: StoredRun, *, max_turns: int, now: float | None = None
) -> tuple[RunLoop, ResumePlan | None]:
    """The loop (and, with a turn in progress, the plan) that continue ``stored``."""
    state = stored.state
    last = state.messages[-1] if state.messages else None
    if not stored.turn or not isinstance(last, AssistantMessage) or not last.tool_calls:
        return RunLoop.restore(state, max_turns=max_turns), None
    at = time.time() if now is None else now
    completed: dict[str, ToolReturn] = {}
    kept: dict[str, ToolResult] = {}
    answers: dict[str, tuple[Request, Answer]] = {}
    waiting: dict[str, Request] = {}
    for call in last.tool_calls:
        record = stored.results.get(call.id)
        if record is not None:
            result = record.result
            completed[call.id] = ToolReturn(call.id, call.name, result.output, result.is_error)
            kept[call.id] = result
            continue
        asked = stored.requests.get(call.id)
        if asked is None:
            continue  # it was running: it runs again
        request = asked.request
        if asked.status == "answered" and asked.answer is not None:
            answers[call.id] = (request, asked.answer)
        elif asked.status == "expired" or request.expired(_datetime(at)):
            answers[call.id] = (request, Answer(request.id, False, reason="expired"))
        else:
            waiting[call.id] = request
    turn = HaltedTurn(
        tuple(state.messages[:-1]),
        last,
        completed,
        tuple(c for c in last.tool_calls if c.id not in completed),
    )
    loop = RunLoop.resume(
        turn,
        turns=state.turns,
        usage=state.usage,
        model=state.model,
        records=state.tool_calls,
        max_turns=max_turns,
        run_id=stored.run_id,
        style=state.style,
    )
    return loop, ResumePlan(turn, answers, kept, waiting)


def _datetime(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)
