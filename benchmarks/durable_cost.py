"""What a durable run costs on PostgreSQL against SQLite, side by side (issue 41).

Run it with ``python benchmarks/durable_cost.py`` (``--help`` for the knobs, ``--quick``
for a smoke run). One process drives a ``DurableHost`` the way ``serve`` does, without
HTTP: N runs (``--runs``, default 800), at most ``--concurrency`` (default 200) at a time,
each ``host.begin`` (committed before it would be acknowledged), then driven: the model
(in process) calls ``pay_invoice``, which asks for approval, and the run parks in the
host's ``Inbox`` once its suspension committed. When all N are parked, each is answered
through ``host.answer`` (committed before it returns; the same worker: no other worker is
needed), at most ``--concurrency`` at a time, and the run goes on to its end, its text
checked. The figures of a round: **runs done per second** (N over the time from the first
``begin`` to the last run done) and **this process's CPU time per run**
(``time.process_time``: less noisy than wall time on a loaded machine); for PostgreSQL also
the database server's CPU per run (the postmaster and its backends, from ``/proc``) and the
**write transactions per run** (transaction ids the cluster assigned meanwhile: every
transaction that writes a row or sends a NOTIFY takes one).

The contenders are ``SqliteRunStore`` (``synchronous=FULL``, a new file per round) and
``PostgresRunStore`` (a new schema per round on a throwaway cluster with ``fsync=on``, pool
of ``--pool``), in ``--rounds`` rounds, alternated (SQLite first in even rounds), and the
ratios PostgreSQL / SQLite are of the same round.

``--gate``: the approval is asked by a ``require_approval`` gate before the tool runs (the
tool itself asks nothing), so a run's turn is written with its request, in one transaction.

``--listeners 1,10,100`` adds a second part: PostgreSQL alone, with K idle connections
LISTENing as K idle workers of this release do (each on its own worker channel; with a
release that had none, on the one channel every worker heard), K = each value, alternated
over the rounds; ``--listen-runs`` runs a round (default 200), ``--listen-concurrency``
at a time (default 1: one run at a time, so no run shares a transaction with another and
every notifying commit is its own). Reported per run: the database server's CPU, this
process's CPU (the worker's and the K connections'), and the notifications each idle
listener received.

``--answer-elsewhere`` runs each K round twice, alternated: answered on the worker holding
the run, as above, and answered on another worker (a second ``DurableHost`` with its own
pool on the same schema, in this process), which commits the answer and notifies the
holder's channel, as a worker behind a load balancer does for most answers (after the
round, untimed, every answer's audit record is checked to name that worker).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import anyio
from _common import PROMPT, approval_model, expected_text, print_footer, print_header
from _park_hot import make_tool, request_id
from _pg import ServerCpu, create_database, describe, next_xid, throwaway_cluster

from toolnexus_async import (
    Answer,
    Hooks,
    Inbox,
    LlmClient,
    Toolkit,
    ToolResult,
    define_tool,
    require_approval,
)
from toolnexus_async.durable import DurableHost, PostgresRunStore, RunStore, SqliteRunStore

# The worker channels of issue 41; before them, every worker LISTENed on the one channel.
channel_of: Callable[[str], str] | None
try:
    from toolnexus_async.durable.postgres._ops import owner_channel as channel_of
except ImportError:
    channel_of = None


@dataclass
class Round:
    store: str
    runs: int
    seconds: float
    cpu: float  # this process, seconds
    server_cpu: float = 0.0  # the database server, seconds
    xids: int = 0
    heard: float = 0.0  # notifications per idle listener

    def rate(self) -> float:
        return self.runs / self.seconds

    def per_run_us(self, seconds: float) -> float:
        return seconds / self.runs * 1e6


@define_tool(name="pay_invoice")
async def gated_pay_invoice(invoice: int) -> ToolResult:
    """Pay an invoice; a human must approve the payment first.

    Args:
        invoice: the invoice number.
    """
    return ToolResult.ok(f"invoice {invoice} paid")


async def drive(
    store: RunStore,
    runs: int,
    concurrency: int,
    gate: bool = False,
    answerer: RunStore | None = None,
) -> tuple[float, float]:
    """N runs begun, parked, answered and done through one host; (seconds, CPU seconds).
    ``gate``: the approval is asked by a ``require_approval`` gate, not by the tool.
    ``answerer``: the answers are taken by a second host on that store (another worker)."""
    inbox = Inbox()
    hooks = Hooks(before_tool=require_approval(["pay_invoice"])) if gate else None
    client = LlmClient.in_process(approval_model, wait_for=inbox, hooks=hooks)
    tool = gated_pay_invoice if gate else make_tool(None)
    toolkit = Toolkit.create(builtins=False, extra_tools=[tool])
    ids: list[str] = []  # a gate's requests, by invoice (their ids are generated)
    run_ids: list[str] = []
    wrong: list[str] = []
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(client)
        await stack.enter_async_context(toolkit)
        host = await stack.enter_async_context(DurableHost(client, toolkit, store))
        answering = host
        if answerer is not None:
            answering = await stack.enter_async_context(DurableHost(client, toolkit, answerer))
        parked = anyio.Event()
        finished = anyio.Event()
        done = 0

        async def one(n: int, slots: anyio.Semaphore) -> None:
            nonlocal done
            async with slots:
                begun = await host.begin(PROMPT.format(n=n))
            run_ids.append(begun.run_id)
            result = await begun.run()
            if result.status != "done" or result.text != expected_text(n):
                wrong.append(f"run {n}: {result.status} {result.text!r}")
            done += 1
            if done == runs:
                finished.set()

        async def answer(n: int, slots: anyio.Semaphore) -> None:
            async with slots:
                await answering.answer(Answer(ids[n] if gate else request_id(n), True))

        def watch_parked() -> None:
            if len(inbox) == runs:
                parked.set()

        slots = anyio.Semaphore(concurrency)
        cpu, start = time.process_time(), time.perf_counter()
        async with anyio.create_task_group() as tg:
            for n in range(runs):
                tg.start_soon(one, n, slots)
            while len(inbox) < runs:  # parked: in the inbox once its suspension committed
                await asyncio.sleep(0.002)
                watch_parked()
            if gate:
                by_invoice = {(r.data or {})["arguments"]["invoice"]: r.id for r in inbox.pending()}
                ids.extend(by_invoice[n] for n in range(runs))
            for n in range(runs):
                tg.start_soon(answer, n, slots)
            await finished.wait()
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        if answering is not host:  # untimed: every answer was the other worker's to take
            takers = {a.worker for run_id in run_ids for a in await store.answers(run_id)}
            if takers != {answering.worker}:
                wrong.append(
                    f"answers taken by {sorted(map(str, takers))}, not all by the other"
                    f" worker {answering.worker!r}"
                )
    if wrong:  # raised once the hosts are closed: a plain message, not a group's traceback
        raise SystemExit(f"{len(wrong)} checks failed, the first: {wrong[0]}")
    return seconds, cpu


async def sqlite_round(directory: Path, n: int, args: argparse.Namespace) -> Round:
    store = SqliteRunStore(directory / f"round{n}.sqlite", keep_finished=args.runs)
    async with store:
        seconds, cpu = await drive(store, args.runs, args.concurrency, args.gate)
    return Round("SQLite", args.runs, seconds, cpu)


async def postgres_round(
    dsn: str,
    n: int,
    args: argparse.Namespace,
    server: ServerCpu,
    listeners: int = 0,
    elsewhere: bool = False,
) -> Round:
    import asyncpg

    schema = f"round{n}_k{listeners}{'_elsewhere' if elsewhere else ''}"
    store = PostgresRunStore(
        dsn, schema=schema, min_size=args.pool, max_size=args.pool, keep_finished=args.runs
    )
    # Another worker's own pool on the same schema: it takes the answers.
    other = PostgresRunStore(dsn, schema=schema, max_size=args.pool) if elsewhere else None
    idle: list[Any] = []
    heard = [0]

    def count(*_: Any) -> None:
        heard[0] += 1

    try:
        for i in range(listeners):
            conn = await asyncpg.connect(dsn)
            idle.append(conn)
            channel = "toolnexus_run_store" if channel_of is None else channel_of(f"idle{i}")
            await conn.add_listener(channel, count)
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(store)
            if other is not None:
                await stack.enter_async_context(other)
            xid, server_cpu = await next_xid(dsn), server.seconds()
            seconds, cpu = await drive(store, args.runs, args.concurrency, args.gate, other)
            xids, server_cpu = await next_xid(dsn) - xid - 1, server.seconds() - server_cpu
    finally:
        for conn in idle:
            await conn.close()
    per_listener = heard[0] / listeners if listeners else 0.0
    return Round("PostgreSQL", args.runs, seconds, cpu, server_cpu, xids, per_listener)


def show(r: Round) -> str:
    worker = r.per_run_us(r.cpu)
    line = f"{r.store:<10} {r.rate():8,.0f} runs done/s   CPU/run: worker {worker:6,.0f} us"
    if r.store == "PostgreSQL":
        line += (
            f", database {r.per_run_us(r.server_cpu):6,.0f} us;"
            f" write transactions/run {r.xids / r.runs:.2f}"
        )
    return line


async def main(args: argparse.Namespace) -> None:
    with (
        throwaway_cluster(fsync=args.fsync == "on") as server,
        tempfile.TemporaryDirectory() as tmp,
    ):
        dsn = await create_database(server, "bench")
        print_header("anyio", "asyncpg", "SQLite", database=await describe(dsn))
        cpu = ServerCpu(server)
        directory = Path(tmp)
        # Warm: each store once, untimed.
        await sqlite_round(directory, 99, _small(args))
        await postgres_round(dsn, 99, _small(args), cpu)
        print(f"side by side, {args.runs} runs a round, {args.concurrency} at a time:")
        ratios: list[tuple[float, float]] = []
        for n in range(args.rounds):
            order: list[Callable[[], Any]] = [
                partial(sqlite_round, directory, n, args),
                partial(postgres_round, dsn, n, args, cpu),
            ]
            if n % 2:
                order.reverse()
            got = {}
            for make in order:
                r = await make()
                got[r.store] = r
                print(f"  round {n + 1}: {show(r)}")
            pg, sq = got["PostgreSQL"], got["SQLite"]
            ratio = (pg.rate() / sq.rate(), pg.cpu / sq.cpu)
            ratios.append(ratio)
            print(
                f"  round {n + 1}: PostgreSQL / SQLite: runs done/s {ratio[0]:.2f}"
                f" (target >= 0.6), worker CPU per run {ratio[1]:.2f} (target <= 1.5)"
            )
        if args.listeners:
            ks = [int(k) for k in args.listeners.split(",")]
            where = "all on the one channel" if channel_of is None else "each on its own channel"
            print(
                f"\nPostgreSQL with K idle listeners ({where}), {args.listen_runs} runs a"
                f" round, {args.listen_concurrency} at a time (the listeners are connections of"
                " this process: their CPU counts as the worker's):"
            )
            alone = argparse.Namespace(
                **{**vars(args), "runs": args.listen_runs, "concurrency": args.listen_concurrency}
            )
            places = (False, True) if args.answer_elsewhere else (False,)
            for n in range(args.rounds):
                for k in ks if n % 2 == 0 else ks[::-1]:
                    for elsewhere in places if n % 2 == 0 else places[::-1]:
                        r = await postgres_round(dsn, 100 + n, alone, cpu, k, elsewhere)
                        where = "another worker" if elsewhere else "the holder"
                        place = f", answered on {where}" if args.answer_elsewhere else ""
                        print(
                            f"  round {n + 1}, K = {k:>3}{place}: {show(r)};"
                            f" notifications per idle listener per run {r.heard / r.runs:.3f}"
                        )
        print_footer()


def _small(args: argparse.Namespace) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), "runs": 50})


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=800, help="runs per round (default 800)")
    parser.add_argument("--concurrency", type=int, default=200, help="in flight (default 200)")
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds (default 3)")
    parser.add_argument("--pool", type=int, default=10, help="PostgreSQL pool (default 10)")
    parser.add_argument("--fsync", choices=("on", "off"), default="on")
    parser.add_argument(
        "--listeners", default="", help="K idle listeners, e.g. 1,10,100 (default: none)"
    )
    parser.add_argument(
        "--listen-runs", type=int, default=200, help="runs per K round (default 200)"
    )
    parser.add_argument(
        "--listen-concurrency",
        type=int,
        default=1,
        help="runs at a time in the K rounds (default 1: no run shares a transaction)",
    )
    parser.add_argument(
        "--gate",
        action="store_true",
        help="the approval asked by a require_approval gate, not by the tool (default: the tool)",
    )
    parser.add_argument(
        "--answer-elsewhere",
        action="store_true",
        help="each K round also with the answers taken on another worker (default: the holder)",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run (100 runs, 1 round)")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.rounds = 100, 1
    return args


if __name__ == "__main__":
    asyncio.run(main(parse()))
