"""The durable host: runs that outlive their wait, answered in one place, wherever they wait.

Rules of this module:

- :class:`DurableHost` owns the three things a run needs to go on later (the client, the
  toolkit, the store) and nothing below it holds them: the :class:`~toolnexus_async.Inbox`
  only parks, the client only runs.
- Every run the host drives that halts (``status == "pending"``: nobody could answer, or
  its inbox gave up waiting) is saved in the store before its caller gets it back.
- One call answers every request the host knows: :meth:`DurableHost.answer` wakes a run
  parked in memory, or claims a stored run (so no other resume can run it too) and resumes
  it in the host's task group. An answer that arrives while its halted run is still being
  saved is kept, and the run resumes once the save is done.
- A stored run is never lost by resuming it, and no tool of it runs twice: it is claimed,
  resumed, and then finished, saved again because it halted again, or, when the resume
  fails before its tools ran, put back exactly as it was claimed. A failure after the
  tools ran (a model error, a timeout, a cancellation) is not put back, since the old
  state would run those tools again; a model error carries the run's state
  (``error.run``) to continue from. :func:`resume_stored` is the same, for one answer,
  without a host.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import Any, Self

import anyio
from anyio.abc import TaskGroup

from .._client import LlmClient
from .._errors import AlreadyAnsweredError, ModelError, StoreError, UnknownRequestError, UsageError
from .._hooks import call_hook
from .._ids import new_run_id
from .._messages import Message
from .._results import RunResult
from .._streaming import RunStream, Sink
from .._toolkit import Toolkit
from .._types import Answer, Request
from ..suspend import Inbox
from ._store import RunStore, outstanding_ids

__all__ = ("DurableHost", "resume_stored")

log = logging.getLogger("toolnexus_async.durable")

OnResult = Callable[[RunResult], Any]

# How many halted-but-not-yet-saved requests are remembered (bounded memory if a run the
# host drives halts and is never handed back, e.g. it was cancelled meanwhile).
_REMEMBER = 100_000


class DurableHost:
    """A client, a toolkit and a store: runs that halt are kept, and any answer resumes them.

    The client's ``wait_for`` decides how long a run waits in memory: an
    :class:`~toolnexus_async.Inbox` parks it (with ``park_timeout``, only that long), no
    ``wait_for`` halts it at once; either way a halted run is saved and its answer, given
    to :meth:`answer`, resumes it here, in this process or in a new one after a restart::

        inbox = Inbox(park_timeout=300)
        async with (
            SqliteRunStore("runs.db") as store,
            LlmClient(..., wait_for=inbox) as client,
            DurableHost(client, toolkit, store, on_result=tell_the_user) as host,
        ):
            result = await host.run("refund order S-1")
            ...
            await host.answer(Answer(request_id, ok=True))  # parked or stored alike

    Args:
        client: runs the prompts; closed by its owner, not by the host.
        toolkit: the tools of every run; closed by its owner.
        store: where halted runs are kept; opened and closed by its owner.
        on_result: ``(result) -> None``, sync or async: the result of every run the host
            resumed from the store (whoever called :meth:`run` got the halted result
            already). A resume that fails after its tools ran hands over ``error.run``.
    """

    def __init__(
        self,
        client: LlmClient,
        toolkit: Toolkit,
        store: RunStore,
        *,
        on_result: OnResult | None = None,
    ) -> None:
        self.client = client
        self.toolkit = toolkit
        self.store = store
        self._on_result = on_result
        inbox = client.wait_for
        self.inbox: Inbox | None = inbox if isinstance(inbox, Inbox) else None
        if self.inbox is not None:
            self.inbox._listen_for_halts(self._halting)
        self._tg: TaskGroup | None = None
        self._driving: set[str] = set()  # ids of the runs this host is driving now
        # Requests whose run halted and is being saved: an answer meanwhile waits here.
        self._saving: OrderedDict[str, Answer | None] = OrderedDict()

    def __repr__(self) -> str:
        return f"<DurableHost store={self.store!r} runs={len(self._driving)}>"

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._tg is not None:
            raise UsageError("this DurableHost is already open")
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        """Waits for the resumes still running (cancel them by cancelling the host's scope)."""
        tg, self._tg = self._tg, None
        assert tg is not None
        try:
            return await tg.__aexit__(exc_type, exc, tb)
        finally:
            if self.inbox is not None:
                self.inbox._listen_for_halts(None)

    # -- running -----------------------------------------------------------------------------

    async def run(
        self,
        prompt: str | None,
        *,
        history: Sequence[Message] | None = None,
        run_id: str | None = None,
    ) -> RunResult:
        """:meth:`LlmClient.run` with the host's toolkit; a halted result is saved first."""
        run_id = run_id or new_run_id()
        self._driving.add(run_id)
        try:
            result = await self.client.run(prompt, self.toolkit, history, run_id=run_id)
            if result.status == "pending":
                await self.keep(result)
            return result
        finally:
            self._driving.discard(run_id)

    def stream(
        self,
        prompt: str | None,
        *,
        history: Sequence[Message] | None = None,
        run_id: str | None = None,
    ) -> RunStream:
        """:meth:`LlmClient.stream` with the host's toolkit; a halted run is saved before
        its ``done`` event."""
        run_id = run_id or new_run_id()
        inner = self.client.stream(prompt, self.toolkit, history, run_id=run_id)

        async def start(sink: Sink) -> RunResult:
            self._driving.add(run_id)
            try:
                result = await inner._start(sink)
                if result.status == "pending":
                    await self.keep(result)
                return result
            finally:
                self._driving.discard(run_id)

        return RunStream(start)

    async def keep(self, run: RunResult) -> None:
        """Save a halted run so that :meth:`answer` resumes it (the host's runs are saved
        for you; this is for one halted elsewhere, e.g. by ``client.run``).

        Raises:
            UsageError: ``run`` is not halted; see :meth:`RunStore.save`.
        """
        await self.store.save(run)
        early = [a for i in outstanding_ids(run) if (a := self._saving.pop(i, None)) is not None]
        if early:
            # Answered while being saved: it goes on now, as if the answer came just after.
            self._start(await self.store.claim(early[0].id), early)

    def _halting(self, request: Request, run_id: str | None) -> None:
        """The inbox made a run halt on ``request``: it will be saved in a moment."""
        if run_id is None or run_id not in self._driving:
            return  # not one of ours: whoever runs it gets it back halted
        self._saving[request.id] = None
        while len(self._saving) > _REMEMBER:
            self._saving.popitem(last=False)

    # -- answering ---------------------------------------------------------------------------

    async def answer(self, answer: Answer) -> None:
        """Wake the run that waits for ``answer.id``, in memory or in the store.

        A stored run is claimed here and resumed in the host's task group (inside
        ``async with host:``); its result goes to ``on_result``.

        Raises:
            UnknownRequestError: no run waits for that id, parked or stored.
            AlreadyAnsweredError, RequestExpiredError: the parked request was answered or expired.
            AlreadyResumedError: the stored run was claimed by another resume first.
            StoreError: the stored run cannot be read (it stays in the store).
            UsageError: a stored run, but the host is not open.
        """
        if not isinstance(answer, Answer):
            raise UsageError(f"answer() takes an Answer, got {type(answer).__name__}")
        inbox = self.inbox
        if inbox is not None and inbox.get(answer.id) is not None:
            inbox.answer(answer)
            return
        if answer.id in self._saving:
            if self._saving[answer.id] is not None:
                raise AlreadyAnsweredError(answer.id, f"request {answer.id!r} was answered already")
            self._check_open(answer.id)
            self._saving[answer.id] = answer  # keep() resumes the run once it is saved
            return
        self._check_open(answer.id)
        try:
            halted = await self.store.claim(answer.id)
        except UnknownRequestError:
            # Not stored: perhaps it was parked here and answered, or expired, already.
            refusal = inbox._refusal(answer.id) if inbox is not None else None
            if refusal is not None and not isinstance(refusal, UnknownRequestError):
                raise refusal from None
            raise
        self._start(halted, [answer])

    async def requests(self) -> list[Request]:
        """Every outstanding request: parked in memory first (in arrival order), then
        stored (oldest save first)."""
        parked = self.inbox.pending() if self.inbox is not None else []
        seen = {r.id for r in parked}
        return parked + [r for r in await self.store.requests() if r.id not in seen]

    def _check_open(self, request_id: str) -> None:
        if self._tg is None:
            raise UsageError(
                f"request {request_id!r} belongs to a stored run; it resumes inside "
                "`async with host:`, which is not open"
            )

    def _start(self, halted: RunResult, answers: list[Answer]) -> None:
        tg = self._tg
        assert tg is not None
        self._driving.add(halted.run_id)
        tg.start_soon(self._resume, halted, answers, name=f"resume {halted.run_id}")

    async def _resume(self, halted: RunResult, answers: list[Answer]) -> None:
        try:
            result = await _resume_claimed(
                self.client,
                self.store,
                halted,
                answers,
                self.toolkit,
                keep=self.keep,
                state_after_tools=True,
            )
        except Exception:
            log.exception("resuming stored run %s failed; it was stored again", halted.run_id)
            return
        finally:
            self._driving.discard(halted.run_id)
        if self._on_result is not None:
            try:
                await call_hook(self._on_result, result)
            except Exception:
                log.exception("on_result raised for run %s", result.run_id)


async def resume_stored(
    client: LlmClient,
    toolkit: Toolkit,
    store: RunStore,
    answers: Answer | Iterable[Answer],
) -> RunResult:
    """Claim the run that the (first) answer belongs to, resume it, and store what remains.

    The run is claimed by the first answer's id; every answer must belong to that run
    (see :meth:`LlmClient.resume`). A result that halts again is saved under its new
    request ids, so it can be resumed the same way. A :class:`DurableHost` does this for
    every answer it is given.

    Raises:
        UnknownRequestError: no stored run waits for the first answer's id.
        AlreadyResumedError: another resume claimed it first; nothing was executed here.
        StoreError: the stored run cannot be read (it stays in the store), or a failed
            resume could not put it back (the message names the run).
        ModelError, RunTimeoutError, ...: the resume failed after the halted turn's tools ran
            (the model failed, the run timed out or was cancelled). The run is not put back:
            its answered calls ran and must not run again. A ``ModelError``'s ``.run``
            holds the state to continue from with ``client.run(None, toolkit,
            history=error.run.messages)``.
        AnswerMismatchError, ...: the resume failed before any tool ran; the claimed run was
            put back first, so it can be resumed again.
    """
    given = [answers] if isinstance(answers, Answer) else list(answers)
    if not given:
        raise UsageError("resume_stored needs at least one answer")
    halted = await store.claim(given[0].id)
    return await _resume_claimed(client, store, halted, given, toolkit, keep=store.save)


async def _resume_claimed(
    client: LlmClient,
    store: RunStore,
    halted: RunResult,
    answers: list[Answer],
    toolkit: Toolkit,
    *,
    keep: Callable[[RunResult], Any],
    state_after_tools: bool = False,
) -> RunResult:
    """Resume a run claimed from ``store``; put it back if it fails before its tools ran.

    ``keep`` saves a result that halted again. A failure after the tools ran is raised, or
    with ``state_after_tools`` (an exception, not a cancellation) logged and answered with
    the state to continue from (``error.run`` of a model error).
    """
    ran: list[RunResult] = []
    try:
        result = await client.resume(halted, toolkit, answers, on_tools_done=ran.append)
    except BaseException as exc:
        if ran:
            # The answered calls ran: putting the old state back would run them again (a
            # payment twice). The request is consumed.
            log.warning(
                "run %s failed after its tools ran (%s); not stored again",
                halted.run_id,
                type(exc).__name__,
            )
            if not state_after_tools or not isinstance(exc, Exception):
                raise
            return exc.run if isinstance(exc, ModelError) and exc.run is not None else ran[-1]
        # Shielded so that a cancelled resume still returns its run to the store.
        with anyio.CancelScope(shield=True):
            try:
                await store.save(halted)
            except Exception as put_back:
                log.error("run %s was claimed but could not be put back", halted.run_id)
                raise StoreError(
                    f"run {halted.run_id!r} could not be put back after its resume failed"
                    f" ({type(exc).__name__}: {exc}): {put_back}"
                ) from exc
        raise
    if result.status == "pending":
        await call_hook(keep, result)
    return result
