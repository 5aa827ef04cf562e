"""What the server knows about its runs, the inbox they park in, and the task that drives each.

Rules of this module:

- :class:`RunBook` is the one place that changes a run's status, and every change that a
  person may care about is published on the event bus as it happens.
- A run's status is derived, never stored twice: ``done``/``incomplete``/``error`` once it
  ended, else ``pending`` while it waits for at least one answer (parked in memory or
  spilled to the store), else ``running``.
- Requests are booked where they park (:class:`ServeInbox`), with the id of the run that
  parks them, so a run resumed from the store is seen too.
- A run's events are published in the order they happen: ``tool_call`` when the model's
  reply is complete, ``pending`` when its request parks (after it was kept in the store),
  ``tool_result`` when a call's result is final.
- The store is the source of truth (the app's :class:`~toolnexus_async.DurableHost`
  keeps every run in it as it goes): ``GET /requests`` lists what the store has, and at
  startup the book is filled from the store, finished runs included, so a restarted
  server shows the runs it recovered. The book is the live view that publishes events.
- A request goes out (``GET /requests``, the ``pending`` event) as ``Request.to_dict()``,
  unchanged, plus its ``display`` (``_display``): one helper, :func:`shown`, for both.
- A run another worker took over (this one lost its lease) is not an error here: the
  book marks it ``elsewhere`` and reads its status from the store when it is shown
  (:meth:`RunBook.refresh`), so the book never contradicts the store about it.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal

from .._errors import StoreUnavailableError
from .._messages import AssistantMessage, ToolReturn, UserMessage
from .._results import RunResult, ToolCallRecord
from .._streaming import StreamEvent, StreamToolCall, StreamToolResult
from .._types import Answer, Request
from ..durable._store import LeaseLostError, RunSummary, StoredRequest
from ..suspend import Inbox
from ..suspend._inbox import _Slot
from ._display import display_of
from ._events import EventBus

if TYPE_CHECKING:
    from ..durable import DurableHost, RunStore
    from ..durable._begun import BegunRun

__all__ = ("KEEP_FINISHED", "RunBook", "RunRecord", "ServeInbox", "drive", "run_steps")

log = logging.getLogger("toolnexus_async.serve")

# Finished runs remembered for GET /runs; older ones are forgotten (bounded memory).
KEEP_FINISHED = 10_000

Outcome = Literal["done", "incomplete", "error"]


def shown(request: Request, **extra: Any) -> dict[str, Any]:
    """A request as the API sends it: its wire form, ``extra`` (a listing's ``run_id``),
    and its ``display``."""
    wire = {**request.to_dict(), **extra}
    return {**wire, "display": display_of(wire)}


def _step(record: ToolCallRecord, returns: dict[str, ToolReturn]) -> dict[str, Any]:
    """One executed call as ``GET /runs/{id}`` shows it, with what the model was given;
    ``declined``: its request was refused or expired (the model saw ``declined/expired``)."""
    given = returns.get(record.call.id)
    output = given.output if given is not None else record.result.output
    is_error = given.is_error if given is not None else record.result.is_error
    step = {
        "id": record.call.id,
        "name": record.call.name,
        "arguments": record.call.arguments,
        "output": output,
        "is_error": is_error,
        "declined": record.answered_ok is False,
    }
    if record.changed_arguments is not None:  # a hook or the approver changed them
        step["changed_arguments"] = record.changed_arguments
    return step


def steps_of(result: RunResult) -> list[dict[str, Any]]:
    """The steps of a run's result (its whole transcript), oldest first."""
    returns = {m.call_id: m for m in result.messages if isinstance(m, ToolReturn)}
    return [_step(record, returns) for record in result.tool_calls]


async def run_steps(store: RunStore, run_id: str) -> list[dict[str, Any]]:
    """A run's steps from the store, oldest first: every executed call of the turns before
    its current one, then the current turn's calls; ``output`` is ``None`` for a call that
    waits, or whose result the store no longer holds (a run that ended before a restart
    keeps its last turn's requests and answers, not their outputs); ``[]`` if unknown."""
    try:
        stored = await store.load(run_id)
    except StoreUnavailableError:
        raise  # the store is down: the caller is told so (503), not shown "no steps"
    except Exception:  # unknown to the store, or unreadable: no steps to show
        return []
    messages = stored.state.messages
    returns = {m.call_id: m for m in messages if isinstance(m, ToolReturn)}
    steps = [_step(record, returns) for record in stored.state.tool_calls]
    seen = {step["id"] for step in steps}
    for call_id, record in stored.results.items():
        if call_id not in seen:
            steps.append(_step(record, returns))
            seen.add(call_id)
    calls = {c.id: c for m in messages if isinstance(m, AssistantMessage) for c in m.tool_calls}
    for call_id, waiting in stored.requests.items():
        call = calls.get(call_id)
        if call_id in seen or call is None:
            continue
        answer = waiting.answer
        steps.append(
            {
                "id": call_id,
                "name": call.name,
                "arguments": call.arguments,
                "output": None,
                "is_error": False,
                "declined": answer is not None and not answer.ok,
            }
        )
    return steps


class RunRecord:
    """One run as the API shows it."""

    __slots__ = (
        "declined",
        "elsewhere",
        "error",
        "id",
        "outcome",
        "prompt",
        "steps",
        "text",
        "waiting",
    )

    def __init__(self, run_id: str, prompt: str) -> None:
        self.id = run_id
        self.prompt = prompt
        self.outcome: Outcome | None = None
        self.text: str | None = None
        self.error: str | None = None
        self.waiting: set[str] = set()  # ids of its outstanding requests
        self.declined = False  # a request of it was refused or expired (known to this server)
        self.steps: list[dict[str, Any]] | None = None  # from its result, once it ended here
        # Another worker drives it now: its status there, as last read from the store.
        self.elsewhere: str | None = None

    @property
    def status(self) -> str:
        if self.outcome is not None:
            return self.outcome
        if self.elsewhere is not None:
            return self.elsewhere
        return "pending" if self.waiting else "running"

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "status": self.status,
            "prompt": self.prompt,
            "text": self.text,
            "error": self.error,
        }


