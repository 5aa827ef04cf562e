"""The run store contract: the journal a durable host keeps its runs in.

Rules of this module (the contract every store keeps; ``tests/test_store.py`` runs the same
tests against each):

- **The store is the source of truth.** A run is written when it starts, again each time
  the model asks for tools (its transcript through that turn), each call's result as it
  completes, each request before anyone is told of it, and its end. Memory is a cache.
- **One answer per request.** :meth:`RunStore.accept` moves a request from pending to
  answered in one atomic step: the second of two answers, from any process on the store,
  is refused (:class:`AlreadyAnsweredError`) and changes nothing. A request past its
  ``expires_at`` is refused (:class:`RequestExpiredError`) and marked expired.
- **Resuming is a lease.** A run is held by one worker (``owner``) until ``lease_until``,
  which the worker renews while it works; a worker that dies stops renewing, and once the
  lease has run out any worker may :meth:`RunStore.claim` the run and go on from what was
  kept. Every write of a run's progress names its owner and is refused with
  :class:`LeaseLostError` when another worker holds the run now.
- **Nothing runs twice that was recorded.** A call whose result was recorded is never
  executed again; a call that was running when its worker died runs again (the tool gets
  a stable ``ctx.idempotency_key``); an answered call whose retry was not recorded retries
  with the answer that was accepted: nobody is asked twice.
- **Told, not asked.** :meth:`RunStore.listen` hands every new request and every answer
  accepted for a run that someone holds to a callback, once committed, so that the worker
  holding a run parked wakes it at once and an inbox shows requests of every worker. A
  store tells what it can see: the SQLite store what went through the same store object,
  the PostgreSQL store what any worker on the database committed (to a listener for one
  worker, only what that worker must act on). Nothing depends on being told: hosts also
  look at the store every few seconds.
- **What happened is kept with it.** Each write that changes what a person sees of a run
  keeps its event (``_run_events``) in the same transaction; :meth:`RunStore.events` reads
  them in commit order, so every worker can show every run's events, each once.
- Times are seconds since the epoch (``time.time()``), shared by every worker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, Protocol, Self, runtime_checkable

import attrs

from .._core.audit import AnswerRecord
from .._core.errors import StoreError
from .._core.results import RunResult, ToolCallRecord
from .._core.types import Answer, Request

if TYPE_CHECKING:
    from ._listing import RequestPage, RequestQuery, RunPage, RunQuery, RunView
    from ._run_events import EventRead

__all__ = (
    "Accepted",
    "LeaseLostError",
    "RunStore",
    "RunSummary",
    "StoredRequest",
    "StoreEvent",
    "StoredRun",
)

RequestStatus = Literal["pending", "answered", "expired", "closed"]
RunStatus = Literal["running", "halted", "done", "failed"]


class LeaseLostError(StoreError):
    """Another worker holds this run now (its lease ran out here): this worker must stop it."""


@attrs.frozen
class StoredRequest:
    """A request of a run's current turn, and what became of it: ``raised_at`` is when
    the store was told of it, ``answered_at`` when its answer was taken (seconds since the
    epoch; ``None`` when not known: a request kept by an earlier version, or with a run
    saved whole)."""

    request: Request
    run_id: str
    call_id: str
    status: RequestStatus
    answer: Answer | None = None
    raised_at: float | None = None
    answered_at: float | None = None


@attrs.frozen
class StoredRun:
    """A run as the store keeps it: enough to go on from exactly where it stood.

    Attributes:
        run_id: the run.
        status: ``running`` (a worker drives it, or did when it died), ``halted`` (it waits
            for answers and nobody holds it), ``done`` or ``failed``.
        state: the run through its current turn: a ``RunResult`` whose ``messages`` end
            with the assistant message that asked for the current calls (none yet: the
            prompt), with ``turns``, ``usage``, ``model`` and the records of earlier turns.
        turn: the number of the current turn (0 before the first model reply).
        results: the current turn's recorded results, by call id.
        requests: the current turn's requests, by call id.
        owner, lease_until: who holds the run, until when (``None``: nobody).
    """

    run_id: str
    status: RunStatus
    state: RunResult
    turn: int
    results: dict[str, ToolCallRecord] = attrs.field(factory=dict)
    requests: dict[str, StoredRequest] = attrs.field(factory=dict)
    owner: str | None = None
    lease_until: float | None = None


@attrs.frozen
class Accepted:
    """An answer the store took as the one answer of its request (see :meth:`accept`)."""

    request: Request
    run_id: str
    call_id: str
    owner: str | None
    lease_until: float | None


@attrs.frozen
class RunSummary:
    """A run for a listing: its id, status, prompt, and its final text or error.

    ``status`` is ``running``, ``pending`` (halted: it waits for answers), ``done`` or
    ``incomplete`` (it ended so), or ``error`` (it raised).
    """

    run_id: str
    status: str
    prompt: str
    text: str | None = None
    error: str | None = None


@attrs.frozen
class StoreEvent:
    """Something a store committed, as :meth:`RunStore.listen` tells it.

    ``kind`` is ``"requested"`` (a run raised ``request_id``) or ``"answered"`` (an answer to
    it was accepted, for a run that ``owner`` held then, or that nobody held: ``None``).
    ``delivered`` says the worker that accepted the answer handed it to the run in its own
    memory, so no other worker need act on it. An event names the request and its run,
    never the request's data.
    """

    kind: Literal["requested", "answered"]
    request_id: str
    run_id: str
    owner: str | None
    delivered: bool = False


@runtime_checkable
class RunStore(Protocol):
    """Where durable runs are kept, possibly shared by many workers (see the module rules).

    Every store is an async context manager; ``aclose()`` does the same as leaving it.
    """

    # -- a run's progress (written by the worker that holds it) -------------------------

    async def start(self, state: RunResult, owner: str, lease_until: float, turn: int = 0) -> None:
        """A new run, held by ``owner``; ``state`` holds its transcript so far, through
        turn ``turn`` (0: the model was not asked yet).

        Raises:
            UsageError: a run with that id is stored already.
        """
        ...

    async def turn(self, state: RunResult, turn: int, owner: str) -> None:
        """The model asked for the calls of turn ``turn``; ``state`` ends with that ask.
        The earlier turn's results and requests are folded into it."""
        ...

    async def record(self, run_id: str, record: ToolCallRecord, owner: str) -> None:
        """A call of the current turn has the result the model will see."""
        ...

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
        """A call of the current turn raised ``request``, which is pending from now on.

        With ``state``, the turn ``turn`` that raised it is written in the same
        transaction, first: as :meth:`turn` would (``state`` ends with that turn's ask),
        or, with ``lease_until`` too, as :meth:`start` would (the run is new). All or
        nothing: a refusal of either part writes neither.

        Raises:
            UsageError: the request's id is stored already (with ``lease_until``: or the run).
        """
        ...

    async def halt(self, run_id: str, owner: str) -> None:
        """The run waits for answers and ``owner`` lets it go (anyone may resume it)."""
        ...

    async def finish(self, result: RunResult, owner: str) -> None:
        """The run ended with ``result`` (done or incomplete): kept for listings a while."""
        ...

    async def fail(self, run_id: str, error: str, owner: str) -> None:
        """The run raised ``error`` (a model error, say): it is not resumed by itself."""
        ...

    async def release(self, run_id: str, owner: str) -> None:
        """``owner`` stops driving the run mid-way (a shutdown): anyone may go on with it."""
        ...

    async def save(self, run: RunResult) -> None:
        """Keep a run that halted elsewhere (``status == "pending"``), held by nobody.

        Raises:
            UsageError: the run is not halted or has no run id.
            PayloadError: the run cannot be written as JSON.
        """
        ...

    # -- answers and leases ------------------------------------------------------------

    async def accept(
        self,
        answer: Answer,
        now: float,
        *,
        delivered: bool = False,
        by: str | None = None,
        answered_by: str | None = None,
    ) -> Accepted:
        """Take ``answer`` as the one answer of its request, atomically; ``delivered``: the
        worker that holds the run hands it over itself; ``by``: the worker that took it
        (kept with the answer, and its time, for a run's history); ``answered_by``: who
        gave it, as the host authenticated them (never a credential).

        Every answer to a known request leaves an :class:`AnswerRecord` in the audit
        trail (:meth:`answers`), written in the same transaction: the one taken, and each
        refused (answered already, expired, closed, approving another call) beside it.

        Raises:
            UsageError: ``answered_by`` is not a short printable string or ``None``.
            UnknownRequestError: no request has that id.
            AlreadyAnsweredError: it was answered before (by anyone).
            RequestExpiredError: its ``expires_at`` passed (it is marked expired).
            StoreError: the request's stored row cannot be read back; nothing is taken.
        """
        ...

    async def claim(
        self, run_id: str, owner: str, lease_until: float, now: float
    ) -> StoredRun | None:
        """Hold the run if nobody does (or their lease ran out); its stored state, or None
        when another worker holds it or it is over."""
        ...

    async def renew(self, owner: str, lease_until: float) -> None:
        """Extend every lease ``owner`` holds."""
        ...

    async def ready(self, now: float, limit: int) -> list[str]:
        """Runs nobody holds that can go on now: their worker died mid-way, or a request of
        theirs was answered or expired. Oldest first, at most ``limit``."""
        ...

    async def deliveries(self, owner: str) -> list[tuple[str, Answer]]:
        """Answers accepted (by any worker) for runs ``owner`` holds and not handed over to
        them yet: ``(run_id, answer)`` each, oldest first. One that cannot be read back is
        left out, with a warning naming its run."""
        ...

    async def delivered(self, request_ids: list[str]) -> None:
        """These answers were handed over to their runs."""
        ...

    # -- reading ---------------------------------------------------------------------------

    async def requests(self, now: float | None = None) -> list[Request]:
        """The outstanding requests: pending, not expired, in the order they were made. One
        whose stored row cannot be read back is left out, with a warning naming its run."""
        ...

    async def outstanding(self, now: float | None = None) -> list[StoredRequest]:
        """:meth:`requests`, each with its run and call."""
        ...

    async def find(self, request_id: str) -> StoredRequest:
        """The request with this id and what became of it.

        Raises:
            UnknownRequestError: no request has that id.
            StoreError: its stored row cannot be read back.
        """
        ...

    async def load(self, run_id: str) -> StoredRun:
        """The run as stored. Raises :class:`UnknownRequestError` for an unknown run, and
        :class:`StoreError` for one that cannot be read."""
        ...

    async def runs(self, limit: int = 1000) -> list[RunSummary]:
        """The runs the store knows, newest first."""
        ...

    async def list_runs(self, query: RunQuery) -> RunPage:
        """A page of runs, newest first, with the total matching and counts per status."""
        ...

    async def list_requests(self, query: RequestQuery) -> RequestPage:
        """A page of outstanding requests, oldest first, with the total matching and
        counts per kind."""
        ...

    async def answers(self, run_id: str) -> list[AnswerRecord]:
        """The audit trail of a run's answers, in the order they were given (refused ones
        included); kept after the run itself is forgotten, never changed."""
        ...

    async def run_view(self, run_id: str) -> RunView:
        """A run whole, its history included. Raises :class:`UnknownRequestError` for an
        unknown run, :class:`StoreError` for one that cannot be read."""
        ...

    async def events(self, after: int, limit: int = 500) -> EventRead:
        """The events after ``seq`` ``after``, oldest first, at most ``limit``."""
        ...

    async def event_bounds(self) -> tuple[int, int]:
        """The ``seq`` of the oldest and of the newest event kept (0, 0 when none)."""
        ...

    def watch(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` (on the event loop, quickly) whenever new events may have
        been committed: after this store object's writes, and when another worker's are
        told (PostgreSQL, while a :meth:`listen` is open). Returns the function that stops
        it. A reader also looks every so often: a wake-up may be missed."""
        ...

    async def ping(self) -> None:
        """Reach the store once, reading nothing (a readiness check).

        Raises:
            StoreUnavailableError: it cannot be reached now.
        """
        ...

    # -- being told ----------------------------------------------------------------------

    async def listen(
        self, callback: Callable[[StoreEvent], None], *, owner: str | None = None
    ) -> Callable[[], None]:
        """Call ``callback`` (on the event loop, quickly: it must not block) with each event
        the store can see from now on; returns the function that stops it. With ``owner``
        (a worker's name), a store may tell only what that worker must act on: answers
        another worker took for runs ``owner`` holds (PostgreSQL routes those to that worker
        alone, so that the workers on a database do not each hear every run's events)."""
        ...

    async def aclose(self) -> None:
        """Release what the store holds; idempotent."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc_info: object) -> None: ...
