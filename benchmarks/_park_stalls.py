"""Part 3 of ``park.py``, loop stalls: how long the event loop stops with many runs parked.

Imported by ``park.py`` (run as a script, so this directory is on ``sys.path``); see its
docstring for what is measured and how.

The runs are the hot harness's (``_park_hot``), but they come as a server's would, a few
at a time: ``chunk`` runs are started, then the harness yields one loop iteration, and so
on; the answers come the same way. (The throughput parts start every run at once, so the
loop's first iteration alone runs every run's first step: a stall of the harness's own
making, seconds long at 100,000 runs.) A :class:`~_stall.LoopWatch` heartbeat measures
the phases: parking, idle (everything parked, nothing asked), answering (until every run
finished).
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from _park_hot import Contender, Probe, freezer_of, request_id
from _stall import LoopWatch, PhaseStalls

from toolnexus_async import Answer


@dataclass
class StallFigures:
    name: str
    lever: str  # "off" or "freeze"
    runs: int
    park_seconds: float
    done_seconds: float
    phases: list[PhaseStalls]

    def print(self) -> None:
        print(
            f"  {self.name}, gc lever {self.lever}: {self.runs:,} runs parked at"
            f" {self.runs / self.park_seconds:,.0f}/s and answered, all done at"
            f" {self.runs / self.done_seconds:,.0f}/s (paced)"
        )
        for phase in self.phases:
            print(f"    {phase.line()}")


async def stalls(
    make: Callable[[Probe], Contender],
    runs: int,
    *,
    lever: str,
    chunk: int,
    idle: float,
) -> StallFigures:
    """Park ``runs`` runs ``chunk`` at a time, stay idle ``idle`` seconds, answer them all
    ``chunk`` at a time, under a heartbeat; with ``lever == "freeze"`` a
    :class:`~toolnexus_async.suspend.GcFreezer` is active from the first run to the
    last."""
    contender = make(Probe(runs))
    freezer = freezer_of(lever)
    clock = time.perf_counter
    # Counted as each ends (not by asyncio.wait over all of them, whose bookkeeping for
    # 2 * runs tasks would be a stall of the harness's own).
    left = 2 * runs  # every run, and every answer
    all_done = asyncio.Event()

    async def counted(job: Coroutine[Any, Any, None]) -> None:
        nonlocal left
        try:
            await job
        finally:
            left -= 1
            if left == 0:
                all_done.set()

    async with contender, LoopWatch() as watch:
        gc.collect()
        if freezer is not None:
            freezer.start()
        try:
            async with asyncio.TaskGroup() as tg:
                with watch.phase("parking"):
                    start = clock()
                    for first in range(0, runs, chunk):
                        for n in range(first, min(runs, first + chunk)):
                            tg.create_task(counted(contender.run(n)))
                        await asyncio.sleep(0)
                    while contender.parked() + len(contender.failures()) < runs:  # noqa: ASYNC110
                        await asyncio.sleep(0.001)
                    park_seconds = clock() - start
                if contender.failures():
                    raise SystemExit(f"{contender.name}: runs did not park: {contender.failures()}")
                # In a thread: the durable check reads the whole file, a stall of its own.
                await asyncio.to_thread(contender.verify_parked, runs)
                with watch.phase("idle"):
                    await asyncio.sleep(idle)
                with watch.phase("answering"):
                    start = clock()
                    for first in range(0, runs, chunk):
                        for n in range(first, min(runs, first + chunk)):
                            answer = Answer(request_id(n), True)
                            tg.create_task(counted(contender.answer_one(answer)))
                        await asyncio.sleep(0)
                    await all_done.wait()  # every run done, every answer returned
                    done_seconds = clock() - start
        finally:
            if freezer is not None:
                freezer.stop()
    if contender.failures():
        raise SystemExit(f"{contender.name}: runs went wrong: {contender.failures()[:3]}")
    contender.verify_answered(runs)
    return StallFigures(contender.name, lever, runs, park_seconds, done_seconds, watch.phases)
