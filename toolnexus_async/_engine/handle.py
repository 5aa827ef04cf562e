"""``RunHandle``: a run you can hold while it goes: its id from the start, what it waits
on, its result, and a way to stop it.

Rules of this module:

- The run is one task, owned by the handle's own task group: it starts when the
  ``async with`` block is entered and never outlives the block. Leaving the block normally
  waits for the run to end (a task group's rule); leaving it by an exception, or
  :meth:`RunHandle.cancel`, cancels the run, which aborts the model request and the tool
  tasks and takes its parked requests out of an :class:`~toolnexus_async.Inbox`.
- The handle learns what the run waits on from the executor's step events (a suspended
  call, then its result), not from the resolver, so it is true for every ``wait_for``.
  Observing the steps does not stream the model's replies: the run is the one ``run``
  would do.
- A run that fails raises from :meth:`RunHandle.result`; when nobody asked for the result,
  from the end of the block instead, so a failure is never lost.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Generic, Literal, Self

import anyio
from anyio.abc import TaskGroup

from .._core.errors import RunCancelledError, UsageError
from .._core.results import OutputT, RunResult
from .._core.types import Request
from .streaming import Sink, StreamEvent, StreamPending, StreamToolResult

__all__ = ("HandleStatus", "RunHandle")

HandleStatus = Literal[
    "starting", "running", "waiting", "done", "pending", "incomplete", "cancelled", "failed"
]


class RunHandle(Generic[OutputT]):
    """A run started by :meth:`LlmClient.start`; use it as ``async with``.

    ``id`` is the run's id (the same ``RunResult.run_id`` and ``Inbox.run_of`` give).
    ``status`` is ``"running"``, ``"waiting"`` (a call is suspended on a request, see
    ``pending``), then the result's status (``"done"``, ``"pending"``, ``"incomplete"``),
    or ``"cancelled"`` or ``"failed"``.
    """

    def __init__(self, run_id: str, start: Callable[[Sink], Awaitable[RunResult[OutputT]]]) -> None:
        self._id = run_id
        self._start = start
        self._tg: TaskGroup | None = None
        self._scope = anyio.CancelScope()
        self._ended = anyio.Event()
        self._waiting: dict[str, Request] = {}  # call id -> request, while it is suspended
        self._result: RunResult[OutputT] | None = None
        self._failure: Exception | None = None
        self._failure_seen = False
        self._cancelled = False
        self._entered = False

    @property
    def id(self) -> str:
        """The run's id, known before the run has done anything."""
        return self._id

    @property
    def status(self) -> HandleStatus:
        """Where the run is now (see the class docstring)."""
        if self._result is not None:
            return self._result.status
        if self._failure is not None:
            return "failed"
        if self._cancelled:
            return "cancelled"
        if not self._entered:
            return "starting"
        return "waiting" if self._waiting else "running"

    @property
    def pending(self) -> tuple[Request, ...]:
        """The requests the run waits on now, in call order; once it has halted, the
        requests it halted on; otherwise empty."""
        if self._result is not None:
            return tuple(c.request for c in self._result.suspended if c.request is not None)
        return tuple(self._waiting.values())

    def done(self) -> bool:
        """Whether the run has ended (with a result, a failure, or cancelled)."""
        return self._ended.is_set()

    def cancel(self) -> None:
        """Stop the run if it is still going; :meth:`result` then raises
        :class:`RunCancelledError`. Idempotent."""
        self._scope.cancel()

    async def result(self) -> RunResult[OutputT]:
        """Wait for the run to end and return its :class:`RunResult`.

        Raises:
            RunCancelledError: the run was cancelled.
            UsageError: the handle was not entered with ``async with``.
            ModelError: or whatever else the run raised (as :meth:`LlmClient.run` would).
        """
        if not self._entered:
            raise UsageError("enter the handle first: `async with client.start(...) as run:`")
        await self._ended.wait()
        if self._failure is not None:
            self._failure_seen = True
            raise self._failure
        if self._result is None:
            raise RunCancelledError(f"run {self._id} was cancelled")
        return self._result

    def _observe(self, event: StreamEvent) -> None:
        if isinstance(event, StreamPending):
            self._waiting[event.call_id] = event.request
        elif isinstance(event, StreamToolResult):
            self._waiting.pop(event.id, None)

    async def _drive(self) -> None:
        try:
            with self._scope:
                try:
                    self._result = await self._start(self._observe)
                except Exception as exc:
                    # Kept and raised from result(): a task group would wrap it in a group.
                    self._failure = exc
        finally:
            if self._result is None and self._failure is None:
                self._cancelled = True
            self._waiting.clear()
            self._ended.set()

    async def __aenter__(self) -> Self:
        if self._entered:
            raise UsageError("a run handle can be entered once")
        self._entered = True
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._drive)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        tg, self._tg = self._tg, None
        if tg is None:
            return
        if exc is not None:
            # The block failed (or was cancelled): the run must not outlive it. The block's
            # exception goes on as it is, not wrapped in the task group's exception group.
            self.cancel()
        await tg.__aexit__(None, None, None)
        if exc is None and self._failure is not None and not self._failure_seen:
            self._failure_seen = True
            raise self._failure
