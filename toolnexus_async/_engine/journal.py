"""What a durable host is told as a run goes, before the run goes further.

Rule of this module: a protocol and nothing else. A run with a journal (one driven by a
:class:`~toolnexus_async.durable.DurableHost`) awaits each of these calls at the moment it names,
so that what the journal keeps is never behind what anyone was told:

- :meth:`Journal.turn` when the model asked for tool calls, before any of them runs;
- :meth:`Journal.suspended` when a call raised a new request, before the request is
  announced (a stream's ``pending``, an inbox's listing) or waited for;
- :meth:`Journal.settled` when a call has the result the model will see, before the run
  feeds it to the model;
- :meth:`Journal.finished` when the run ends or halts, before its caller gets the result;
- :meth:`Journal.fence` before each tool execution: it returns once the run may go on
  (at once, or after a durable host proved it still holds the run).

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

    async def turn(self, loop: RunLoop) -> None: ...

    async def suspended(self, call: ToolCall, request: Request) -> None: ...

    async def settled(self, call: ToolCall, outcome: CallOutcome) -> None: ...

    async def finished(self, result: RunResult) -> None: ...

    async def fence(self) -> None: ...
