"""The Inbox: many suspended runs parked on one event loop, woken by answering.

Rules of this module:

- A parked run costs one future and one small slot, keyed by the request id; nothing
  polls. ``answer()`` resolves exactly that future, so exactly that run wakes.
- Expiry costs one timer for the whole inbox, not a sleeping task per request: deadlines
  sit in a heap and a single ``loop.call_at`` handle fires for the earliest one. An
  answered or cancelled request's entries are removed lazily but boundedly: once stale
  entries are at least half the heap it is rebuilt, so the heap never holds more than
  twice the live entries, and none once nothing with a deadline is parked.
- A wrong answer changes nothing: an unknown, already answered or expired id raises its own
  :class:`AnswerError` subclass before any state is touched.
- Cancellation cleans up: a parked run whose task is cancelled (or whose time limit fires)
  leaves the inbox in the same ``finally`` that ends its wait.
- The inbox lives on one event loop (the first that parks on it); other threads answer
  through :meth:`Inbox.answer_threadsafe`.
- Hot parking spills to disk: with ``park_timeout`` a run parked that long stops holding
  memory. Its wait raises :class:`HaltRun`, the run halts, the client hands the halted run
  to :meth:`Inbox.on_halt`, which saves it in the store; an answer to it later claims it
  from the store and resumes it in the inbox's task group. The host answers the same way
  either way.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import heapq
import itertools
import logging
import math
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Literal, Self

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectSendStream

from .._errors import (
    AlreadyAnswered,
    AnswerError,
    ModelError,
    RequestExpired,
    UnknownRequest,
    UsageError,
)
from .._results import RunResult
from .._types import Answer, HaltRun, Request

if TYPE_CHECKING:
    from .._client import LlmClient
    from .._toolkit import Toolkit
    from ..durable import RunStore

log = logging.getLogger("toolnexus_async")

__all__ = ("Inbox",)

_Outcome = Literal["answered", "expired"]
_NO_CONTEXT = contextvars.Context()


class _Slot:
    """One parked request. Slots keep memory per parked run small."""

    __slots__ = ("deadline", "future", "inbox", "request", "spill")

    def __init__(self, inbox: Inbox, request: Request, future: asyncio.Future[Answer]) -> None:
        self.inbox = inbox
        self.request = request
        self.future = future
        self.deadline = -1  # the number of its expiry entry in the heap, if it has one
        self.spill = -1  # the number of its park_timeout entry, if it has one

    @property
    def timers(self) -> int:
        """How many entries of the timer heap are this slot's."""
        return (self.deadline >= 0) + (self.spill >= 0)

    def __call__(self, future: asyncio.Future[Answer]) -> None:
        """The future's done-callback: a cancelled wait leaves the inbox.

        (answer() and the timer remove the slot before resolving the future.)
        """
        inbox = self.inbox
        if future.cancelled() and inbox._slots.get(self.request.id) is self:
            del inbox._slots[self.request.id]
            inbox._drop_timers(self)


class _Spilled:
    """Where a spilled run can be resumed from: its client and toolkit (the run is on disk)."""

    __slots__ = ("client", "early", "toolkit")

    def __init__(self) -> None:
        self.client: LlmClient | None = None
        self.toolkit: Toolkit | None = None
        self.early: Answer | None = None  # an answer that came while the run was being saved