class RunBook:
    """The runs of this server and their outstanding requests, in the order they came."""

    def __init__(self, bus: EventBus, *, keep_finished: int | None = None) -> None:
        self.bus = bus
        self._runs: dict[str, RunRecord] = {}
        # Outstanding request id -> (request, run id), in arrival order.
        self._requests: dict[str, tuple[Request, str | None]] = {}
        self._finished: collections.deque[str] = collections.deque()
        self._keep = KEEP_FINISHED if keep_finished is None else keep_finished
        # Ids of the latest answers announced, so each is announced once (bounded memory).
        self._announced: set[str] = set()
        self._announced_order: collections.deque[str] = collections.deque()

    def __len__(self) -> int:
        return len(self._runs)

    def get(self, run_id: str) -> RunRecord | None:
        return self._runs.get(run_id)

    def newest_first(self) -> list[RunRecord]:
        return list(reversed(self._runs.values()))

    def run_of(self, request_id: str) -> str | None:
        """The run an outstanding request belongs to, if the book knows it."""
        entry = self._requests.get(request_id)
        return entry[1] if entry is not None else None

    async def listing(self, host: DurableHost) -> list[dict[str, Any]]:
        """The outstanding requests, as the store has them (oldest first), with run ids.

        The store is the source of truth: a request is listed once it was kept, and not
        after it was answered or expired, whichever worker parks its run.
        """
        return [shown(stored.request, run_id=stored.run_id) for stored in await host.outstanding()]

    # -- runs -------------------------------------------------------------------------------

    def start(self, run_id: str, prompt: str) -> RunRecord:
        """A new run (kept in the store already), announced with ``run_started``."""
        record = RunRecord(run_id, prompt)
        self._runs[record.id] = record
        self.bus.publish("run_started", {"run_id": record.id, "prompt": prompt})
        return record

    def add_stored(self, run: RunSummary, requests: Iterable[StoredRequest]) -> None:
        """A run found in the store at startup: known as it stands there, no event."""
        record = self._runs.get(run.run_id)
        if record is None:
            record = self._runs[run.run_id] = RunRecord(run.run_id, run.prompt)
        if run.status in ("done", "incomplete", "error"):
            outcome: Outcome = "error" if run.status == "error" else run.status  # type: ignore[assignment]
            self._end(record, outcome, text=run.text, error=run.error)
            return
        for stored in requests:
            self._requests[stored.request.id] = (stored.request, run.run_id)
            record.waiting.add(stored.request.id)

    def finished(self, result: RunResult) -> None:
        """A run's result arrived: a halted one stays pending, any other ends with ``done``."""
        record = self._runs.get(result.run_id)
        if record is None or result.status == "pending":
            return  # halted: its requests are booked already, and now wait in the store
        self._end(record, result.status, text=result.text)
        record.steps = steps_of(result)
        record.declined = record.declined or any(step["declined"] for step in record.steps)
        self.bus.publish(
            "done",
            {
                "run_id": record.id,
                "status": result.status,
                "text": result.text,
                "declined": record.declined,
            },
        )

    def failed(self, run_id: str, error: BaseException) -> None:
        record = self._runs.get(run_id)
        if record is None:
            return
        if isinstance(error, LeaseLostError):
            # Not a failure of the run: another worker goes on with it.
            record.elsewhere = "running"
            for request_id in record.waiting:
                self._requests.pop(request_id, None)
            record.waiting.clear()
            return
        message = f"{type(error).__name__}: {error}"
        self._end(record, "error", error=message)
        self.bus.publish("error", {"run_id": run_id, "message": message})

    def _end(
        self,
        record: RunRecord,
        outcome: Outcome,
        *,
        text: str | None = None,
        error: str | None = None,
    ) -> None:
        record.outcome, record.text, record.error = outcome, text, error
        for request_id in record.waiting:
            self._requests.pop(request_id, None)
        record.waiting.clear()
        self._finished.append(record.id)
        while len(self._finished) > self._keep:
            self._runs.pop(self._finished.popleft(), None)

    async def refresh(self, store: RunStore, records: Iterable[RunRecord]) -> None:
        """Bring each of ``records`` that another worker took over up to date from the
        store: its status there, and its end (text or error) once it ended. One read of
        the store's listing, and only when such a run is among them (a takeover is rare)."""
        moved = [r for r in records if r.elsewhere is not None and r.outcome is None]
        if not moved:
            return
        try:
            summaries = {s.run_id: s for s in await store.runs(limit=self._keep)}
        except StoreUnavailableError:
            return  # shown as last read; the listing works from memory while it is down
        for record in moved:
            summary = summaries.get(record.id)
            if summary is None:
                continue  # pruned there: nothing newer to tell
            if summary.status in ("done", "incomplete", "error"):
                outcome: Outcome = summary.status  # type: ignore[assignment]
                self._end(record, outcome, text=summary.text, error=summary.error)
            else:
                record.elsewhere = summary.status

    # -- requests ---------------------------------------------------------------------------

    def parked(self, request: Request, run_id: str | None) -> None:
        """A request started waiting in the inbox: booked, and published as ``pending``."""
        self._requests[request.id] = (request, run_id)
        record = self._runs.get(run_id) if run_id is not None else None
        if record is not None:
            record.waiting.add(request.id)
        self.bus.publish("pending", {"run_id": run_id, "request": shown(request)})

    def answered(self, answer: Answer) -> None:
        """A request got its answer (or expired): announced with ``answered``, once, whether
        this server or another worker on the store took it."""
        entry = self._requests.pop(answer.id, None)
        if entry is not None and entry[1] is not None:
            record = self._runs.get(entry[1])
            if record is not None:
                record.waiting.discard(answer.id)
                record.declined = record.declined or not answer.ok
        if answer.id in self._announced:
            return
        self._announced.add(answer.id)
        self._announced_order.append(answer.id)
        while len(self._announced_order) > self._keep:
            self._announced.discard(self._announced_order.popleft())
        event: dict[str, Any] = {"request_id": answer.id, "ok": answer.ok}
        if answer.reason is not None:
            event["reason"] = answer.reason
        self.bus.publish("answered", event)

    def announced(self, request_id: str) -> bool:
        """Whether the answer to ``request_id`` was announced here already."""
        return request_id in self._announced

    def forget(self, request_id: str) -> None:
        """A parked request whose run was cancelled: it just leaves, no event."""
        entry = self._requests.pop(request_id, None)
        record = self._runs.get(entry[1]) if entry is not None and entry[1] else None
        if record is not None:
            record.waiting.discard(request_id)

    # -- runs resumed by the host (after a restart, an answer, another worker's death) -----

    def resumed(self, result: RunResult) -> None:
        """A run resumed from the store ended (or halted again): the host's ``on_result``."""
        if result.run_id not in self._runs:
            prompt = next((m.text for m in result.messages if isinstance(m, UserMessage)), "")
            self._runs[result.run_id] = RunRecord(result.run_id, prompt)
        self.finished(result)


