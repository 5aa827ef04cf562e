"""Several workers on one PostgreSQL database: answers per second, cross-worker wake latency.

Run it with ``nox -s bench -- workers`` or ``python benchmarks/workers.py`` (``--help``
for the knobs, ``--quick`` for a smoke run of a few seconds). As in the other benchmarks,
every headline figure is also given as a ratio, here against the same figure with one
worker, measured in the same run on the same database server.

The scenario is ``park.py``'s: an in-process model whose first reply calls
``pay_invoice(invoice)``; the tool asks for approval (``Request("req-<n>", "approval",
...)``); once approved it runs again and the model answers ``"Done: invoice <n> paid."``,
which is checked, so a lost or crossed wake-up shows up as a wrong answer.

The database is a throwaway PostgreSQL cluster the script starts itself (``tests/pg.py``'s:
``initdb`` into a temporary directory, a free port of 127.0.0.1) with ``fsync=on`` and
``synchronous_commit=on`` (``--fsync off`` for the tests' setting), so that a committed
suspension or answer is on disk. Each configuration gets a new database on it.

A configuration is K workers (``--workers``, default ``1,2,3``): K processes
(multiprocessing, spawn), each with an ``LlmClient.in_process`` parked in an ``Inbox`` and
a ``DurableHost`` (the library's defaults: lease 30 s, sweep 1 s, poll 0.5 s) over a
``PostgresRunStore`` of its own on that database, its pool of ``--pool`` connections
(default 10, the store's ``max_size``) opened before any clock starts. The parent steers
them over pipes, between measurements; every time is taken in the workers with
``time.perf_counter`` (``CLOCK_MONOTONIC``, one clock for every process of the machine).
Run n is started on worker ``n % K`` and answered through the next worker,
``(n % K + 1) % K``: always on another worker than the one holding it, unless K = 1.

For each configuration, after an untimed warm-up (``--warmup`` runs through the whole
cycle):

1. *park*: N runs (``--runs``, default 5,000), N/K started on each worker at once, each
   ``host.run`` in a task of its own, until every worker has all of its runs in its inbox
   (a request is there only once its suspension is committed): parks per second, from the
   first worker's start to the last worker's last park. Then the parent counts N pending
   requests in the database, untimed.
2. *wake*: ``--sample`` runs spread over the N, one at a time while the others stay
   parked: the next worker's ``host.answer`` (which returns once the answer is
   committed), then the holder is told (LISTEN/NOTIFY), hands the answer to its inbox and
   the tool runs again. The latency is from ``host.answer`` returned (committed) to the
   tool running on the holder, **the target's p99 (< 50 ms on loopback)**; also from
   just before ``host.answer`` was called.
3. *burst*: every run still parked is answered, each worker answering its neighbour's
   runs with ``--concurrency`` ``host.answer`` calls in flight (as a web server's handlers
   would be): committed answers per second (until the last ``host.answer`` returned) and
   runs done per second (until the last run finished on its holder, which is two more
   commits per run: the tool's result and the run's end). Then the parent counts N + the
   warm-up answered requests and done runs in the database.

For each phase the workers' CPU time (``time.process_time``) and the database server's
(the postmaster and its backends, from ``/proc``) are printed per run, to show which was
the limit. The cluster and every worker process are stopped at the end, also after an
error, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import multiprocessing
import multiprocessing.connection
import multiprocessing.context
import os
import signal
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
from _common import (
    PROMPT,
    add_postgres_options,
    approval_model,
    expected_text,
    print_footer,
    print_header,
    verdict,
)
from _park_hot import Latency, Probe, make_tool, ms, request_id

from toolnexus_async import Answer, Inbox, LlmClient, Toolkit
from toolnexus_async.durable import DurableHost, PostgresRunStore

# The parent's alone (the cluster, the checks), imported where used: every worker process
# imports this module too (spawn), and does without tests.pg and pytest.
if TYPE_CHECKING:
    from _pg import PgServer, ServerCpu

P99_TARGET = 0.050  # seconds from the answer committed on one worker to the tool on another
START_TIMEOUT = 60.0  # seconds a worker may take to open its store and say it is ready
PHASE_TIMEOUT = 900.0  # seconds a command may take before the worker counts as stuck


# --------------------------------------------------------------------------------------
# The worker: a process with a DurableHost, doing what the parent's messages say.


@dataclass(frozen=True)
class StoreSettings:
    """How each worker makes its ``PostgresRunStore`` (sent to it by pickle)."""

    dsn: str
    pool: int  # min_size = max_size: the pool is opened before any clock starts
    timeout: float  # command_timeout: how long one statement may take
    keep: int  # keep_finished: every ended run, so that the parent can count them


class WorkerSide:
    """One worker process: a host over its own store, its runs, and the commands.

    A command is ``(tag, name, args)`` on the pipe; ``cmd_<name>(*args)`` runs in a task
    of its own and its result goes back as ``(tag, result, None)``, or ``(tag, None,
    traceback)`` if it raised. ``"stop"`` (or the parent going away) ends the process.
    """

    def __init__(
        self, conn: multiprocessing.connection.Connection, settings: StoreSettings
    ) -> None:
        self.conn = conn
        self.probe = Probe(settings.keep)  # run n's wake-up is probe.woken_at[n]
        self.inbox = Inbox()
        self.client = LlmClient.in_process(approval_model, wait_for=self.inbox)
        self.toolkit = Toolkit.create(builtins=False, extra_tools=[make_tool(self.probe)])
        self.store = PostgresRunStore(
            settings.dsn,
            min_size=settings.pool,
            max_size=settings.pool,
            keep_finished=settings.keep,
            command_timeout=settings.timeout,
        )
        self.host: DurableHost | None = None
        self.tg: anyio.abc.TaskGroup | None = None
        self.done = 0
        self.last_done = math.nan
        self.wrong: list[str] = []
        self.stopped = asyncio.Event()

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        async with (
            self.store,
            DurableHost(self.client, self.toolkit, self.store) as host,
            anyio.create_task_group() as tg,
        ):
            self.host, self.tg = host, tg
            loop.add_reader(self.conn.fileno(), self.on_message)
            self.conn.send(("ready", os.getpid(), None))
            try:
                await self.stopped.wait()
            finally:
                loop.remove_reader(self.conn.fileno())
                tg.cancel_scope.cancel()

    def on_message(self) -> None:
        try:
            tag, name, args = self.conn.recv()
        except EOFError:  # the parent went away
            self.stopped.set()
            return
        if name == "stop":
            self.stopped.set()
            return
        assert self.tg is not None
        self.tg.start_soon(self.handle, tag, getattr(self, f"cmd_{name}"), args)

    async def handle(self, tag: int, command: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            result = await command(*args)
        except Exception:
            self.conn.send((tag, None, traceback.format_exc()))
        else:
            self.conn.send((tag, result, None))

    async def run(self, n: int) -> None:
        assert self.host is not None
        try:
            result = await self.host.run(PROMPT.format(n=n))
        except Exception as exc:
            self.wrong.append(f"run {n} raised {exc!r}")
            return
        if result.status == "done" and result.text == expected_text(n):
            self.done += 1
            self.last_done = time.perf_counter()
        else:
            self.wrong.append(f"run {n}: {result.status} {result.text!r}")

    async def until(self, ready: Callable[[], bool]) -> None:
        # Polled every millisecond: an Event per run would cost every run a call.
        while not ready():
            if self.wrong:
                raise RuntimeError(f"{len(self.wrong)} runs went wrong, e.g. {self.wrong[0]}")
            await asyncio.sleep(0.001)

    # -- the commands --------------------------------------------------------------------

    async def cmd_cpu(self) -> float:
        return time.process_time()

    async def cmd_park(self, runs: range) -> tuple[float, float]:
        """Start these runs, each in a task; return once all are parked (committed)."""
        assert self.tg is not None
        goal = len(self.inbox) + len(runs)
        start = time.perf_counter()
        for n in runs:
            self.tg.start_soon(self.run, n)
        await self.until(lambda: len(self.inbox) >= goal)
        return start, time.perf_counter()

    async def cmd_answer(self, runs: Sequence[int], concurrency: int) -> tuple[float, float]:
        """Answer these runs (held here or elsewhere), ``concurrency`` at a time."""
        assert self.host is not None
        answer = self.host.answer
        answers = iter([Answer(request_id(n), True) for n in runs])
        start = time.perf_counter()

        async def handler() -> None:
            for a in answers:
                await answer(a)

        async with anyio.create_task_group() as tg:
            for _ in range(concurrency):
                tg.start_soon(handler)
        return start, time.perf_counter()

    async def cmd_answer_one(self, n: int) -> tuple[float, float]:
        """Answer run n: the times just before ``host.answer`` and once it returned."""
        assert self.host is not None
        before = time.perf_counter()
        await self.host.answer(Answer(request_id(n), True))
        return before, time.perf_counter()

    async def cmd_woken(self, n: int) -> float:
        """When run n's tool ran again with its answer (waiting for it if need be)."""
        woken = self.probe.woken_at[n]
        if math.isnan(woken):
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.probe.waiters[n] = waiter
            await waiter
            woken = self.probe.woken_at[n]
        return woken

    async def cmd_done(self, total: int) -> float:
        """Once ``total`` runs have ended well here: when the last of them ended."""
        await self.until(lambda: self.done >= total)
        return self.last_done


