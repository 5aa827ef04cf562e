"""``BegunRun``: a run a durable host has kept in its store and not started yet.

Rule of this module: a begun run is started once, by :meth:`BegunRun.run`,
:meth:`BegunRun.stream` or (serve's) ``_run_with``, and driven by the host that began it
(which owns the store's lease on it); it holds nothing of its own but the run's loop and journal.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from .._errors import UsageError
from .._loop import RunLoop
from .._results import RunResult
from .._streaming import RunStream, Sink
from ._journal import RunJournal

if TYPE_CHECKING:
    from ._host import DurableHost

__all__ = ("BegunRun",)


class BegunRun:
    """A run kept in the store and not started yet (see :meth:`DurableHost.begin`)."""

    __slots__ = ("_host", "_journal", "_loop", "_used")

    def __init__(self, host: DurableHost, loop: RunLoop, journal: RunJournal) -> None:
        self._host = host
        self._loop = loop
        self._journal = journal
        self._used = False

    @property
    def run_id(self) -> str:
        return self._journal.run_id

    def _take(self) -> RunLoop:
        if self._used:
            raise UsageError(f"run {self.run_id!r} was started already")
        self._used = True
        return self._loop

    async def run(self) -> RunResult:
        """Run it to its end, as :meth:`DurableHost.run` does."""
        return await self._host._drive(self._take(), self._journal)

    def stream(self) -> RunStream:
        """Run it, reported step by step, as :meth:`DurableHost.stream` does."""
        loop, host, journal = self._take(), self._host, self._journal

        async def start(sink: Sink) -> RunResult:
            return await host._drive(loop, journal, sink=sink)

        return RunStream(start)

    def _run_with(self, sink: Sink) -> Coroutine[Any, Any, RunResult]:
        """Run it, handing ``sink`` each event its stream would carry but the last (the
        result is returned). For ``serve``, whose every run reports to the event bus: a
        stream's task, task group and channel would be kept by every parked run, and so
        would a frame of this method's (it hands back the host's coroutine instead)."""
        return self._host._drive(self._take(), self._journal, sink=sink)
