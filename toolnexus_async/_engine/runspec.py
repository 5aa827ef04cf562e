"""A run as the engine drives it (:class:`RunSpec`), and the run deadline that human
waits may be kept out of (:class:`Budget`).

Rules of this module:

- A run is a value: its loop, its toolkit, the plan of a resume, its journal and who is
  told of its steps. Every front builds one and hands it to ``Engine.drive``.
- A :class:`Budget` pauses its cancel scope's deadline for exactly as long as someone is
  waited for (``count_wait_in_timeout=False``), however many calls wait at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import anyio
import attrs

from .._core.loop import RunLoop
from .._core.output import OutputSpec
from .._core.results import RunResult
from .._core.resume import ResumePlan
from .journal import Journal
from .streaming import Sink
from .toolkit import ToolRegistry

__all__ = ("Budget", "RunSpec")


@attrs.frozen
class RunSpec:
    """One run, as the engine drives it.

    Attributes:
        loop: the run's :class:`RunLoop` (a new run's, or a resumed one's).
        toolkit: the tools it may call.
        plan: for a resumed run, which call gets which answer (``None``: a new run).
        journal: where each step is kept before the run goes on (a durable run).
        stream: told every event, the model's text included (the request is streamed).
        observe: told the tool steps only (a suspended call, each result); the model's
            replies are not streamed. Ignored when ``stream`` is set.
        on_tools_done: called once a resumed turn's calls have run (see
            :meth:`LlmClient.resume`).
    """

    loop: RunLoop
    toolkit: ToolRegistry
    plan: ResumePlan | None = None
    journal: Journal | None = None
    stream: Sink | None = None
    observe: Sink | None = None
    on_tools_done: Callable[[RunResult], Any] | None = None

    @property
    def output(self) -> OutputSpec | None:
        """What the run's output must be (``None``: text). Kept by its loop, so that the
        loop's snapshot, which a durable run stores, carries it."""
        return self.loop.output


class Budget:
    """A run deadline that stops while someone is waited for (count_wait_in_timeout=False)."""

    __slots__ = ("_paused_at", "_saved", "_scope", "_waiting")

    def __init__(self, scope: anyio.CancelScope) -> None:
        self._scope = scope
        self._waiting = 0
        self._paused_at = 0.0
        self._saved = math.inf

    def pause(self) -> None:
        if self._waiting == 0:
            self._paused_at = anyio.current_time()
            self._saved = self._scope.deadline
            self._scope.deadline = math.inf
        self._waiting += 1

    def resume(self) -> None:
        self._waiting -= 1
        if self._waiting == 0:
            self._scope.deadline = self._saved + (anyio.current_time() - self._paused_at)
