"""Part 1 of ``park.py``, hot parking: the probe, the contenders, and the harness.

Imported by ``park.py`` (run as a script, so this directory is on ``sys.path``); see its
docstring for what is measured and how.
"""

from __future__ import annotations

import asyncio
import gc
import math
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Self

import anyio
import anyio.abc
from _common import (
    PROMPT,
    GcSpan,
    GcWatch,
    approval_model,
    expected_text,
    malloc_trim,
    percentile,
    rss_bytes,
)

from toolnexus_async import (
    Answer,
    Inbox,
    LlmClient,
    Request,
    Tool,
    ToolContext,
    Toolkit,
    ToolResult,
    define_tool,
)
from toolnexus_async.suspend import GcFreezer

# --------------------------------------------------------------------------------------
# The probe: where the tool (or the floor's stand-in) notes when it woke up.


@dataclass
class Probe:
    """Per-run clock readings, preallocated so that recording costs two list stores."""

    size: int
    answered_at: list[float] = field(init=False)
    woken_at: list[float] = field(init=False)
    # Runs whose wake-up someone awaits (the one-at-a-time sample): n -> future.
    waiters: dict[int, asyncio.Future[None]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.answered_at = [math.nan] * self.size
        self.woken_at = [math.nan] * self.size

    def woke(self, n: int) -> None:
        self.woken_at[n] = time.perf_counter()
        waiter = self.waiters.pop(n, None)
        if waiter is not None:
            waiter.set_result(None)

    def latencies(self, runs: list[int]) -> Latency:
        return Latency.of([self.woken_at[n] - self.answered_at[n] for n in runs])


@dataclass(frozen=True)
class Latency:
    """A few figures of a latency distribution (not the samples: they would pin memory)."""

    n: int
    p50: float
    p99: float
    max: float

    @classmethod
    def of(cls, seconds: list[float]) -> Latency:
        if any(math.isnan(x) for x in seconds):
            raise SystemExit("a run's wake-up was not recorded")
        seconds.sort()
        return cls(len(seconds), percentile(seconds, 50), percentile(seconds, 99), seconds[-1])


def request_id(n: int) -> str:
    return f"req-{n}"


# --------------------------------------------------------------------------------------
# The toolnexus side: one tool that asks approval (``_common.approval_model`` calls it once).


def make_tool(probe: Probe | None) -> Tool:
    @define_tool
    async def pay_invoice(invoice: int, ctx: ToolContext | None = None) -> ToolResult:
        """Pay an invoice; a human must approve the payment first.

        Args:
            invoice: the invoice number.
        """
        if ctx is None or ctx.answer is None:
            return ToolResult.pending(
                Request(request_id(invoice), "approval", f"Pay invoice {invoice}?")
            )
        if probe is not None:
            probe.woke(invoice)
        return ToolResult.ok(f"invoice {invoice} paid")

    return pay_invoice


# --------------------------------------------------------------------------------------
# Memory and clocks.


@dataclass
class Memory:
    rss: int  # bytes
    blocks: int  # pymalloc blocks in use


def settle() -> Memory:
    gc.collect()
    malloc_trim()
    return Memory(rss_bytes(), sys.getallocatedblocks())


GC = GcWatch()


def timed_collect() -> float:
    start = time.perf_counter()
    gc.collect()
    return time.perf_counter() - start


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f} ms"


# --------------------------------------------------------------------------------------
# Part 1: hot parking.


@dataclass
class HotFigures:
    name: str
    runs: int
    park_seconds: float
    before: Memory
    parked: Memory
    after: Memory  # after teardown (gc + malloc_trim): did the memory come back?
    full_gc_parked: float  # one gc.collect() with every run parked
    sample: Latency  # wake latencies, one at a time
    park_gc: GcSpan  # collections while parking
    burst_gc: GcSpan  # collections from the first answer of the burst to the last run done
    answer_seconds: float  # the answer() calls of the burst alone
    wake_all_seconds: float  # first answer of the burst until every run finished
    burst: Latency  # wake latencies within the burst
    burst_runs: int

    @property
    def park_rate(self) -> float:
        return self.runs / self.park_seconds

    @property
    def bytes_per_run(self) -> float:
        return (self.parked.rss - self.before.rss) / self.runs

    @property
    def blocks_per_run(self) -> float:
        return (self.parked.blocks - self.before.blocks) / self.runs

    @property
    def answer_rate(self) -> float:
        return self.burst_runs / self.answer_seconds

    @property
    def wake_all_rate(self) -> float:
        return self.burst_runs / self.wake_all_seconds


