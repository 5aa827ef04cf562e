"""The Inbox: many suspended runs parked on one event loop, woken by answering.

Rules of this module:

- It parks, and only parks: it holds no store, client or toolkit. Keeping runs that wait
  too long, and resuming them, is a durable host's job
  (:class:`~toolnexus_async.durable.DurableHost`).
- A parked run costs one object, its slot (the future it awaits, keyed by the request
  id); nothing polls. ``answer()`` resolves exactly that future, so exactly that run wakes.
- Expiry costs one timer for the whole inbox, not a sleeping task per request
  (``_timers.Deadlines``: a heap, and one ``loop.call_at`` handle for its earliest entry).
  A request has an entry for its ``expires_at`` and one for ``park_timeout``; an
  answered or cancelled request's entries are removed lazily but boundedly.
- A wrong answer changes nothing: an unknown, already answered or expired id raises its own
  :class:`AnswerError` subclass before any state is touched.
- Cancellation cleans up: a parked run whose task is cancelled (or whose time limit fires)
  leaves the inbox in the same ``finally`` that ends its wait.
- Giving up is a halt, never a loss: a run parked longer than ``park_timeout`` (or every
  run, on :meth:`Inbox.halt_all`) has its wait raise :class:`HaltRun`, so the run halts
  with its request outstanding and its caller gets it back with ``status == "pending"``.
- The inbox lives on one event loop (the first that parks on it); other threads answer
  through :meth:`Inbox.answer_threadsafe`.
- Who answered is kept only when the host says (``answered_by``), in memory, bounded like
  the outcomes (``remember``): an answer without it costs the inbox nothing more. A durable
  audit trail is a store's (``DurableHost.answer``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator
from typing import Any, Literal

from .._core.audit import AnswerRecord, check_answered_by, shown_digest, taken_outcome
from .._core.errors import (
    AlreadyAnsweredError,
    RequestExpiredError,
    UnknownRequestError,
    UsageError,
)
from .._core.types import Answer, HaltRun, Request
from .._core.wire import approval_claim, claim_refusal
from ._listeners import Listeners
from ._timers import Deadlines

__all__ = ("Inbox",)

_Outcome = Literal["answered", "expired", "halted"]
_future_init = asyncio.Future.__init__


class _Slot(asyncio.Future[Answer]):
    """One parked request: the future its run awaits, with what the inbox keeps of it.

    One object per parked run, not a future and a slot: a parked run holds fewer objects
    for the collector to walk. Its cleanup on cancellation is :meth:`cancel` itself, not
    a done callback, so the future's only callback is its task's wake-up (no callback
    list, no tuple per run). ``park.py --no-stalls``: 34.0 pymalloc blocks per parked
    run, 40.0 with a slot holding a future and its done callback.
    """

    __slots__ = ("deadline", "inbox", "request", "run_id", "spill")

    def __init__(
        self,
        inbox: Inbox,
        request: Request,
        run_id: str | None,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        # The future's own __init__ without super(): no super object per park.
        _future_init(self, loop=loop)
        self.inbox = inbox
        self.request = request
        self.run_id = run_id
        self.deadline = -1  # the number of its expiry entry in the timers, if it has one
        self.spill = -1  # the number of its park_timeout entry, if it has one

    @property
    def timers(self) -> int:
        """How many entries of the inbox's timers are this slot's."""
        return (self.deadline >= 0) + (self.spill >= 0)

    def cancel(self, msg: Any | None = None) -> bool:
        """A cancelled wait (its task was cancelled, or its time limit fired) leaves the
        inbox in the same step. (answer() and the timer remove the slot before they
        resolve it, so a slot cancelled once done changes nothing.)"""
        if not super().cancel(msg):
            return False
        inbox = self.inbox
        if inbox._slots.get(self.request.id) is self:
            del inbox._slots[self.request.id]
            inbox._drop_timers(self)
            inbox._left(self, None)
        return True


class Inbox:
    """An async ``wait_for`` that parks each request until :meth:`answer` is called.

    Pass it as ``LlmClient(..., wait_for=inbox)``; a web handler (or a bot, or a thread)
    answers with ``inbox.answer(Answer(request_id, ok=True))``.

    Args:
        remember: how many answered, expired or halted ids are kept, so that a late or
            repeated answer gets :class:`AlreadyAnsweredError`, :class:`RequestExpiredError` or a
            message saying the run halted, instead of a bare :class:`UnknownRequestError`.
            Older ones are forgotten (bounded memory).
        park_timeout: seconds a request may stay parked; past it the run halts on the
            request (``status == "pending"``) and stops holding memory. A
            :class:`~toolnexus_async.durable.DurableHost` saves such runs and resumes them when
            the answer comes.
    """

    def __init__(self, *, remember: int = 100_000, park_timeout: float | None = None) -> None:
        if remember < 0:
            raise UsageError(f"remember must be >= 0, got {remember}")
        if park_timeout is not None and not park_timeout > 0:
            raise UsageError(f"park_timeout must be > 0 seconds or None, got {park_timeout}")
        self._park_timeout = park_timeout
        self._slots: dict[str, _Slot] = {}
        self._outcomes: OrderedDict[str, _Outcome] = OrderedDict()
        self._given: OrderedDict[str, tuple[Request, str | None, Answer, str, float]] = (
            OrderedDict()
        )
        self._remember = remember
        self._timers = Deadlines(self._due, self._holds)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listeners = Listeners()
        self._halting_all = False

    def __len__(self) -> int:
        return len(self._slots)

    def __repr__(self) -> str:
        return f"<Inbox parked={len(self._slots)}>"

    @property
    def park_timeout(self) -> float | None:
        """Seconds a request may stay parked before its run halts (None: no limit)."""
        return self._park_timeout

    def pending(self, run_id: str | None = None) -> list[Request]:
        """The outstanding requests, in the order they arrived; with ``run_id``, only that
        run's (the id of :class:`RunHandle` and ``RunResult.run_id``)."""
        if run_id is None:
            return [slot.request for slot in self._slots.values()]
        return [slot.request for slot in self._slots.values() if slot.run_id == run_id]

    def get(self, request_id: str) -> Request | None:
        """The outstanding request with this id, or None."""
        slot = self._slots.get(request_id)
        return slot.request if slot is not None else None

    def run_of(self, request_id: str) -> str | None:
        """The id of the run waiting on this outstanding request (None if unknown)."""
        slot = self._slots.get(request_id)
        return slot.run_id if slot is not None else None

    async def __call__(self, request: Request) -> Answer:
        """Park until the request is answered or expires (the ``wait_for`` protocol)."""
        return await self._park(request)

    def _park(self, request: Request, run_id: str | None = None) -> asyncio.Future[Answer]:
        """Park ``request`` and hand back the future its answer will arrive on.

        The run awaits this future directly, so a parked run holds no extra frame
        (``park.py --no-stalls``: 34.0 pymalloc blocks per parked run, 35.0 with a
        coroutine here).
        Cancelling the future (its awaiting task was cancelled) removes the entry.
        """
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif loop is not self._loop:
            raise UsageError("this Inbox belongs to another event loop")
        if request.id in self._slots:
            raise UsageError(f"request id {request.id!r} is already parked; ids must be unique")
        slot = _Slot(self, request, run_id, loop)
        left = None if request.expires_at is None else request.seconds_left()
        if left is not None and left <= 0:
            self._record(request.id, "expired")
            slot.set_result(Answer(request.id, False, reason="expired"))
            return slot
        if self._halting_all:
            self._halt(slot, "the inbox is halting every run")
            return slot
        self._slots[request.id] = slot
        if left is not None:
            slot.deadline = self._timers.add(loop, loop.time() + left, request.id)
        if self._park_timeout is not None:
            slot.spill = self._timers.add(loop, loop.time() + self._park_timeout, request.id)
        if self._listeners.listening:
            self._listeners.tell(request)
        return slot

    async def answer(self, answer: Answer, *, answered_by: str | None = None) -> None:
        """Wake the run parked on ``answer.id`` with this answer.

        Awaited, as :meth:`DurableHost.answer` is, so that code answering either kind of
        host reads alike; in memory nothing waits, and :meth:`answer_nowait` does the same
        from code that cannot await (a callback, a sync handler on the loop's thread).

        ``answered_by`` names who gave it, as the caller authenticated them (never a
        credential); the inbox then keeps an :class:`~toolnexus_async.durable.AnswerRecord`
        of it, with the digest of what the request showed, for :meth:`answered` (in memory,
        as many as ``remember``; a store keeps them durably: ``DurableHost.answer``).

        Raises:
            UnknownRequestError: no run is parked on that id (the message says when its run
                halted instead: answer the halted run, or its durable host).
            AlreadyAnsweredError: that request was answered before.
            RequestExpiredError: that request expired before this answer came.
            AnswerMismatchError: it approves another call than its request shows (it names
                a ``data["digest"]`` that is not the request's); the run still waits.
            UsageError: not an :class:`Answer`, or ``answered_by`` is not a short printable
                string (or None).
        """
        self.answer_nowait(answer, answered_by=answered_by)

    def answer_nowait(self, answer: Answer, *, answered_by: str | None = None) -> None:
        """:meth:`answer` without awaiting, on the inbox's loop thread: it raises what
        :meth:`answer` raises (its "Raises" says which)."""
        if not isinstance(answer, Answer):
            raise UsageError(
                f"Inbox.answer() takes an Answer, got {type(answer).__name__}: build one with "
                f"Answer(request.id, ok=True), or Answer.from_dict(payload) from a wire dict"
            )
        if answered_by is not None:
            check_answered_by(answered_by)
        slot = self._slots.get(answer.id)
        if slot is None or slot.done():
            raise self._refusal(answer.id)
        # Only an approval with data can claim anything (approval_claim): the usual answer
        # skips the two calls.
        if answer.ok and answer.data is not None:
            mismatch = claim_refusal(slot.request, approval_claim(answer))
            if mismatch is not None:
                raise mismatch  # the request stays parked: a fitting answer may still come
        del self._slots[answer.id]
        if slot.deadline >= 0 or slot.spill >= 0:  # else no timers: the usual slot
            self._drop_timers(slot)
        self._record(answer.id, "answered")
        if answered_by is not None and self._remember:
            # The record is built when read: an answer pays a tuple, not a digest.
            self._given[answer.id] = (slot.request, slot.run_id, answer, answered_by, time.time())
            if len(self._given) > self._remember:
                self._given.popitem(last=False)
        self._left(slot, answer)
        slot.set_result(answer)

    def answered(self, request_id: str) -> AnswerRecord | None:
        """Who answered ``request_id`` and what it showed them, if the answer named who
        (``answered_by``) and is among the last ``remember``; else None."""
        given = self._given.get(request_id)
        if given is None:
            return None
        request, run_id, answer, answered_by, at = given
        outcome, detail = taken_outcome(answer.ok, answer.reason)
        digest = shown_digest(request)
        return AnswerRecord(request_id, run_id, None, outcome, detail, answered_by, at, digest)

    def _left(self, slot: _Slot, answer: Answer | None) -> None:
        """A parked request left: answered or expired (``answer``), or its wait was
        cancelled (None, once the future is cancelled); not when its run halts on it.
        Called before its run wakes, for a subclass that books requests (serve's): a hook
        costs a parked run nothing, a done callback a callback list, a context copy and a
        partial each."""

    def _refusal(
        self, request_id: str
    ) -> UnknownRequestError | AlreadyAnsweredError | RequestExpiredError:
        outcome = self._outcomes.get(request_id)
        if outcome == "answered":
            return AlreadyAnsweredError(request_id, f"request {request_id!r} was answered already")
        if outcome == "expired":
            return RequestExpiredError(
                request_id, f"request {request_id!r} expired before the answer"
            )
        if outcome == "halted":
            return UnknownRequestError(
                request_id,
                f"request {request_id!r} is no longer parked: its run halted on it "
                "(park_timeout or halt_all); answer the halted run instead",
            )
        return UnknownRequestError(
            request_id, f"no run is waiting on request {request_id!r} (unknown or cancelled)"
        )

    def answer_threadsafe(
        self, answer: Answer, timeout: float | None = None, *, answered_by: str | None = None
    ) -> None:
        """:meth:`answer` from another thread: blocks until applied, raises what it raises.

        Raises:
            UsageError: called on the inbox's own loop thread (await :meth:`answer` there),
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
                self.answer_nowait(answer, answered_by=answered_by)
            except BaseException as exc:
                done.set_exception(exc)
            else:
                done.set_result(None)

        loop.call_soon_threadsafe(apply)
        done.result(timeout)

    def requests(self) -> AsyncGenerator[Request, None]:
        """Each request parked from now on, once, as it arrives (for forwarding to humans).

        Several iterators may run at once; each sees every new request. Requests parked
        before the iteration began are in :meth:`pending`.
        """
        return self._listeners.requests()

    def halt_all(self) -> int:
        """Halt every parked run now, and every run that parks from now on (a shutdown).

        Each halts with its request outstanding (``status == "pending"``), as after
        ``park_timeout``. Returns how many parked runs were halted.
        """
        self._halting_all = True
        slots = tuple(self._slots.values())
        self._slots.clear()
        for slot in slots:
            self._drop_timers(slot)
            self._halt(slot, "the inbox is halting every run")
        return len(slots)

    def _halt(self, slot: _Slot, why: str) -> None:
        """Halt the run of ``slot``, which has left the slots and the timers already."""
        request_id = slot.request.id
        self._record(request_id, "halted")
        if not slot.done():
            slot.set_exception(HaltRun(why))

    def _record(self, request_id: str, outcome: _Outcome) -> None:
        if self._remember == 0:
            return
        self._outcomes[request_id] = outcome
        if len(self._outcomes) > self._remember:
            self._outcomes.popitem(last=False)

    def _drop_timers(self, slot: _Slot) -> None:
        """``slot`` left the inbox: its entries in the timers are no longer live."""
        if slot.deadline >= 0 or slot.spill >= 0:  # else no timers: the usual slot
            count = slot.timers
            slot.deadline = slot.spill = -1
            self._timers.dropped(count)

    def _holds(self, number: int, request_id: str) -> bool:
        """Whether entry ``number`` of the timers is still a parked request's."""
        slot = self._slots.get(request_id)
        return slot is not None and number in (slot.deadline, slot.spill)

    def _due(self, number: int, request_id: str) -> int | None:
        """Entry ``number`` fell due: the request expires, or its run halts (park_timeout).
        None if the entry is not live (answered, cancelled or re-parked); else how many
        more of its entries are stale from now on."""
        slot = self._slots.get(request_id)
        if slot is None or slot.done() or number not in (slot.deadline, slot.spill):
            return None
        del self._slots[request_id]
        left_stale = slot.timers - 1
        expired = number == slot.deadline
        slot.deadline = slot.spill = -1
        if expired:
            self._record(request_id, "expired")
            answer = Answer(request_id, False, reason="expired")
            self._left(slot, answer)
            slot.set_result(answer)
        else:
            self._halt(slot, f"parked longer than {self._park_timeout} s")
        return left_stale
