"""What a durable host is told as a run goes, before the run goes further.

Rule of this module: a protocol and nothing else. A run with a journal (one driven by a
:class:`~toolnexus_async.durable.DurableHost`) awaits each of these calls at the moment it names,
so that what the journal keeps is never behind what anyone was told:

- :meth:`Journal.turn` when the model asked for tool calls, before any of them runs. The
  journal may keep the turn to write it with what comes next, no later than the first of
  :meth:`Journal.fence`, :meth:`Journal.suspended` (then in the same transaction),
  :meth:`Journal.settled` and :meth:`Journal.finished` of that turn; with
  ``streamed=True`` (its calls are shown to a stream next) it is written before it
  returns;
- :meth:`Journal.suspended` when a call raised a new request, before the request is
  announced (a stream's ``pending``, an inbox's listing) or waited for;
- :meth:`Journal.settled` when a call has the result the model will see, before the run
  feeds it to the model;
- :meth:`Journal.finished` when the run ends or halts, before its caller gets the result;
- :meth:`Journal.fence` before each tool execution and each ``before_tool`` hook of the
  host's: it returns once the run may go on (the turn kept, and at once, or after a
  durable host proved it still holds the run). Only a ``require_approval`` gate's own
  verdict, which runs none of the host's hooks or tools, may come before it: a gate that
  asks has its turn written with its request.

A run without a journal (a plain ``client.run``) pays nothing for any of this.
"""

from __future__ import annotations

from typing import Protocol

from .._core.loop import CallOutcome, RunLoop
from .._core.messages import ToolCall
from .._core.results import RunResult
from .._core.types import Request

__all__ = ("Journal",)


class Journal(Protocol):
    """Where one run's progress is kept (see the module docstring for when each is called)."""

    async def turn(self, loop: RunLoop, *, streamed: bool = False) -> None: ...

    async def suspended(self, call: ToolCall, request: Request) -> None: ...

    async def settled(self, call: ToolCall, outcome: CallOutcome) -> None: ...

    async def finished(self, result: RunResult) -> None: ...

    async def fence(self) -> None: ...
