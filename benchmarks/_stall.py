"""How long the event loop stalls: a heartbeat task, and the collector's pauses, per phase.

Not a benchmark itself; ``park.py`` uses it (and any benchmark may: it only needs a
running asyncio loop). The heartbeat sleeps ``interval`` seconds (1 ms by default) over
and over and records how late each wake-up is: the longest lateness in a phase is the
longest time anything else on the loop (a web request, a wake-up) could have waited then.
The cyclic collector's runs are timed through ``gc.callbacks`` too, so that a stall can be
told apart from (or put down to) a collection::

    async with LoopWatch() as watch:
        with watch.phase("parking"):
            ...  # anything, on this loop
        with watch.phase("idle"):
            await asyncio.sleep(2)
    for p in watch.phases:
        print(p.line())  # parking  longest stall 12.3 ms (...); gc 0.120 s, longest pause 9.1 ms

Each :class:`PhaseStalls` has ``longest`` (seconds), ``longest_at`` (seconds into the
phase), ``longest_cpu`` (the loop thread's CPU during that beat), ``over`` (beats later
than 50 ms), ``beats``, ``seconds`` and ``gc`` (:class:`GcPauses`: ``seconds``,
``longest``, ``full``, ``full_seconds``). A phase sees every beat that *ends* inside it.
The heartbeat costs about a thousand wake-ups per second, so do not run it while
measuring a throughput that must stay comparable with figures measured without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self

__all__ = ("GcPauses", "LoopWatch", "PhaseStalls")


class GcPauses:
    """Every collection's duration, by generation, while installed (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.seconds = 0.0  # all collections
        self.longest = 0.0  # the longest single collection
        self.full = 0  # generation-2 collections
        self.full_seconds = 0.0
        self._started = 0.0

    def install(self) -> None:
        gc.callbacks.append(self._callback)

    def remove(self) -> None:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        took = time.perf_counter() - self._started
        self.seconds += took
        self.longest = max(self.longest, took)
        if info["generation"] == 2:
            self.full += 1
            self.full_seconds += took


@dataclass
class PhaseStalls:
    """What one phase saw: the heartbeat's lateness and the collector's pauses."""

    name: str
    seconds: float = 0.0  # how long the phase lasted
    beats: int = 0
    longest: float = 0.0  # the heartbeat's longest lateness, seconds
    # The loop thread's CPU time during that beat: the part of the stall that was work
    # on the loop (the rest: the store's thread holding the GIL, or other processes
    # holding the CPU, which a loaded machine adds).
    longest_cpu: float = 0.0
    longest_at: float = 0.0  # when that beat ended, seconds into the phase
    started: float = 0.0  # perf_counter at the phase's start
    over: int = 0  # beats later than ``LoopWatch.late`` seconds
    gc: GcPauses = field(default_factory=GcPauses)

    def line(self) -> str:
        g = self.gc
        return (
            f"{self.name:<10} longest stall {self.longest * 1000:8.1f} ms"
            f" (at {self.longest_at:.2f} s, {self.longest_cpu * 1000:.1f} ms of it on the"
            " loop's CPU;"
            f" {self.over} beats over {LoopWatch.late * 1000:g} ms, of {self.beats:,} in"
            f" {self.seconds:.2f} s); gc {g.seconds:.3f} s, longest pause"
            f" {g.longest * 1000:.1f} ms, {g.full} full collections {g.full_seconds:.3f} s"
        )


class LoopWatch:
    """A heartbeat task on the running loop, and the phases it is measured in.

    ``async with`` starts the heartbeat and stops it; :meth:`phase` is a context manager
    that adds a :class:`PhaseStalls` to :attr:`phases`. Outside every phase the beats are
    not counted.
    """

    late = 0.050  # the threshold of ``over`` (the target of issue 17)

    def __init__(self, interval: float = 0.001) -> None:
        self.interval = interval
        self.phases: list[PhaseStalls] = []
        self._current: PhaseStalls | None = None
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        self._task = asyncio.get_running_loop().create_task(self._beat())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _beat(self) -> None:
        clock = time.perf_counter
        cpu = time.thread_time
        interval = self.interval
        while True:
            start, start_cpu = clock(), cpu()
            await asyncio.sleep(interval)
            lateness = clock() - start - interval
            current = self._current
            if current is not None:
                current.beats += 1
                if lateness > current.longest:
                    current.longest = lateness
                    current.longest_cpu = cpu() - start_cpu
                    current.longest_at = clock() - current.started
                if lateness > self.late:
                    current.over += 1

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[PhaseStalls]:
        """Count the beats and the collections of the block as the phase ``name``."""
        stalls = PhaseStalls(name, started=time.perf_counter())
        self.phases.append(stalls)
        self._current = stalls
        stalls.gc.install()
        try:
            yield stalls
        finally:
            stalls.seconds = time.perf_counter() - stalls.started
            stalls.gc.remove()
            if self._current is stalls:
                self._current = None

    def longest(self) -> float:
        """The longest stall of every phase so far."""
        return max((p.longest for p in self.phases), default=0.0)