class ServeInbox(Inbox):
    """The app's :class:`Inbox`: books every request as it parks, with the run it is of."""

    def __init__(self, book: RunBook, park_timeout: float) -> None:
        super().__init__(park_timeout=park_timeout)
        self._book = book

    def _park(self, request: Request, run_id: str | None = None) -> asyncio.Future[Answer]:
        future = super()._park(request, run_id)
        if future.done() and not future.cancelled() and future.exception() is None:
            return future  # expired already: answered on the spot, never outstanding
        self._book.parked(request, run_id)
        return future

    def _left(self, slot: _Slot, answer: Answer | None) -> None:
        if answer is None:
            self._book.forget(slot.request.id)  # its run was cancelled
        else:
            self._book.answered(answer)  # an answer, or expiry
        # A run that halts on its request leaves it outstanding: the host keeps the run.


async def load_stored(book: RunBook, store: RunStore) -> int:
    """Book the runs the store knows (at startup), newest kept; returns how many."""
    waiting: dict[str, list[StoredRequest]] = {}
    for stored in await store.outstanding():
        waiting.setdefault(stored.run_id, []).append(stored)
    runs = await store.runs(limit=KEEP_FINISHED)
    for run in reversed(runs):  # oldest first, as they came
        book.add_stored(run, waiting.get(run.run_id, ()))
    return len(runs)