class Inbox:
    """An async ``wait_for`` that parks each request until :meth:`answer` is called.

    Pass it as ``LlmClient(..., wait_for=inbox)``; a web handler (or a bot, or a thread)
    answers with ``inbox.answer(Answer(request_id, ok=True))``.

    Args:
        remember: how many answered or expired ids are kept, so that a late or repeated
            answer gets :class:`AlreadyAnswered` or :class:`RequestExpired` instead of
            :class:`UnknownRequest`. Older ones are forgotten (bounded memory).
    """

    # The executor leaves expires_at to us: one timer heap instead of a cancel scope per run.
    handles_expiry = True

    def __init__(
        self,
        *,
        remember: int = 100_000,
        park_timeout: float | None = None,
        store: RunStore | None = None,
        on_result: Callable[[RunResult], Awaitable[None]] | None = None,
    ) -> None:
        if remember < 0:
            raise UsageError(f"remember must be >= 0, got {remember}")
        if park_timeout is not None and (store is None or park_timeout <= 0):
            raise UsageError("park_timeout needs a store to spill to, and must be > 0")
        self._park_timeout = park_timeout
        self._store = store
        self._on_result = on_result
        self._spilled: dict[str, _Spilled] = {}
        self._tg: TaskGroup | None = None
        self._slots: dict[str, _Slot] = {}
        self._outcomes: OrderedDict[str, _Outcome] = OrderedDict()
        self._remember = remember
        self._deadlines: list[tuple[float, int, str]] = []
        self._stale = 0  # heap entries of requests no longer parked
        self._order = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listeners: set[MemoryObjectSendStream[Request]] = set()

    def __len__(self) -> int:
        return len(self._slots)

    def __repr__(self) -> str:
        return f"<Inbox parked={len(self._slots)}>"

    def pending(self) -> list[Request]:
        """The outstanding requests, in the order they arrived."""
        return [slot.request for slot in self._slots.values()]

    def get(self, request_id: str) -> Request | None:
        """The outstanding request with this id, or None."""
        slot = self._slots.get(request_id)
        return slot.request if slot is not None else None

    async def __call__(self, request: Request) -> Answer:
        """Park until the request is answered or expires (the ``wait_for`` protocol)."""
        return await self.park(request)

    def park(self, request: Request) -> asyncio.Future[Answer]:
        """Park ``request`` and hand back the future its answer will arrive on.

        The run loop awaits this future directly, so a parked run holds no extra frame.
        Cancelling the future (its awaiting task was cancelled) removes the entry.
        """
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif loop is not self._loop:
            raise UsageError("this Inbox belongs to another event loop")
        if request.id in self._slots:
            raise UsageError(f"request id {request.id!r} is already parked; ids must be unique")
        future: asyncio.Future[Answer] = loop.create_future()
        left = request.seconds_left()
        if left is not None and left <= 0:
            self._record(request.id, "expired")
            future.set_result(Answer(request.id, False, reason="expired"))
            return future
        slot = _Slot(self, request, future)
        self._slots[request.id] = slot
        if left is not None:
            slot.deadline = self._add_deadline(loop, loop.time() + left, request.id)
        if self._park_timeout is not None:
            slot.spill = self._add_deadline(loop, loop.time() + self._park_timeout, request.id)
        # No context copy per parked request: the slot's callback reads no context vars.
        future.add_done_callback(slot, context=_NO_CONTEXT)
        for listener in tuple(self._listeners):
            try:
                listener.send_nowait(request)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self._listeners.discard(listener)
        return future

    def answer(self, answer: Answer) -> None:
        """Wake the run parked on ``answer.id`` with this answer.

        Raises:
            UnknownRequest: no run is parked on that id.
            AlreadyAnswered: that request was answered before.
            RequestExpired: that request expired before this answer came.
        """
        slot = self._slots.get(answer.id)
        if slot is None and answer.id in self._spilled:
            self._answer_spilled(answer)
            return
        if slot is None or slot.future.done():
            outcome = self._outcomes.get(answer.id)
            if outcome == "answered":
                raise AlreadyAnswered(answer.id, f"request {answer.id!r} was answered already")
            if outcome == "expired":
                raise RequestExpired(answer.id, f"request {answer.id!r} expired before the answer")
            raise UnknownRequest(
                answer.id, f"no run is waiting on request {answer.id!r} (unknown or cancelled)"
            )
        del self._slots[answer.id]
        self._drop_timers(slot)
        self._record(answer.id, "answered")
        slot.future.set_result(answer)

    def answer_threadsafe(self, answer: Answer, timeout: float | None = None) -> None:
        """:meth:`answer` from another thread: blocks until applied, raises what it raises.

        Raises:
            UsageError: called on the inbox's own loop thread (use :meth:`answer` there),
                or before any run parked on the inbox.
            TimeoutError: the loop did not apply the answer within ``timeout`` seconds.
        """
        loop = self._loop
        if loop is None:
            raise UsageError("no run has parked on this Inbox yet, so it has no event loop")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            raise UsageError("answer_threadsafe() would deadlock on the inbox's own loop")
        done: concurrent.futures.Future[None] = concurrent.futures.Future()

        def apply() -> None:
            try:
                self.answer(answer)
            except BaseException as exc:
                done.set_exception(exc)
            else:
                done.set_result(None)

        loop.call_soon_threadsafe(apply)
        done.result(timeout)

    async def requests(self) -> AsyncIterator[Request]:
        """Each request parked from now on, once, as it arrives (for forwarding to humans).

        Several iterators may run at once; each sees every new request. Requests parked
        before the iteration began are in :meth:`pending`.
        """
        send, receive = anyio.create_memory_object_stream[Request](math.inf)
        self._listeners.add(send)
        try:
            async with receive:
                async for request in receive:
                    yield request
        finally:
            self._listeners.discard(send)
            send.close()

    def _record(self, request_id: str, outcome: _Outcome) -> None:
        if self._remember == 0:
            return
        self._outcomes[request_id] = outcome
        if len(self._outcomes) > self._remember:
            self._outcomes.popitem(last=False)

    def _add_deadline(self, loop: asyncio.AbstractEventLoop, when: float, request_id: str) -> int:
        number = next(self._order)
        heapq.heappush(self._deadlines, (when, number, request_id))
        if when < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = when
            self._timer = loop.call_at(when, self._expire_due)
        return number

    def _drop_timers(self, slot: _Slot) -> None:
        """``slot`` left the inbox: its heap entries are stale; compact when they pile up."""
        count = slot.timers
        if not count:
            return
        self._stale += count
        if self._stale * 2 < len(self._deadlines):
            return
        live = self._slots
        self._deadlines = [
            entry
            for entry in self._deadlines
            if (owner := live.get(entry[2])) is not None
            and entry[1] in (owner.deadline, owner.spill)
        ]
        heapq.heapify(self._deadlines)
        self._stale = 0
        if not self._deadlines and self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self._timer_at = math.inf

    def _expire_due(self) -> None:
        loop = self._loop
        assert loop is not None
        self._timer = None
        self._timer_at = math.inf
        # asyncio may fire a timer up to its clock resolution early; count that as due.
        now = loop.time() + time.get_clock_info("monotonic").resolution
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            _, number, request_id = heapq.heappop(deadlines)
            slot = self._slots.get(request_id)
            # Entries of answered, cancelled or re-parked requests are skipped: the heap is
            # cleaned lazily rather than searched on every answer.
            if slot is None or slot.future.done() or number not in (slot.deadline, slot.spill):
                self._stale = max(0, self._stale - 1)
                continue
            del self._slots[request_id]
            # The slot's other entry (expiry or spill), if any, is stale from now on.
            self._stale += slot.timers - 1
            if number == slot.deadline:
                self._record(request_id, "expired")
                slot.future.set_result(Answer(request_id, False, reason="expired"))
            else:
                # Parked too long: the run halts and on_halt() stores it; answers that come
                # meanwhile are kept for it.
                self._spilled[request_id] = _Spilled()
                slot.future.set_exception(HaltRun(f"parked longer than {self._park_timeout} s"))
        if deadlines:
            when = deadlines[0][0]
            self._timer_at = when
            self._timer = loop.call_at(when, self._expire_due)

    # -- spilling to the store ---------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._tg is not None:
            raise UsageError("this Inbox is already open")
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        tg, self._tg = self._tg, None
        assert tg is not None
        return await tg.__aexit__(exc_type, exc, tb)

    async def on_halt(self, run: RunResult, client: LlmClient, toolkit: Toolkit) -> None:
        """Called by the client when a run using this inbox halts: store the spilled run.

        Only runs that halted because they spilled are stored; others are the host's.
        """
        ids = [r.request.id for r in run.suspended if r.request is not None]
        if self._store is None or not any(i in self._spilled for i in ids):
            return
        await self._store.save(run)
        log.debug("spilled run %s under %s", run.run_id, ", ".join(ids))
        early: Answer | None = None
        for request_id in ids:
            entry = self._spilled.setdefault(request_id, _Spilled())
            entry.client, entry.toolkit = client, toolkit
            early = early or entry.early
        if early is not None:
            self._start_resume(early)

    async def restore(self, client: LlmClient, toolkit: Toolkit) -> int:
        """After a restart: make every run in the store answerable through this inbox.

        Returns how many outstanding requests were found.
        """
        if self._store is None:
            raise UsageError("restore() needs an Inbox with a store")
        requests = await self._store.requests()
        for request in requests:
            entry = self._spilled.setdefault(request.id, _Spilled())
            entry.client, entry.toolkit = client, toolkit
        return len(requests)

    def _answer_spilled(self, answer: Answer) -> None:
        entry = self._spilled[answer.id]
        if self._tg is None:
            raise UsageError(
                f"request {answer.id!r} belongs to a spilled run; it resumes inside "
                "`async with inbox:`, which is not open"
            )
        if entry.client is None:
            if entry.early is not None:
                raise AlreadyAnswered(answer.id, f"request {answer.id!r} was answered already")
            entry.early = answer  # still being saved; on_halt() resumes it
            self._record(answer.id, "answered")
            return
        self._record(answer.id, "answered")
        self._start_resume(answer)

    def _start_resume(self, answer: Answer) -> None:
        entry = self._spilled.pop(answer.id)
        assert self._tg is not None and entry.client is not None and entry.toolkit is not None
        self._tg.start_soon(self._resume, answer, entry.client, entry.toolkit)

    async def _resume(self, answer: Answer, client: LlmClient, toolkit: Toolkit) -> None:
        from ..durable._resume import resume_claimed  # durable imports the client; so late

        store = self._store
        assert store is not None
        try:
            halted = await store.claim(answer.id)
        except AnswerError as exc:
            log.warning("could not resume spilled request %s: %s", answer.id, exc)
            return
        except Exception:
            # The store failed (an unreadable row, a locked file): the run is still there,
            # so the request stays answerable; the inbox's other runs go on.
            log.exception("could not claim spilled request %s from the store", answer.id)
            entry = self._spilled.setdefault(answer.id, _Spilled())
            entry.client, entry.toolkit = client, toolkit
            return
        for record in halted.suspended:
            if record.request is not None:
                self._spilled.pop(record.request.id, None)
        ran: list[RunResult] = []
        try:
            result = await resume_claimed(
                client, store, halted, [answer], toolkit, on_tools_done=ran.append
            )
        except Exception as exc:
            if not ran:
                # Nothing ran and resume_claimed put the run back: answerable again.
                await self.restore(client, toolkit)
                log.exception("resuming spilled run %s failed; it was stored again", halted.run_id)
                return
            # The answered calls ran: the host gets the run as it stood, to continue from.
            log.warning("resumed run %s failed after its tools ran: %r", halted.run_id, exc)
            result = exc.run if isinstance(exc, ModelError) and exc.run is not None else ran[-1]
        if self._on_result is not None:
            await self._on_result(result)