def worker_main(conn: multiprocessing.connection.Connection, settings: StoreSettings) -> None:
    """The worker process's entry point (module level: spawn pickles it by name)."""
    # Ctrl-C reaches the whole process group; the parent stops the workers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    asyncio.run(WorkerSide(conn, settings).serve())


# --------------------------------------------------------------------------------------
# The parent's side of a worker.


class Worker:
    """A worker process and its pipe: ``send`` a command, ``result`` of it later."""

    def __init__(
        self, ctx: multiprocessing.context.SpawnContext, index: int, settings: StoreSettings
    ) -> None:
        self.index = index
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(
            target=worker_main, args=(child, settings), name=f"worker-{index}", daemon=True
        )
        self._child = child
        self._tags = itertools.count()
        self._replies: dict[int | str, tuple[Any, str | None]] = {}

    def start(self) -> None:
        self.process.start()
        self._child.close()  # the child has its own; EOF here once it is gone

    def ready(self) -> None:
        self.result("ready", START_TIMEOUT)

    def send(self, name: str, *args: Any) -> int:
        tag = next(self._tags)
        self.conn.send((tag, name, args))
        return tag

    def result(self, tag: int | str, timeout: float = PHASE_TIMEOUT) -> Any:
        deadline = time.monotonic() + timeout
        while tag not in self._replies:
            left = deadline - time.monotonic()
            try:
                if left <= 0 or not self.conn.poll(left):
                    raise SystemExit(f"worker {self.index} gave no answer in {timeout:.0f} s")
                got, value, error = self.conn.recv()
            except (EOFError, OSError):
                self.process.join(5)  # to have its exit code
                raise SystemExit(
                    f"worker {self.index} died (exit code {self.process.exitcode}; its"
                    " traceback, if any, is above)"
                ) from None
            self._replies[got] = (value, error)
        value, error = self._replies.pop(tag)
        if error is not None:
            raise SystemExit(f"worker {self.index} failed:\n{error}")
        return value

    def call(self, name: str, *args: Any) -> Any:
        return self.result(self.send(name, *args))

    def ask_to_stop(self) -> None:
        if self.process.is_alive():
            try:
                self.conn.send((-1, "stop", ()))
            except OSError:
                pass

    def stop(self, graceful: bool) -> None:
        """Wait for it to end (after ``ask_to_stop``) if ``graceful``; else, or if it
        takes too long, terminate it, then kill it."""
        if graceful:
            self.process.join(30)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