class _Publisher:
    """Publishes a run's steps on the event bus as they happen (the sink :func:`drive`
    hands the run): one object per run, where a closure would be a function, its cells
    and their tuple."""

    __slots__ = ("bus", "run_id")

    def __init__(self, bus: EventBus, run_id: str) -> None:
        self.bus = bus
        self.run_id = run_id

    def __call__(self, event: StreamEvent) -> None:
        if isinstance(event, StreamToolCall):
            self.bus.publish(
                "tool_call",
                {
                    "run_id": self.run_id,
                    "id": event.id,
                    "name": event.name,
                    "arguments": event.arguments,
                },
            )
        elif isinstance(event, StreamToolResult):
            self.bus.publish(
                "tool_result",
                {
                    "run_id": self.run_id,
                    "id": event.id,
                    "name": event.name,
                    "output": event.output,
                    "is_error": event.is_error,
                    "declined": event.declined,
                },
            )
        # ``pending`` is published by the inbox as the request parks, right after this
        # event (it is told before the park, when the book does not hold the request yet).


async def drive(begun: BegunRun, book: RunBook, record: RunRecord) -> None:
    """Run ``record``'s prompt to its end, publishing its steps on the event bus as they
    happen.

    The steps are handed to a plain callback, not read from a :class:`RunStream`: a
    stream's task, task group and channel would be kept by every parked run (about 50 of
    the 109 objects the collector walked per parked run).
    """
    try:
        result = await begun.run(_Publisher(book.bus, record.id))
    except LeaseLostError as exc:
        log.warning("run %s went on on another worker (this one lost its lease)", record.id)
        book.failed(record.id, exc)
    except Exception as exc:
        log.warning("run %s failed: %r", record.id, exc)
        book.failed(record.id, exc)
    else:
        book.finished(result)