class Contender:
    """One way of parking N runs: start them, answer one, count the parked.

    An async context manager around its runs (the durable one opens its store there).
    """

    name = ""
    # Seconds between looks at ``parked()`` while the runs park; 0 is one loop iteration.
    poll = 0.0

    def __init__(self, probe: Probe) -> None:
        self.probe = probe

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def verify_parked(self, runs: int) -> None:
        """Raise SystemExit unless all ``runs`` are parked as they should be (untimed)."""

    def verify_answered(self, runs: int) -> None:
        """Raise SystemExit unless all ``runs`` were answered as they should be (untimed)."""

    async def answer_one(self, answer: Answer) -> None:
        """Answer one run (awaited: a durable answer returns once it is committed)."""
        self.answer(answer)

    async def burst(self, answers: list[tuple[int, Answer]]) -> None:
        """Answer these runs back to back, stamping each answer's time first."""
        answered_at = self.probe.answered_at
        answer = self.answer
        clock = time.perf_counter
        for n, a in answers:
            answered_at[n] = clock()
            answer(a)

    def run(self, n: int) -> Coroutine[Any, Any, None]:
        raise NotImplementedError

    def parked(self) -> int:
        raise NotImplementedError

    def pending_ids(self) -> list[str]:
        raise NotImplementedError

    def answer(self, answer: Answer) -> None:
        raise NotImplementedError

    def failures(self) -> list[str]:
        raise NotImplementedError


class Toolnexus(Contender):
    name = "toolnexus_async"

    def __init__(self, probe: Probe) -> None:
        super().__init__(probe)
        self.inbox = Inbox()
        self.client = LlmClient.in_process(approval_model, wait_for=self.inbox)
        self.toolkit = Toolkit.create(builtins=False, extra_tools=[make_tool(probe)])
        self.wrong: list[str] = []

    async def run(self, n: int) -> None:
        result = await self.client.run(PROMPT.format(n=n), self.toolkit)
        if result.status != "done" or result.text != expected_text(n):
            self.wrong.append(f"run {n}: {result.status} {result.text!r}")

    def parked(self) -> int:
        return len(self.inbox)

    def pending_ids(self) -> list[str]:
        return [request.id for request in self.inbox.pending()]

    def answer(self, answer: Answer) -> None:
        self.inbox.answer_nowait(answer)

    def failures(self) -> list[str]:
        return self.wrong


class Floor(Contender):
    """No framework: a future per run in a dict keyed by the request id."""

    name = "floor"

    def __init__(self, probe: Probe) -> None:
        super().__init__(probe)
        self.futures: dict[str, asyncio.Future[Answer]] = {}
        self.wrong: list[str] = []
        self.last_text = ""

    async def run(self, n: int) -> None:
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self.futures[request_id(n)] = future
        answer = await future
        if not answer.ok:
            self.wrong.append(f"run {n}: declined")
            return
        self.probe.woke(n)  # the "tool", run again with the answer
        self.last_text = expected_text(n)  # the "model's" final text

    def parked(self) -> int:
        return len(self.futures)

    def pending_ids(self) -> list[str]:
        return list(self.futures)

    def answer(self, answer: Answer) -> None:
        self.futures.pop(answer.id).set_result(answer)

    def failures(self) -> list[str]:
        return self.wrong


class Spawner:
    """Starts the runs as tasks of one task group (asyncio's or anyio's)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._asyncio: asyncio.TaskGroup | None = None
        self._anyio: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> Spawner:
        if self.kind == "anyio":
            self._anyio = anyio.create_task_group()
            await self._anyio.__aenter__()
        else:
            self._asyncio = asyncio.TaskGroup()
            await self._asyncio.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._anyio is not None:
            await self._anyio.__aexit__(*exc)
        elif self._asyncio is not None:
            await self._asyncio.__aexit__(*exc)

    def spawn(self, run: Callable[[int], Coroutine[Any, Any, None]], n: int) -> None:
        if self._anyio is not None:
            self._anyio.start_soon(run, n)
        else:
            assert self._asyncio is not None
            self._asyncio.create_task(run(n))


# ``park.py --young``: the seconds of ``GcFreezer(young=...)`` for the freeze lever.
YOUNG: list[float | None] = [0.005]


def freezer_of(lever: str) -> GcFreezer | None:
    """The lever's :class:`GcFreezer` (``"freeze"``), or None (``"off"``)."""
    return GcFreezer(young=YOUNG[0]) if lever == "freeze" else None