@contextmanager
def started(settings: StoreSettings, count: int) -> Iterator[list[Worker]]:
    """``count`` workers on one database, ready; stopped at the end, killed after an
    error."""
    ctx = multiprocessing.get_context("spawn")
    workers = [Worker(ctx, i, settings) for i in range(count)]
    graceful = False
    try:
        for w in workers:
            w.start()
        for w in workers:
            w.ready()
        yield workers
        graceful = True
    finally:
        begun = [w for w in workers if w.process.pid is not None]
        if graceful:
            for w in begun:
                w.ask_to_stop()  # all at once: they close their stores side by side
        for w in begun:
            w.stop(graceful)


def gather(
    workers: Sequence[Worker], name: str, args_of: Callable[[int], tuple[Any, ...]]
) -> list[Any]:
    """Send ``name`` to every worker at once (``args_of(index)``), then wait for each."""
    tags = [w.send(name, *args_of(w.index)) for w in workers]
    return [w.result(tag) for w, tag in zip(workers, tags, strict=True)]


# --------------------------------------------------------------------------------------
# One configuration: K workers, park, wake one at a time, burst.


@dataclass(frozen=True)
class Cpu:
    workers: float  # seconds, all workers together
    server: float  # seconds, the database server

    def per_run(self, runs: int) -> str:
        return (
            f"CPU per run: workers {self.workers / runs * 1e6:,.0f} us,"
            f" database server {self.server / runs * 1e6:,.0f} us"
        )


