"""Parking: many suspended runs on one event loop, and the durable halt -> resume path.

Run it with ``nox -s bench`` or ``python benchmarks/park.py`` (``--help`` for the knobs,
``--quick`` for a smoke run of a few seconds, ``--store sqlite`` or ``--store postgres``
for durable parking too). As in ``overhead.py``, every headline figure is also given as a
ratio against a floor measured in the same process, on the same event loop, in the same
minute.

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

Part 1b, *durable parking* (``--store sqlite``): the same N runs, the same harness, but
each run goes through a ``DurableHost`` over a ``SqliteRunStore`` (a file in a temporary
directory, ``synchronous=FULL``), parked in the host's ``Inbox``. A request reaches the
inbox only after its suspension is committed, and ``host.answer`` returns only after the
answer is committed, so *parks per second* and *answers per second* count committed
suspensions and committed answers. The burst answers every run at once, each
``host.answer`` in a task of its own (as a web server's handlers would), and ends when all
of them returned. The harness polls every millisecond instead of every loop iteration (a
busy poll would hold the GIL the store's thread needs). After the parking and after the
burst, another connection to the file counts the committed requests, untimed. Every figure
is also given as a ratio to the in-memory toolnexus figures of the same process.

With ``--store postgres`` the store is a ``PostgresRunStore`` instead, on a throwaway
cluster the script starts itself (``tests/pg.py``'s: ``initdb`` into a temporary
directory, a free port of 127.0.0.1) with ``fsync=on`` (``--fsync off`` for the tests'
setting) and ``synchronous_commit=on``, its defaults, so that committed means on disk; its
pool holds ``--pool`` connections (default 10, the store's ``max_size``), all opened before
the clock starts, and its ``command_timeout`` is ``--command-timeout`` (default 30 s, the
store's own; it bounds each statement, and a write waits for a free connection as long as
it takes). The checks count
the committed requests over a connection of their own. The cluster is stopped and deleted
at the end, also after an error or Ctrl-C.

Part 1c, *the model over HTTP* (``--model http``, ``_park_http.py``): the same N runs, the
same harness and ``Inbox``, but ``LlmClient(base_url, style="openai")`` on the loopback mock
of ``overhead.py`` (its own process): two POSTs per run, the tool parking between them.
Besides part 1's figures: the sockets open while parked and their peak, the mock's CPU, a
bare-aiohttp floor for the HTTP part, and the ratios to part 1's toolnexus figures. The
client's pool is the transport's default (``--max-connections`` for another cap, ``none``
for none).

``--gc freeze`` runs toolnexus's contenders (not the floor) under a
``toolnexus_async.suspend.GcFreezer(young=0.005)`` (``--young`` for another pace, ``none``
for none), from the first run started to the last one done;
``--gc both`` runs each of them twice, without it and then with it, and gives each
durable figure's ratio, and each over-HTTP figure's, against the in-memory figure of the
same lever.

Part 3, *loop stalls* (on unless ``--no-stalls``; ``_park_stalls``): the same N runs
again (in memory, and durably with ``--store sqlite``), for each lever, but arriving as a
server's would: ``--chunk`` runs (default 10) are started, then the harness yields one
loop iteration, and so on; after ``--idle`` seconds (default 2) with all of them parked,
they are answered ``--chunk`` per iteration until every run is done. A heartbeat task
(``_stall.LoopWatch``) sleeps 1 ms over and over: its longest lateness in each phase
(parking, idle, answering) is the longest time the loop stopped, printed with the loop
thread's CPU time during that beat and with the collector's time and longest pause in
the phase (``gc.callbacks``). The target of issue 17 is a longest stall under 50 ms with
100,000 runs parked.

Part 2, *durable halt -> resume*: M runs (``--durable-runs``) on a client without
``wait_for``: each run halts (``status == "pending"``) and is saved to a ``SqliteRunStore``
(a file in a temporary directory); then each is answered with
``resume_stored(client, toolkit, store, answer)`` (claim, resume, done). One run at a
time, so the figures are per-run latencies; p50 and p95 of halt+save and of claim+resume,
and the bytes stored per halted run. ``MemoryRunStore`` does the same, interleaved run by
run, as the floor.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
from _common import add_postgres_options, print_footer, print_header, verdict
from _park_durable import Durable, durable, print_cpu, print_durable
from _park_hot import (
    YOUNG,
    Floor,
    HotFigures,
    Probe,
    Toolnexus,
    ms,
    park_and_wake,
    print_hot,
)
from _park_stalls import StallFigures, stalls

from toolnexus_async._io.transport import DEFAULT_MAX_CONNECTIONS

if TYPE_CHECKING:
    from _pg import PgServer

# Targets of issue 3, item 4 (2-core machine).
BYTES_TARGET = 5_000  # bytes of RSS per parked run, at most
PARK_RATE_TARGET = 20_000.0  # parks per second, at least
ANSWER_RATE_TARGET = 20_000.0  # answers per second, at least
P99_TARGET = 0.050  # seconds from answer() to the tool running again, at most
# Targets of issue 12 (durable parking, 2-core machine).
DURABLE_PARK_TARGET = 5_000.0  # committed parks per second, at least
DURABLE_PARK_RATIO = 0.25  # of the in-memory parks per second, at least
# Target of issue 17.
STALL_TARGET = 0.050  # seconds the event loop may stop, at most, with the runs parked


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
        "--store",
        choices=("memory", "sqlite", "postgres"),
        default="memory",
        help="sqlite, postgres: also park the runs durably, through a DurableHost (part 1b);"
        " postgres starts a throwaway cluster of its own",
    )
    parser.add_argument(
        "--synchronous",
        choices=("FULL", "NORMAL"),
        default="FULL",
        help="the SqliteRunStore's synchronous setting for --store sqlite (default FULL)",
    )
    parser.add_argument(
        "--gc",
        choices=("off", "freeze", "both"),
        default="off",
        help="the GC lever: freeze runs toolnexus's contenders under a GcFreezer; both runs"
        " each of them twice, without it and then with it (the floor never has it)",
    )
    parser.add_argument(
        "--young",
        default="0.005",
        help="the freeze lever's GcFreezer(young=...): seconds between paced young"
        " collections, or none (default 0.005)",
    )
    parser.add_argument(
        "--stalls",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="part 3, loop stalls: park, idle and answer the runs again, paced, under a"
        " heartbeat (default on)",
    )
    parser.add_argument(
        "--chunk", type=int, default=10, help="part 3: runs started (and answered) per loop turn"
    )
    parser.add_argument(
        "--idle", type=float, default=2.0, help="part 3: seconds everything stays parked"
    )
    add_postgres_options(parser, "the PostgresRunStore of --store postgres")
    parser.add_argument(
        "--model",
        choices=("in-process", "http"),
        default="in-process",
        help="http: also park the runs with the model behind HTTP, on a loopback mock"
        " (part 1c, _park_http.py)",
    )
    parser.add_argument(
        "--max-connections",
        default=str(DEFAULT_MAX_CONNECTIONS),
        help="--model http: the client's AiohttpTransport max_connections (a number, or none;"
        f" default {DEFAULT_MAX_CONNECTIONS}, the transport's own)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run of a few seconds (small sizes)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.sample, args.durable_runs, args.idle = 2000, 200, 100, 0.2
    for name in ("runs", "sample", "durable_runs", "pool", "chunk"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    args.sample = min(args.sample, args.runs)
    if args.young == "none":
        args.young = None
    else:
        try:
            args.young = float(args.young)
        except ValueError:
            parser.error("--young must be a number of seconds > 0, or none")
        if not args.young > 0:
            parser.error("--young must be a number of seconds > 0, or none")
    if args.max_connections == "none":
        args.max_connections = None
    elif not args.max_connections.isdigit() or int(args.max_connections) < 1:
        parser.error("--max-connections must be a number >= 1, or none")
    else:
        args.max_connections = int(args.max_connections)
    return args


def ratio_line(label: str, tn: float, floor: float, unit: str) -> str:
    return f"    {label:<22} {tn:>12,.1f} / {floor:>12,.1f} {unit:<10} = {tn / floor:.2f}"


def print_durable_ratios(kept: HotFigures, tn: HotFigures) -> None:
    print("  durable / in-memory (toolnexus_async, this process):")
    print(ratio_line("parks per second", kept.park_rate, tn.park_rate, "/s"))
    print(ratio_line("answers per second", kept.answer_rate, tn.answer_rate, "/s"))
    print(ratio_line("wake all, runs done/s", kept.wake_all_rate, tn.wake_all_rate, "/s"))
    print(ratio_line("bytes per parked run", kept.bytes_per_run, tn.bytes_per_run, "bytes"))
    print(ratio_line("wake p99 (one at a time)", kept.sample.p99 * 1e6, tn.sample.p99 * 1e6, "us"))
    ratio = kept.park_rate / tn.park_rate
    print("  targets (durable):")
    print(
        f"    >= {DURABLE_PARK_TARGET:,.0f} committed parks/s: {kept.park_rate:,.0f}"
        f"   {verdict(kept.park_rate >= DURABLE_PARK_TARGET)}"
    )
    print(
        f"    >= {DURABLE_PARK_RATIO:.2f} of the in-memory parks/s: {ratio:.2f}"
        f"   {verdict(ratio >= DURABLE_PARK_RATIO)}"
    )


def print_hot_targets(tn: HotFigures, floor: HotFigures, runs: int) -> None:
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
        f"    p99 wake < {P99_TARGET * 1000:g} ms while {runs:,} parked: {ms(p99)}"
        f"   {verdict(p99 < P99_TARGET)}"
    )


async def print_stalls(args: argparse.Namespace, levers: tuple[str, ...]) -> None:
    """Part 3: the longest loop stalls, paced parking, idle and answering, per lever."""
    print(
        f"loop stalls: {args.runs:,} runs started {args.chunk} per loop turn, {args.idle:g} s"
        f" idle, answered {args.chunk} per loop turn; a heartbeat task sleeps 1 ms and records"
        " its lateness"
    )
    found: list[StallFigures] = []
    for lever in levers:
        found.append(
            await stalls(Toolnexus, args.runs, lever=lever, chunk=args.chunk, idle=args.idle)
        )
        found[-1].print()
    if args.store == "sqlite":
        for lever in levers:
            with tempfile.TemporaryDirectory(prefix="park-bench-") as tmp:
                path = Path(tmp) / "runs.sqlite"
                found.append(
                    await stalls(
                        Durable.maker(path, args.synchronous),
                        args.runs,
                        lever=lever,
                        chunk=args.chunk,
                        idle=args.idle,
                    )
                )
            found[-1].print()
    print(f"  target (issue 17): longest stall < {STALL_TARGET * 1000:g} ms in every phase:")
    for f in found:
        worst = max(f.phases, key=lambda p: p.longest)
        print(
            f"    {f.name}, gc lever {f.lever}: {worst.longest * 1000:,.1f} ms ({worst.name};"
            f" {worst.longest_cpu * 1000:,.1f} ms of it on the loop's CPU)"
            f"   {verdict(worst.longest < STALL_TARGET)}"
        )
    print()


@contextlib.contextmanager
def database_server(args: argparse.Namespace) -> Iterator[PgServer | None]:
    """The throwaway PostgreSQL cluster of ``--store postgres``, or None."""
    if args.store != "postgres":
        yield None
        return
    from _pg import throwaway_cluster

    with throwaway_cluster(fsync=args.fsync == "on") as server:
        yield server


async def main(args: argparse.Namespace, server: PgServer | None = None) -> None:
    dsn: str | None = None
    server_cpu: Callable[[], float] | None = None
    if server is not None:
        from _pg import ServerCpu, create_database, describe

        dsn = await create_database(server, "park")
        server_cpu = ServerCpu(server).seconds
        print_header("anyio", "aiosqlite", "SQLite", "asyncpg", database=await describe(dsn))
    else:
        print_header("anyio", "aiosqlite", "SQLite")

    print(
        f"hot parking: {args.runs:,} runs parked on one Inbox ({args.spawner} task group), "
        f"{args.sample} woken one at a time, then the rest in one burst"
    )
    # The floor first: it leaves little behind, so toolnexus starts from a heap that is
    # nearly fresh (the RSS after each teardown is printed, to check that).
    levers = ("off", "freeze") if args.gc == "both" else (args.gc,)
    floor = await park_and_wake(Floor, args.runs, args.sample, args.spawner)
    print_hot(floor)
    in_memory: dict[str, HotFigures] = {}
    for lever in levers:
        tn = await park_and_wake(Toolnexus, args.runs, args.sample, args.spawner, lever)
        in_memory[lever] = tn
        print_hot(tn)
        print_hot_targets(tn, floor, args.runs)
    print()

    if args.model == "http":
        from _park_http import park_http

        targets = (BYTES_TARGET, PARK_RATE_TARGET, ANSWER_RATE_TARGET, P99_TARGET)
        for lever in levers:
            await park_http(
                args.runs,
                args.sample,
                args.spawner,
                args.max_connections,
                in_memory[lever],
                targets,
                lever,
            )
            print()

    if args.store == "sqlite":
        print(
            f"durable parking: the same {args.runs:,} runs through a DurableHost over a"
            f" SqliteRunStore (synchronous={args.synchronous}), every suspension and answer"
            " committed"
        )
        for lever in levers:
            with tempfile.TemporaryDirectory(prefix="park-bench-") as tmp:
                path = Path(tmp) / "runs.sqlite"
                kept = await park_and_wake(
                    Durable.maker(path, args.synchronous),
                    args.runs,
                    args.sample,
                    args.spawner,
                    lever,
                )
            print_hot(kept)
            print_durable_ratios(kept, in_memory[lever])
        print()

    if dsn is not None:
        print(
            f"durable parking: the same {args.runs:,} runs through a DurableHost over a"
            f" PostgresRunStore (pool of {args.pool}, command_timeout {args.command_timeout:g} s,"
            f" fsync={args.fsync}), every suspension and answer committed"
        )
        for lever in levers:
            made: list[Durable] = []

            def on_postgres(probe: Probe, dsn: str = dsn, made: list[Durable] = made) -> Durable:
                made.append(
                    Durable.postgres(probe, dsn, args.pool, args.command_timeout, server_cpu)
                )
                return made[-1]

            kept = await park_and_wake(on_postgres, args.runs, args.sample, args.spawner, lever)
            print_hot(kept)
            print_cpu(made[0], args.runs)
            print_durable_ratios(kept, in_memory[lever])
        print()

    if args.stalls:
        await print_stalls(args, levers)

    print(
        f"durable: {args.durable_runs:,} runs, one at a time, halt -> save -> claim -> resume,"
        " SqliteRunStore and MemoryRunStore interleaved run by run"
    )
    with tempfile.TemporaryDirectory(prefix="park-bench-") as tmp:
        print_durable(*await durable(args.durable_runs, Path(tmp)), args.durable_runs)
    print_footer()


if __name__ == "__main__":
    arguments = parse_args()
    YOUNG[0] = arguments.young
    # Started before the loop and stopped after it: the cluster outlives every run in it.
    with database_server(arguments) as pg:
        anyio.run(main, arguments, pg, backend="asyncio")