async def park_and_wake(
    make: Callable[[Probe], Contender],
    runs: int,
    sample_size: int,
    spawner: str,
    lever: str = "off",
) -> HotFigures:
    """``lever == "freeze"``: a :class:`GcFreezer` is active from the first run started
    to the last one done (``"off"``: the collector as CPython sets it)."""
    freezer = freezer_of(lever)
    async with make(Probe(runs)) as contender:
        if freezer is not None:
            freezer.start()
        try:
            figures = await _park_and_wake(contender, runs, sample_size, spawner)
        finally:
            if freezer is not None:
                freezer.stop()
    if freezer is not None:
        figures.name += ", gc lever freeze"
    # Everything the runs used is garbage now: does the memory come back?
    figures.after = settle()
    return figures


async def _park_and_wake(
    contender: Contender, runs: int, sample_size: int, spawner: str
) -> HotFigures:
    probe = contender.probe
    step = max(1, runs // sample_size)
    sample = list(range(0, runs, step))[:sample_size]
    clock = time.perf_counter
    loop = asyncio.get_running_loop()

    before = settle()
    async with Spawner(spawner) as group:
        gc_mark = GC.mark()
        start = clock()
        for n in range(runs):
            group.spawn(contender.run, n)
        # Polled (an Event would cost every run a call), one loop iteration at a time unless
        # the contender says otherwise. A run that ends without parking counts as a
        # failure, so a broken build cannot hang here.
        poll = contender.poll
        while contender.parked() + len(contender.failures()) < runs:  # noqa: ASYNC110
            await asyncio.sleep(poll)
        park_seconds = clock() - start
        park_gc = GC.since(gc_mark)
        if contender.failures():
            wrong = contender.failures()
            raise SystemExit(f"{contender.name}: {len(wrong)} runs did not park, e.g. {wrong[0]}")
        full_gc = timed_collect()
        parked = settle()
        contender.verify_parked(runs)

        # One at a time, each awaited, while the others stay parked.
        for n in sample:
            waiter: asyncio.Future[None] = loop.create_future()
            probe.waiters[n] = waiter
            probe.answered_at[n] = clock()
            await contender.answer_one(Answer(request_id(n), True))
            await waiter
        sample_latency = probe.latencies(sample)

        # The burst: answer every request still pending, back to back, as a host would
        # (an Answer built per request, from the pending list).
        ids = contender.pending_ids()
        burst = [int(i.removeprefix("req-")) for i in ids]
        answers = [(n, Answer(i, True)) for n, i in zip(burst, ids, strict=True)]
        gc.collect()
        gc_mark = GC.mark()
        start = clock()
        await contender.burst(answers)
        answer_seconds = clock() - start
    wake_all_seconds = clock() - start
    burst_gc = GC.since(gc_mark)

    failures = contender.failures()
    if failures:
        raise SystemExit(f"{contender.name}: {len(failures)} runs went wrong, e.g. {failures[0]}")
    contender.verify_answered(runs)
    return HotFigures(
        name=contender.name,
        runs=runs,
        park_seconds=park_seconds,
        before=before,
        parked=parked,
        after=parked,  # replaced by the caller once all of this is garbage
        full_gc_parked=full_gc,
        sample=sample_latency,
        park_gc=park_gc,
        burst_gc=burst_gc,
        answer_seconds=answer_seconds,
        wake_all_seconds=wake_all_seconds,
        burst=probe.latencies(burst),
        burst_runs=len(burst),
    )


def print_hot(f: HotFigures) -> None:
    mb = 1024 * 1024
    print(f"  {f.name}")
    print(
        f"    park      {f.runs} runs in {f.park_seconds:.3f} s = {f.park_rate:,.0f} parks/s"
        f"   ({f.park_gc.text()})"
    )
    print(
        f"    memory    RSS {f.before.rss / mb:.1f} -> {f.parked.rss / mb:.1f} MiB parked"
        f" ({f.after.rss / mb:.1f} after teardown, pymalloc blocks"
        f" {f.after.blocks - f.before.blocks:+,} on the start) = {f.bytes_per_run:,.0f} bytes/run;"
        f" pymalloc blocks {f.blocks_per_run:.1f}/run;"
        f" one full gc.collect() while parked {ms(f.full_gc_parked)}"
    )
    s = f.sample
    print(
        f"    wake one  p50 {ms(s.p50)}  p99 {ms(s.p99)}  max {ms(s.max)}"
        f"  (n={s.n}, one at a time, ~{f.runs} parked)"
    )
    print(
        f"    wake all  {f.burst_runs} answer() calls in {f.answer_seconds:.3f} s"
        f" = {f.answer_rate:,.0f} answers/s; all runs done after {f.wake_all_seconds:.3f} s"
        f" = {f.wake_all_rate:,.0f} runs/s   ({f.burst_gc.text()})"
    )
    b = f.burst
    print(
        f"    in burst  wake p50 {ms(b.p50)}  p99 {ms(b.p99)}  max {ms(b.max)}"
        "  (includes the queue of the whole burst)"
    )