@dataclass(frozen=True)
class Figures:
    workers: int
    runs: int
    park_seconds: float
    park_cpu: Cpu
    wake_committed: Latency  # host.answer returned on one worker -> tool on the other
    wake_sent: Latency  # host.answer called -> tool on the other
    wake_min: float  # the least of wake_committed (the clocks are one clock)
    burst_runs: int
    answer_seconds: float
    done_seconds: float
    burst_cpu: Cpu

    @property
    def park_rate(self) -> float:
        return self.runs / self.park_seconds

    @property
    def answer_rate(self) -> float:
        return self.burst_runs / self.answer_seconds

    @property
    def done_rate(self) -> float:
        return self.burst_runs / self.done_seconds


class Meter:
    """CPU time of the workers and of the database server, between two readings."""

    def __init__(self, workers: Sequence[Worker], server: ServerCpu) -> None:
        self.workers = workers
        self.server = server
        self._mark = self._read()

    def _read(self) -> Cpu:
        return Cpu(sum(gather(self.workers, "cpu", lambda i: ())), self.server.seconds())

    def since(self) -> Cpu:
        now = self._read()
        spent = Cpu(now.workers - self._mark.workers, now.server - self._mark.server)
        self._mark = now
        return spent


def held_by(n: int, k: int) -> int:
    return n % k


def holding(i: int, k: int, first: int, end: int) -> range:
    """The runs of ``first`` up to ``end`` that worker ``i`` of ``k`` holds."""
    return range(first + (i - first) % k, end, k)


def answered_by(n: int, k: int) -> int:
    return (n % k + 1) % k


def check(dsn: str, what: str, table: str, status: str, expected: int) -> None:
    from _pg import committed

    found = asyncio.run(committed(dsn))
    if found[table].get(status, 0) != expected:
        raise SystemExit(f"{what}: expected {expected} {table} {status}, committed: {found}")


