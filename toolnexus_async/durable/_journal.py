"""One durable run's journal, and how a stored run becomes a run again.

Rules of this module:

- :class:`RunJournal` is the run's side of the store: every step the run awaits
  (``_journal.Journal``) is a store write naming the worker that holds the run, so a
  worker that lost its lease is stopped by its next write.
- **A passing fault of the store is waited out, never recorded.** A journal of a host
  (one with a ``Tenure``) retries a write that failed with ``StoreUnavailableError``, with
  backoff, until the store takes it; the run waits with its state intact. A write whose
  reply was lost may have committed: where the retry is then refused (the run is stored
  already, the request too, the run ended), the store is read to tell whether the first
  attempt took, and only a real refusal is raised. A journal without a tenure (a
  standalone resume) raises the fault at once.
- **A turn is written late, never after any of its calls ran.** :meth:`RunJournal.turn`
  keeps the turn; the first of these writes it: ``fence`` (before a tool or a
  ``before_tool`` hook runs), ``suspended`` (in the suspension's transaction: a
  ``require_approval`` gate asked before anything of the turn ran), ``settled``,
  ``finished`` and ``failed`` (before theirs). One write at a time (the calls of a turn
  go at once): the turn is written once. ``release`` drops it: nothing of it ran or was
  told, so the next worker asks the model again from what is stored. A turn whose calls
  are streamed (``streamed``) is written at once, before they are shown.
- **No tool call starts on a lease the worker cannot prove** (``fence``): after a lapse
  of its lease (see ``_tenure``), the run checks in the store that this worker still holds
  it before its next call, and stops with ``LeaseLostError`` if another worker took it.
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
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import anyio

from .._core.errors import PayloadError, StoreUnavailableError, UsageError
from .._core.loop import CallOutcome, HaltedTurn, RunLoop
from .._core.messages import AssistantMessage, ToolCall, ToolReturn
from .._core.output import stored_output
from .._core.results import RunResult, ToolCallRecord
from .._core.resume import ResumePlan
from .._core.types import Answer, Request, ToolResult
from ._store import LeaseLostError, RunStore, StoredRun
from ._tenure import Backoff, Tenure

# Whether a write whose reply was lost had committed, judged from the run as stored.
Committed = Callable[[StoredRun], bool]

__all__ = ("RunJournal", "plan_of", "worker_name")


class RunJournal:
    """What one run tells the store as it goes, as the worker ``owner``.

    A journal made with ``lease`` is of a run the store does not have yet: its first
    write (a turn, or the end of a run that asked for no tool) starts it there, held for
    ``lease`` seconds. Until then nothing of the run was told anyone but its caller, in
    this process, so nothing is lost that anyone else knew of. A journal made with
    ``tenure`` (its host's) waits out a passing fault of the store and fences tool calls
    (see the module rules).
    """

    __slots__ = (
        "_epoch",
        "_lease",
        "_owner",
        "_pending",
        "_run_id",
        "_store",
        "_tenure",
        "_turn",
        "_writing",
    )

    def __init__(
        self,
        store: RunStore,
        run_id: str,
        owner: str,
        turn: int = 0,
        *,
        lease: float | None = None,
        tenure: Tenure | None = None,
    ) -> None:
        self._store = store
        self._run_id = run_id
        self._owner = owner
        self._turn = turn
        self._lease = lease
        self._tenure = tenure
        self._epoch = 0 if tenure is None else tenure.epoch
        # The turn told (``turn``) and not written yet: see the module rules.
        self._pending: RunResult | None = None
        self._writing: anyio.Event | None = None  # set once the write in flight ends

    @property
    def run_id(self) -> str:
        return self._run_id

    async def start(self, state: RunResult, lease: float) -> None:
        """Keep the run in the store now, before anything else happens to it. Not
        retried: whoever asked for the run is told of the fault and may ask again."""
        await self._store.start(state, self._owner, time.time() + lease)
        self._lease = None

    async def turn(self, loop: RunLoop, *, streamed: bool = False) -> None:
        """Kept from now on: written by the first of :meth:`fence`, :meth:`suspended`
        (in the same transaction), :meth:`settled`, :meth:`finished` and :meth:`failed`;
        at once when ``streamed`` (its calls are shown now)."""
        self._turn = loop.turns
        self._pending = loop.snapshot()
        if streamed:
            await self._with_turn(self._turn_alone)

    async def _with_turn(self, write: Callable[[RunResult | None], Awaitable[None]]) -> None:
        """``write(turn)``, ``turn`` being the turn still to write (``None``: none is).
        One such write at a time: the calls of one turn that go at once write it once."""
        while self._writing is not None:
            await self._writing.wait()
        state = self._pending
        if state is None:
            await write(None)
            return
        self._writing = writing = anyio.Event()
        try:
            await write(state)
            self._pending = None
        except BaseException as exc:
            if not isinstance(exc, Exception):
                # Cancelled: the run stops here, every call of it with it. The write may
                # have committed all the same: not made again when the failure is kept.
                self._pending = None
            raise
        finally:
            self._writing = None
            writing.set()

    async def _turn_first(self) -> None:
        """The turn :meth:`turn` kept, written now if it is not yet (or once the write in
        flight ends)."""
        if self._pending is not None or self._writing is not None:
            await self._with_turn(self._turn_alone)

    async def _turn_alone(self, state: RunResult | None) -> None:
        if state is None:
            return
        turn = self._turn
        if self._lease is not None:
            until = time.time() + self._lease
            await self._kept(
                lambda: self._store.start(state, self._owner, until, turn=turn), self._holds
            )
            self._lease = None
        else:
            await self._kept(lambda: self._store.turn(state, turn, self._owner))

    async def suspended(self, call: ToolCall, request: Request) -> None:
        def asked(stored: StoredRun) -> bool:
            kept = stored.requests.get(call.id)
            return kept is not None and kept.request.id == request.id

        async def write(state: RunResult | None) -> None:
            run_id, owner, turn = self._run_id, self._owner, self._turn
            if state is None:
                await self._kept(
                    lambda: self._store.suspend(run_id, call.id, request, owner), asked
                )
                return
            # With the turn, in one transaction: no call of this turn ran yet (the module
            # rules). A retry refused because the first try committed finds the request.
            until = None if self._lease is None else time.time() + self._lease
            await self._kept(
                lambda: self._store.suspend(
                    run_id, call.id, request, owner, state=state, turn=turn, lease_until=until
                ),
                asked,
            )
            self._lease = None

        await self._with_turn(write)

    async def settled(self, call: ToolCall, outcome: CallOutcome) -> None:
        record = ToolCallRecord(
            call,
            outcome.result,
            self._turn,
            outcome.request,
            outcome.answered_ok,
            outcome.changed_arguments,
        )
        await self._turn_first()
        await self._kept(lambda: self._store.record(self._run_id, record, self._owner))

    async def finished(self, result: RunResult) -> None:
        if self._lease is not None:  # it never asked for a tool: kept for the listings
            self._pending = None  # the result holds the turn
            until = time.time() + self._lease
            await self._kept(lambda: self._store.start(result, self._owner, until), self._holds)
            self._lease = None
        else:
            await self._turn_first()
        if result.status == "pending":
            await self._kept(lambda: self._store.halt(self._run_id, self._owner), _halted)
        else:
            await self._kept(lambda: self._store.finish(result, self._owner), _ended("done"))

    async def failed(self, loop: RunLoop, error: str) -> None:
        """The run raised ``error``: recorded, so that it is listed and not resumed."""
        if self._lease is not None:
            self._pending = None  # the state written holds the turn
            state, until = loop.snapshot(), time.time() + self._lease
            await self._kept(lambda: self._store.start(state, self._owner, until), self._holds)
            self._lease = None
        else:
            try:
                await self._turn_first()
            except PayloadError:
                self._pending = None  # the turn cannot be written: the failure still is
        await self._kept(
            lambda: self._store.fail(self._run_id, error, self._owner), _ended("failed")
        )

    async def release(self) -> None:
        """This worker stops driving the run mid-way (a shutdown): the next one goes on.
        Tried once: a host that cannot release a run keeps trying in the background. A
        turn not written yet is dropped: none of its calls ran, so the next worker asks
        the model again from what is stored."""
        self._pending = None
        if self._lease is None:  # a run never written has nothing to go on from
            await self._store.release(self._run_id, self._owner)

    @property
    def written(self) -> bool:
        """Whether the store has the run (a journal made with ``lease`` writes it late)."""
        return self._lease is None

    # -- riding out the store's faults ---------------------------------------------------------

    def _holds(self, stored: StoredRun) -> bool:
        return stored.owner == self._owner

    async def _kept(
        self, write: Callable[[], Awaitable[None]], took: Committed | None = None
    ) -> None:
        """``write()``, retried while the store is unavailable (with a tenure)."""
        tenure = self._tenure
        try:
            await write()
            return
        except StoreUnavailableError as exc:
            if tenure is None:
                raise
            tenure.store_down(exc)
        backoff = Backoff(tenure.retry_cap)
        while True:
            await anyio.sleep(backoff.next())
            try:
                async with tenure.retries:
                    await write()
            except StoreUnavailableError as exc:
                tenure.store_down(exc)
                continue
            except (LeaseLostError, UsageError):
                # An earlier attempt may have committed with its reply lost: then this
                # refusal is of our own write, and the write is done.
                if took is None or not took(await self._stored()):
                    raise
            tenure.store_up()
            return

    async def _stored(self) -> StoredRun:
        """The run as stored, read once the store answers."""
        backoff = Backoff(1.0 if self._tenure is None else self._tenure.retry_cap)
        while True:
            try:
                return await self._store.load(self._run_id)
            except StoreUnavailableError:
                await anyio.sleep(backoff.next())

    async def fence(self) -> None:
        """Before a tool call: at once when this worker's lease is proven and did not lapse
        since the run last checked; else after a renewal, having checked the run is still
        held here (``LeaseLostError`` if not)."""
        await self._turn_first()  # the turn, before any of its calls runs
        tenure = self._tenure
        if tenure is None or (self._epoch == tenure.epoch and tenure.proven(time.time())):
            return
        await self._prove(tenure)

    async def _prove(self, tenure: Tenure) -> None:
        while True:
            if not tenure.proven(time.time()):
                await tenure.wait_renewed()
                continue
            epoch = tenure.epoch
            if epoch == self._epoch:
                return
            # The lease lapsed since this run last looked: another worker may have claimed
            # it in the gap. From the renewal on, nobody can (until the proof runs out
            # again), so what the store says now holds for the call about to start.
            stored = await self._stored()
            if stored.owner != self._owner or stored.status != "running":
                raise LeaseLostError(
                    f"run {self._run_id!r} was taken over while the lease of worker "
                    f"{self._owner!r} lapsed (held by {stored.owner!r}, {stored.status}); "
                    "it stops here"
                )
            self._epoch = epoch


def _halted(stored: StoredRun) -> bool:
    return stored.status == "halted"


def _ended(status: str) -> Committed:
    def ended(stored: StoredRun) -> bool:
        return stored.status == status

    return ended


def worker_name() -> str:
    """A name for a worker in the store: host name, process id and a random part."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def plan_of(
    stored: StoredRun, *, max_turns: int, now: float | None = None, output_type: object = None
) -> tuple[RunLoop, ResumePlan | None]:
    """The loop (and, with a turn in progress, the plan) that continue ``stored``; its
    output checked against the stored schema (built as ``output_type`` when given)."""
    state = stored.state
    output = stored_output(state.output_spec, output_type)
    last = state.messages[-1] if state.messages else None
    if not stored.turn or not isinstance(last, AssistantMessage) or not last.tool_calls:
        return RunLoop.restore(state, max_turns=max_turns, output=output), None
    at = time.time() if now is None else now
    completed: dict[str, ToolReturn] = {}
    kept: dict[str, ToolResult] = {}
    answers: dict[str, tuple[Request, Answer]] = {}
    waiting: dict[str, Request] = {}
    waited: dict[str, tuple[float, float | None]] = {}
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
            ended = asked.answered_at
        elif asked.status == "expired" or request.expired(_datetime(at)):
            answers[call.id] = (request, Answer(request.id, False, reason="expired"))
            left = request.seconds_left(_datetime(at))
            ended = None if left is None else at + min(left, 0.0)  # when it expired
        else:
            waiting[call.id] = request
            ended = None  # waited for on
        if asked.raised_at is not None:
            waited[call.id] = (asked.raised_at, ended)
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
        trace=state.trace_context,
        output=output,
        output_tries=state.output_retries_used,
    )
    return loop, ResumePlan(turn, answers, kept, waiting, waited)


def _datetime(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)
