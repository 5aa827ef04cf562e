"""Parking: many suspended runs on one event loop, and the durable halt -> resume path.

Run it with ``nox -s bench`` or ``python benchmarks/park.py`` (``--help`` for the knobs,
``--quick`` for a smoke run of a few seconds). As in ``overhead.py``, every headline figure
is also given as a ratio against a floor measured in the same process, on the same event
loop, in the same minute.

The scenario (issue 3, item 4): an in-process model (``LlmClient.in_process``) whose first
reply calls one tool, ``pay_invoice(invoice)``; the tool asks for approval
(``ToolResult.pending(Request("req-<n>", "approval", ...))``); once approved it runs again
with ``ctx.answer`` set and the model answers with a text built from the tool's result, so
a lost or wrong wake-up shows up as a wrong answer, not as a fast run.

Part 1, *hot parking*: N runs (``--runs``, default 100,000) share one client whose
``wait_for`` is one ``Inbox``. Each run is a task of one ``asyncio.TaskGroup``
(``--spawner anyio`` uses an anyio task group instead). Measured:

- park: seconds from the first task started until ``len(inbox) == N``, and parks per second;
- memory: resident set size (``/proc/self/statm``, no tracemalloc) after ``gc.collect()``,
  before the first run starts and once all are parked; bytes per parked run. pymalloc's
  block count (``sys.getallocatedblocks``) is given too, as a cross-check independent of
  how the allocator returns memory to the system;
- wake latency, while the others are parked: a sample of runs (``--sample``, spread evenly
  over the N) is answered one at a time, each waited for; the latency is from just before
  ``inbox.answer()`` to the moment the tool runs again with ``ctx.answer`` set;
- wake all: ``inbox.answer()`` for every request still pending, back to back, then waiting
  for every run to finish: the ``answer()`` call rate and the rate until all runs are done,
  plus the latency of each wake in that burst (which includes the queue of the burst).

The floor does the same with no framework: a task per run puts a bare ``asyncio.Future``
in a dict under its request id, awaits it, then does the "tool" (records the wake, builds
the same text) and returns. Same spawner, same answers, same clock calls. The floor runs
first, so toolnexus starts from a heap the floor has mostly given back (the RSS after each
teardown is printed). The cyclic collector's runs and time during the parking and the burst
are printed too: with many runs parked, its full collections are much of the cost.

Part 2, *durable*: M runs (``--durable-runs``) on a client without ``wait_for``: each run
halts (``status == "pending"``) and is saved to a ``SqliteRunStore`` (a file in a temporary
directory); then each is answered with ``resume_stored(client, toolkit, store, answer)``
(claim, resume, done). One run at a time, so the figures are per-run latencies; p50 and p95
of halt+save and of claim+resume, and the bytes stored per halted run. ``MemoryRunStore``
does the same, interleaved run by run, as the floor.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    print_footer,
    print_header,
    rss_bytes,
    verdict,
)

from toolnexus_async import (
    Answer,
    Inbox,
    LlmClient,
    Request,
    RunResult,
    Tool,
    ToolContext,
    Toolkit,
    ToolResult,
    define_tool,
)

# Targets of issue 3, item 4 (2-core machine).
BYTES_TARGET = 5_000  # bytes of RSS per parked run, at most
PARK_RATE_TARGET = 20_000.0  # parks per second, at least
ANSWER_RATE_TARGET = 20_000.0  # answers per second, at least
P99_TARGET = 0.050  # seconds from answer() to the tool running again, at most


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
    """One way of parking N runs: start them, answer one, count the parked."""

    name = ""

    def __init__(self, probe: Probe) -> None:
        self.probe = probe

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
        self.inbox.answer(answer)

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


async def park_and_wake(
    make: Callable[[Probe], Contender], runs: int, sample_size: int, spawner: str
) -> HotFigures:
    figures = await _park_and_wake(make(Probe(runs)), runs, sample_size, spawner)
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
        # Polled, one loop iteration at a time: an Event would cost every run a call. A run
        # that ends without parking counts as a failure, so a broken build cannot hang here.
        while contender.parked() + len(contender.failures()) < runs:  # noqa: ASYNC110
            await asyncio.sleep(0)
        park_seconds = clock() - start
        park_gc = GC.since(gc_mark)
        if contender.failures():
            wrong = contender.failures()
            raise SystemExit(f"{contender.name}: {len(wrong)} runs did not park, e.g. {wrong[0]}")
        full_gc = timed_collect()
        parked = settle()

        # One at a time, each awaited, while the others stay parked.
        for n in sample:
            waiter: asyncio.Future[None] = loop.create_future()
            probe.waiters[n] = waiter
            probe.answered_at[n] = clock()
            contender.answer(Answer(request_id(n), True))
            await waiter
        sample_latency = probe.latencies(sample)

        # The burst: answer every request still pending, back to back, as a host would
        # (an Answer built per request, from the pending list).
        ids = contender.pending_ids()
        burst = [int(i.removeprefix("req-")) for i in ids]
        gc.collect()
        answered_at = probe.answered_at
        answer = contender.answer
        gc_mark = GC.mark()
        start = clock()
        for n, i in zip(burst, ids, strict=True):
            answered_at[n] = clock()
            answer(Answer(i, True))
        answer_seconds = clock() - start
    wake_all_seconds = clock() - start
    burst_gc = GC.since(gc_mark)

    failures = contender.failures()
    if failures:
        raise SystemExit(f"{contender.name}: {len(failures)} runs went wrong, e.g. {failures[0]}")
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


# --------------------------------------------------------------------------------------
# Part 2: durable halt -> save -> claim -> resume.


@dataclass
class DurableFigures:
    name: str
    halt: list[float] = field(default_factory=list)
    save: list[float] = field(default_factory=list)
    halt_save: list[float] = field(default_factory=list)
    claim_resume: list[float] = field(default_factory=list)

    def line(self, what: str, values: list[float]) -> str:
        s = sorted(values)
        return (
            f"    {what:<14} p50 {ms(percentile(s, 50))}  p95 {ms(percentile(s, 95))}"
            f"  mean {ms(statistics.fmean(s))}"
        )


async def durable(
    runs: int, directory: Path
) -> tuple[DurableFigures, DurableFigures, dict[str, float]]:
    from toolnexus_async.durable import MemoryRunStore, RunStore, SqliteRunStore, resume_stored

    client = LlmClient.in_process(approval_model)
    toolkit = Toolkit.create(builtins=False, extra_tools=[make_tool(None)])
    path = directory / "runs.sqlite"
    figures = [DurableFigures("SqliteRunStore"), DurableFigures("MemoryRunStore")]
    clock = time.perf_counter
    sizes: dict[str, float] = {}
    json_bytes: list[int] = []
    compact_bytes: list[int] = []
    async with SqliteRunStore(path) as sqlite_store, MemoryRunStore() as memory_store:
        stores: list[RunStore] = [sqlite_store, memory_store]
        # Warm-up: one run through each store, untimed (opens the file, warms the code).
        for store in stores:
            halted = await client.run(PROMPT.format(n=runs), toolkit)
            await store.save(halted)
            await resume_stored(client, toolkit, store, Answer(request_id(runs), True))
        gc.collect()
        pairs = list(zip(stores, figures, strict=True))
        for n in range(runs):
            # Alternate which store goes first, so neither always follows the other.
            for store, out in pairs if n % 2 == 0 else pairs[::-1]:
                start = clock()
                halted = await client.run(PROMPT.format(n=n), toolkit)
                middle = clock()
                await store.save(halted)
                end = clock()
                out.halt.append(middle - start)
                out.save.append(end - middle)
                out.halt_save.append(end - start)
                if halted.status != "pending":
                    raise SystemExit(f"run {n} did not halt: {halted.status}")
            payload = halted.to_dict()
            json_bytes.append(len(json.dumps(payload)))
            compact_bytes.append(
                len(json.dumps(payload, ensure_ascii=False, separators=(",", ":")))
            )
        db, wal, settled = file_sizes(path)
        sizes = {
            "json": statistics.fmean(json_bytes),
            "compact": statistics.fmean(compact_bytes),
            "db": db,
            "wal": wal,
            "settled": settled,
        }
        gc.collect()
        for n in range(runs):
            for store, out in pairs if n % 2 == 0 else pairs[::-1]:
                start = clock()
                result: RunResult = await resume_stored(
                    client, toolkit, store, Answer(request_id(n), True)
                )
                out.claim_resume.append(clock() - start)
                if result.status != "done" or result.text != expected_text(n):
                    raise SystemExit(f"resumed run {n} ended {result.status} {result.text!r}")
    return figures[0], figures[1], sizes


def file_sizes(path: Path) -> tuple[int, int, int]:
    """The SQLite file and its WAL as they are, then the file after a WAL checkpoint."""
    db = path.stat().st_size
    wal_path = Path(f"{path}-wal")
    wal = wal_path.stat().st_size if wal_path.exists() else 0
    # A second connection folds the WAL into the file, to see the settled size.
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return db, wal, path.stat().st_size


def durable_available() -> bool:
    try:
        import toolnexus_async.durable  # noqa: F401
    except ImportError:
        return False
    return True


# --------------------------------------------------------------------------------------
# The command line.


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="toolnexus_async: parking many runs on one Inbox, and durable resume."
    )
    parser.add_argument("--runs", type=int, default=100_000, help="runs parked at once")
    parser.add_argument(
        "--sample", type=int, default=1000, help="runs woken one at a time for the latency"
    )
    parser.add_argument(
        "--durable-runs", type=int, default=2000, help="runs through halt/save/claim/resume"
    )
    parser.add_argument(
        "--spawner",
        choices=("asyncio", "anyio"),
        default="asyncio",
        help="the task group the runs are started in (both contenders alike)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run of a few seconds (small sizes)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.sample, args.durable_runs = 2000, 200, 100
    for name in ("runs", "sample", "durable_runs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    args.sample = min(args.sample, args.runs)
    return args


def ratio_line(label: str, tn: float, floor: float, unit: str) -> str:
    return f"    {label:<22} {tn:>12,.1f} / {floor:>12,.1f} {unit:<10} = {tn / floor:.2f}"


async def main(args: argparse.Namespace) -> None:
    print_header("anyio", "aiosqlite", "SQLite")

    print(
        f"hot parking: {args.runs:,} runs parked on one Inbox ({args.spawner} task group), "
        f"{args.sample} woken one at a time, then the rest in one burst"
    )
    # The floor first: it leaves little behind, so toolnexus starts from a heap that is
    # nearly fresh (the RSS after each teardown is printed, to check that).
    floor = await park_and_wake(Floor, args.runs, args.sample, args.spawner)
    print_hot(floor)
    tn = await park_and_wake(Toolnexus, args.runs, args.sample, args.spawner)
    print_hot(tn)
    p99 = tn.sample.p99
    print("  toolnexus / floor:")
    print(ratio_line("bytes per parked run", tn.bytes_per_run, floor.bytes_per_run, "bytes"))
    print(ratio_line("pymalloc blocks/run", tn.blocks_per_run, floor.blocks_per_run, "blocks"))
    print(ratio_line("parks per second", tn.park_rate, floor.park_rate, "/s"))
    print(ratio_line("answer() calls/s", tn.answer_rate, floor.answer_rate, "/s"))
    print(ratio_line("wake all, runs done/s", tn.wake_all_rate, floor.wake_all_rate, "/s"))
    print(ratio_line("wake p99 (one at a time)", p99 * 1e6, floor.sample.p99 * 1e6, "us"))
    print("  targets (toolnexus_async):")
    print(
        f"    <= {BYTES_TARGET:,} bytes per parked run: {tn.bytes_per_run:,.0f}"
        f"   {verdict(tn.bytes_per_run <= BYTES_TARGET)}"
    )
    print(
        f"    >= {PARK_RATE_TARGET:,.0f} parks/s: {tn.park_rate:,.0f}"
        f"   {verdict(tn.park_rate >= PARK_RATE_TARGET)}"
    )
    print(
        f"    >= {ANSWER_RATE_TARGET:,.0f} answers/s: answer() calls {tn.answer_rate:,.0f}"
        f"   {verdict(tn.answer_rate >= ANSWER_RATE_TARGET)};"
        f" until all runs done {tn.wake_all_rate:,.0f}"
        f"   {verdict(tn.wake_all_rate >= ANSWER_RATE_TARGET)}"
    )
    print(
        f"    p99 wake < {P99_TARGET * 1000:g} ms while {args.runs:,} parked: {ms(p99)}"
        f"   {verdict(p99 < P99_TARGET)}"
    )
    print()

    if not durable_available():
        print("durable: toolnexus_async.durable is not available in this version; skipped")
    else:
        print(
            f"durable: {args.durable_runs:,} runs, one at a time, halt -> save -> claim -> resume,"
            " SqliteRunStore and MemoryRunStore interleaved run by run"
        )
        with tempfile.TemporaryDirectory(prefix="park-bench-") as tmp:
            sq, mem, sizes = await durable(args.durable_runs, Path(tmp))
        for f in (sq, mem):
            print(f"  {f.name}")
            print(f.line("halt (run)", f.halt))
            print(f.line("save", f.save))
            print(f.line("halt+save", f.halt_save))
            print(f.line("claim+resume", f.claim_resume))
        m = args.durable_runs
        print(
            f"  stored per halted run: json.dumps(run.to_dict()) {sizes['json']:,.0f} bytes"
            f" (compact, as stores write it: {sizes['compact']:,.0f});"
            f" SQLite file {sizes['db'] / m:,.0f} bytes/run + WAL {sizes['wal'] / m:,.0f}"
            f" bytes/run ({sizes['settled'] / m:,.0f} bytes/run after a checkpoint)"
        )
        print("  SqliteRunStore / MemoryRunStore:")
        for label, a, b in (
            ("halt+save p50", sq.halt_save, mem.halt_save),
            ("claim+resume p50", sq.claim_resume, mem.claim_resume),
        ):
            x, y = statistics.median(a), statistics.median(b)
            print(f"    {label:<22} {x * 1e6:8.1f} / {y * 1e6:8.1f} us = {x / y:.2f}")
    print_footer()


if __name__ == "__main__":
    anyio.run(main, parse_args(), backend="asyncio")