def configuration(server: PgServer, k: int, args: argparse.Namespace) -> Figures:
    from _pg import ServerCpu, create_database

    dsn = asyncio.run(create_database(server, f"workers_{k}"))
    warm, runs = args.warmup, args.runs
    size = warm + runs
    mine = list(range(warm, size))  # the measured runs, after the warm-up's
    settings = StoreSettings(dsn, args.pool, args.command_timeout, size)
    with started(settings, k) as workers:
        # Warm-up: the whole cycle, untimed (the code, the statements each connection
        # prepares, the server's caches).
        gather(workers, "park", lambda i: (holding(i, k, 0, warm),))
        gather(workers, "answer", lambda i: ([n for n in range(warm) if answered_by(n, k) == i], 8))
        gather(workers, "done", lambda i: (len(holding(i, k, 0, warm)),))

        meter = Meter(workers, ServerCpu(server))
        parked = gather(workers, "park", lambda i: (holding(i, k, warm, size),))
        park_seconds = max(end for _, end in parked) - min(start for start, _ in parked)
        park_cpu = meter.since()
        check(dsn, "after parking", "requests", "pending", runs)

        # One at a time, while the others stay parked.
        step = max(1, runs // args.sample)
        sample = mine[::step][: args.sample]
        committed_at: list[float] = []
        sent_at: list[float] = []
        woken_at: list[float] = []
        for n in sample:
            holder = workers[held_by(n, k)]
            woken = holder.send("woken", n)
            before, after = workers[answered_by(n, k)].call("answer_one", n)
            woken_at.append(holder.result(woken))
            sent_at.append(before)
            committed_at.append(after)
        wake = [w - c for w, c in zip(woken_at, committed_at, strict=True)]
        wake_min = min(wake)
        wake_committed = Latency.of(wake)
        wake_sent = Latency.of([w - s for w, s in zip(woken_at, sent_at, strict=True)])
        meter.since()

        # The burst: every run still parked, answered through its holder's neighbour.
        sampled = set(sample)
        rest = [n for n in mine if n not in sampled]
        answered = gather(
            workers,
            "answer",
            lambda i: ([n for n in rest if answered_by(n, k) == i], args.concurrency),
        )
        first = min(start for start, _ in answered)
        answer_seconds = max(end for _, end in answered) - first
        ends = gather(workers, "done", lambda i: (len(holding(i, k, 0, size)),))
        done_seconds = max(ends) - first
        burst_cpu = meter.since()
    check(dsn, "after the burst", "requests", "answered", size)
    check(dsn, "after the burst", "runs", "done", size)
    return Figures(
        workers=k,
        runs=runs,
        park_seconds=park_seconds,
        park_cpu=park_cpu,
        wake_committed=wake_committed,
        wake_sent=wake_sent,
        wake_min=wake_min,
        burst_runs=len(rest),
        answer_seconds=answer_seconds,
        done_seconds=done_seconds,
        burst_cpu=burst_cpu,
    )


def print_figures(f: Figures, args: argparse.Namespace) -> None:
    elsewhere = "on the next worker" if f.workers > 1 else "on the same worker (the only one)"
    print(f"  {f.workers} worker{'s' if f.workers > 1 else ''}")
    print(
        f"    park      {f.runs:,} runs in {f.park_seconds:.3f} s ="
        f" {f.park_rate:,.0f} committed parks/s; {f.park_cpu.per_run(f.runs)}"
    )
    c, s = f.wake_committed, f.wake_sent
    print(
        f"    wake one  answered {elsewhere}, committed -> tool running: p50 {ms(c.p50)}"
        f"  p99 {ms(c.p99)}  max {ms(c.max)}  min {ms(f.wake_min)}; from host.answer called:"
        f" p50 {ms(s.p50)}  p99 {ms(s.p99)}  (n={c.n})"
    )
    print(
        f"    burst     {f.burst_runs:,} answers ({args.concurrency} in flight per worker)"
        f" committed in {f.answer_seconds:.3f} s = {f.answer_rate:,.0f} answers/s;"
        f" all runs done after {f.done_seconds:.3f} s = {f.done_rate:,.0f} runs/s;"
        f" {f.burst_cpu.per_run(f.burst_runs)}"
    )


def ratio_line(label: str, x: float, base: float, unit: str) -> str:
    return f"    {label:<28} {x:>10,.1f} / {base:>10,.1f} {unit:<4} = {x / base:.2f}"


def print_ratios(f: Figures, base: Figures) -> None:
    print(f"  {f.workers} workers / {base.workers} worker:")
    print(ratio_line("committed parks per second", f.park_rate, base.park_rate, "/s"))
    print(ratio_line("committed answers per second", f.answer_rate, base.answer_rate, "/s"))
    print(ratio_line("runs done per second", f.done_rate, base.done_rate, "/s"))
    p99, base_p99 = f.wake_committed.p99 * 1e3, base.wake_committed.p99 * 1e3
    print(ratio_line("wake p99 (one at a time)", p99, base_p99, "ms"))


# --------------------------------------------------------------------------------------
# The command line.


def worker_counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of numbers: {text!r}") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError("worker counts must be at least 1")
    return counts


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="toolnexus_async: several DurableHost workers on one PostgreSQL database."
    )
    parser.add_argument(
        "--workers",
        type=worker_counts,
        default=None,
        help="the configurations, worker counts separated by commas (default 1,2,3, or 1,2"
        " with --quick; the first is the baseline of the ratios)",
    )
    parser.add_argument(
        "--runs", type=int, default=5_000, help="runs parked per configuration (default 5,000)"
    )
    parser.add_argument(
        "--sample",
        type=int,
        default=500,
        help="runs woken one at a time for the latency (default 500)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=100,
        help="host.answer calls in flight per worker in the burst (default 100)",
    )
    parser.add_argument("--warmup", type=int, default=200, help="untimed runs first (default 200)")
    add_postgres_options(parser, "each worker's store")
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run of a few seconds (small sizes)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.sample, args.warmup = 200, 20, 10
    if args.workers is None:
        args.workers = [1, 2] if args.quick else [1, 2, 3]
    for name in ("runs", "sample", "concurrency", "warmup", "pool"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    args.sample = min(args.sample, args.runs)
    return args


async def header(server: PgServer) -> None:
    # On an event loop like the workers' own, whose class the header names.
    from _pg import describe

    print_header("anyio", "asyncpg", database=await describe(server.dsn))


def main(args: argparse.Namespace) -> None:
    from _pg import throwaway_cluster

    with throwaway_cluster(fsync=args.fsync == "on") as server:
        asyncio.run(header(server))
        print(
            f"workers on one database: {args.runs:,} runs parked per configuration, started"
            f" on worker n % K and answered through the next one; {args.sample} woken one at"
            f" a time, then the rest in one burst; each worker's store has a pool of"
            f" {args.pool} and a command_timeout of {args.command_timeout:g} s"
            f" (fsync={args.fsync})"
        )
        results: list[Figures] = []
        for k in args.workers:
            figures = configuration(server, k, args)
            print_figures(figures, args)
            results.append(figures)
        base = results[0]
        for figures in results[1:]:
            print_ratios(figures, base)
        print("  target (wake one at a time, answer committed on one worker -> tool on another):")
        for f in results:
            if f.workers > 1:
                p99, bound = f.wake_committed.p99, f.wake_sent.p99
                print(
                    f"    p99 < {P99_TARGET * 1000:g} ms with {f.workers} workers: {ms(p99)}"
                    f"   {verdict(p99 < P99_TARGET)}; from host.answer called (an upper"
                    f" bound): {ms(bound)}   {verdict(bound < P99_TARGET)}"
                )
        print_footer()


if __name__ == "__main__":
    try:
        main(parse_args())
    except KeyboardInterrupt:
        raise SystemExit("interrupted: the workers and the cluster were stopped") from None
