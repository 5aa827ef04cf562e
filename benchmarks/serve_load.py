"""The approval-inbox service under load: runs started, parked and answered over HTTP.

Run it with ``nox -s bench`` or ``python benchmarks/serve_load.py`` (``--help`` for the
knobs, ``--quick`` for a smoke run of a few seconds). As in ``overhead.py`` and ``park.py``,
every headline figure is also given as a ratio against a floor measured in the same run,
by the same client, in the same minute.

The scenario (issue 6, item 6): the server app of ``toolnexus_async.serve.create_app`` on an
in-process model whose first reply calls one tool, ``pay_invoice(invoice)``; the tool asks
for approval (``ToolResult.pending(Request("", "approval", ..., data={"invoice": n}))``, the
id generated); once approved it runs again and the model answers ``"Done: invoice <n>
paid."``. So every run parks on exactly one approval, and a lost or crossed answer shows up
as a wrong text, not as a fast run. The store is a ``SqliteRunStore`` in a temporary
directory and ``park_timeout`` is an hour, so nothing spills (``--spill`` adds a contender
with a 1-second ``park_timeout``, so that every run is saved to the store before it is
answered, and is claimed and resumed from it).

The server runs in its own process (multiprocessing, spawn) on ``127.0.0.1``, port 0: on a
2-core machine the client keeps one core and the server gets the other. It answers the
client's questions about itself (resident set size from ``/proc/self/statm`` after
``gc.collect()`` and ``malloc_trim``, its CPU time) over the multiprocessing pipe.

The client is one process with one ``aiohttp.ClientSession`` (a pool of ``--concurrency``
+ 8 connections, so the pool never caps the load below the concurrency). For each
contender, after an untimed warm-up (``--warmup`` runs through the whole cycle):

1. start: N runs (``--runs``, default 10,000) with ``POST /runs {"prompt"}``, at most
   ``--concurrency`` (default 200) in flight, from a fixed set of workers in one anyio task
   group; each must answer 202 with a new id. Then ``GET /requests`` is polled (one poll at
   a time, 20 ms apart) until it lists N requests: one per run started, each naming its
   run and carrying the run's invoice number;
2. answer: ``POST /requests/{id}/answer {"ok": true}`` for each of them, with the same
   bounded concurrency; each must answer 200. Then ``GET /runs`` is polled until every run
   is ``done``. At the end every run started must be listed exactly once, ``done``, with
   its own text, and ``GET /requests`` must be empty.

Reported: runs started per second (until the last 202, and until ``GET /requests`` listed
all N), answers per second (until the last 200, and until every run was done), p50/p99 of
the ``POST /runs`` and ``POST /answer`` latencies (request sent to body read, as the client
sees it), the server's RSS before the first run, with all N parked and after all are done,
the bytes of RSS per parked run (and pymalloc's block count, which does not depend on how
the allocator hands memory back), the server's and the client's CPU time per run, and the
time the server's cyclic garbage collector took in each phase.

``--stores memory,sqlite,postgres`` (any of them, in that order or another) measures instead
the same app on each store, and no floor: a ``MemoryRunStore``, the ``SqliteRunStore`` above
(a new file per round) and a ``PostgresRunStore`` opened as ``toolnexus-async serve --store
<dsn>`` opens it (``open_store``: a pool of 10, 10-second timeouts), on a throwaway cluster
the script starts itself (``_pg.py``, ``fsync`` on), a new database per round. ``--rounds N``
repeats them, the order reversed every other round. Each round prints the figures above per
store, then the stores side by side: parks/s (until ``GET /requests`` listed all N parked),
runs done/s (first answer sent to every run done), runs/s over the whole cycle, the
server's CPU per run (its process: for SQLite that includes the store's thread), for
PostgreSQL the database server's CPU per run and the write transactions per run; and the
ratios PostgreSQL / SQLite and each / memory of the same round, PostgreSQL / SQLite against
the targets of issue 41 (runs done/s >= 0.6, server CPU per run <= 1.5). At the end, each
ratio's median and range over the rounds.

The floor is a hand-written aiohttp server with the same routes and bodies and no framework:
``POST /runs`` starts a task that puts a bare ``asyncio.Future`` in a dict under a new
request id and awaits it; the answer route pops the future and sets it; the task then marks
its run done with the same text. The client, its session and its checks are the same.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import multiprocessing.connection
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import anyio
from _common import (
    PROMPT,
    ChildServer,
    GcWatch,
    approval_model,
    expected_text,
    get_every_page,
    invoice_approval,
    invoice_of,
    load_average,
    malloc_trim,
    print_footer,
    print_header,
    rss_bytes,
    serve_over_pipe,
)
from _serve_report import (
    STORE_LABELS,
    Figures,
    Latency,
    ServerState,
    StoreRound,
    print_figures,
    print_ratios,
    print_store_round,
    print_store_summary,
)
from aiohttp import web

from toolnexus_async import LlmClient, ToolContext, Toolkit, ToolResult, define_tool
from toolnexus_async.durable import MemoryRunStore, RunStore, SqliteRunStore
from toolnexus_async.serve import ServeInbox, create_app, open_store

if TYPE_CHECKING:
    from _pg import PgServer

HOT_PARK_TIMEOUT = 3600.0  # seconds: far longer than any run of this benchmark
SPILL_PARK_TIMEOUT = 1.0  # seconds, for --spill: every run is saved before it is answered
POLL_SECONDS = 0.02  # pause between two polls (one poll in flight at a time)
STALL_SECONDS = 60.0  # no progress for this long while waiting: something is lost
KEEP_FINISHED = 10_000  # the server remembers this many finished runs (GET /runs)


# --------------------------------------------------------------------------------------
# The server process: the toolnexus app or the floor, and a pipe for questions about it.


@define_tool
async def pay_invoice(invoice: int, ctx: ToolContext | None = None) -> ToolResult:
    """Pay an invoice; a human must approve the payment first.

    Args:
        invoice: the invoice number.
    """
    if ctx is None or ctx.answer is None:
        return ToolResult.pending(invoice_approval(invoice))
    return ToolResult.ok(f"invoice {invoice} paid")


@dataclass
class Probe:
    """What the pipe can tell about the app: how many runs wait in memory."""

    parked: Callable[[], int] = lambda: 0


# The inbox requires a token; the load client sends it with every request (the floor
# ignores it), so both sides pay the same header.
BENCH_TOKEN = "serve-load-benchmark-token"


STORES = tuple(STORE_LABELS)  # what --stores may name


def open_run_store(kind: str, where: str) -> RunStore:
    """The contender's store: ``where`` is the SQLite file or, for ``postgres``, the DSN."""
    if kind == "memory":
        return MemoryRunStore()
    if kind == "postgres":  # as `toolnexus-async serve --store <dsn>` opens it
        return open_store(where)
    return SqliteRunStore(where)


def toolnexus_app(
    store: RunStore, park_timeout: float, freeze_gc: bool = False
) -> tuple[web.Application, Probe]:
    """``create_app`` on the one-approval scenario and ``store``, which the app owns."""
    toolkit = Toolkit.create(builtins=False, extra_tools=[pay_invoice])
    probe = Probe()

    def make_client(inbox: ServeInbox) -> LlmClient:
        probe.parked = inbox.__len__
        return LlmClient.in_process(approval_model, model="serve-load", wait_for=inbox)

    app = create_app(
        make_client=make_client,
        toolkit=toolkit,
        store=store,
        park_timeout=park_timeout,
        token=BENCH_TOKEN,
        freeze_gc=freeze_gc,
        # Throughput, not admission, is measured: all --runs may wait at once.
        max_active_runs=1_000_000,
    )

    async def owned(app: web.Application) -> AsyncIterator[None]:
        async with toolkit, store:  # opened before the app's own context, closed after it
            yield

    app.cleanup_ctx.insert(0, owned)
    return app, probe


# The floor: the same routes and bodies, no framework; a dict of futures.

FLOOR = web.AppKey("floor", dict)


def _refuse(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def _floor_body(request: web.Request) -> dict[str, Any] | web.Response:
    if request.content_type != "application/json":
        return _refuse(415, "send the body as JSON")
    try:
        body = json.loads(await request.read())
    except ValueError:
        return _refuse(422, "the body is not valid JSON")
    if not isinstance(body, dict):
        return _refuse(422, "the body must be a JSON object")
    return body


async def _floor_drive(state: dict[str, Any], record: dict[str, Any]) -> None:
    invoice = invoice_of(record["prompt"])
    request_id = "req_" + uuid.uuid4().hex
    future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    state["waiting"][request_id] = (
        future,
        {
            "id": request_id,
            "kind": "approval",
            "prompt": f"Pay invoice {invoice}?",
            "data": {"invoice": invoice},
            "run_id": record["id"],
        },
    )
    record["status"] = "pending"
    ok = await future
    record["status"] = "done"
    record["text"] = expected_text(invoice) if ok else f"Declined: invoice {invoice}."


async def _floor_post_run(request: web.Request) -> web.Response:
    body = await _floor_body(request)
    if isinstance(body, web.Response):
        return body
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        return _refuse(422, "'prompt' must be a non-empty string")
    state = request.app[FLOOR]
    run_id = "run_" + uuid.uuid4().hex
    record = {"id": run_id, "status": "running", "prompt": prompt, "text": None, "error": None}
    state["runs"][run_id] = record
    task = asyncio.create_task(_floor_drive(state, record))
    state["tasks"].add(task)
    task.add_done_callback(state["tasks"].discard)
    return web.json_response({"id": run_id, "status": "running"}, status=202)


async def _floor_list_requests(request: web.Request) -> web.Response:
    waiting = request.app[FLOOR]["waiting"]
    return web.json_response({"requests": [entry for _, entry in waiting.values()]})


async def _floor_answer(request: web.Request) -> web.Response:
    body = await _floor_body(request)
    if isinstance(body, web.Response):
        return body
    ok = body.get("ok")
    if not isinstance(ok, bool):
        return _refuse(422, "'ok' must be true or false")
    request_id = request.match_info["id"]
    entry = request.app[FLOOR]["waiting"].pop(request_id, None)
    if entry is None:
        return _refuse(404, f"no request {request_id!r}")
    entry[0].set_result(ok)
    return web.json_response({"id": request_id, "ok": ok})


async def _floor_list_runs(request: web.Request) -> web.Response:
    return web.json_response({"runs": list(reversed(request.app[FLOOR]["runs"].values()))})


async def _floor_get_run(request: web.Request) -> web.Response:
    record = request.app[FLOOR]["runs"].get(request.match_info["id"])
    if record is None:
        return _refuse(404, "no such run")
    return web.json_response(record)


def floor_app() -> tuple[web.Application, Probe]:
    app = web.Application()
    state: dict[str, Any] = {"runs": {}, "waiting": {}, "tasks": set()}
    app[FLOOR] = state
    app.router.add_post("/runs", _floor_post_run)
    app.router.add_get("/runs", _floor_list_runs)
    app.router.add_get("/runs/{id}", _floor_get_run)
    app.router.add_get("/requests", _floor_list_requests)
    app.router.add_post("/requests/{id}/answer", _floor_answer)
    return app, Probe(parked=state["waiting"].__len__)


async def _serve(conn: multiprocessing.connection.Connection, kind: str, store: str) -> None:
    if kind == "floor":
        app, probe = floor_app()
    else:
        timeout = SPILL_PARK_TIMEOUT if kind == "spill" else HOT_PARK_TIMEOUT
        app, probe = toolnexus_app(open_run_store(kind, store), timeout, freeze_gc=kind == "freeze")
    watch = GcWatch()

    def reply(message: str) -> ServerState:
        """``settled`` (after a full collection; between phases only) or ``state``."""
        if message == "settled":
            gc.collect()
            malloc_trim()
        gc_so_far = watch.mark()
        return ServerState(
            rss_bytes(),
            sys.getallocatedblocks(),
            time.process_time(),
            probe.parked(),
            gc_so_far.seconds,
            gc_so_far.full,
        )

    await serve_over_pipe(conn, app, reply)


def _server_main(conn: multiprocessing.connection.Connection, kind: str, store: str) -> None:
    asyncio.run(_serve(conn, kind, store))


class Server(ChildServer):
    """One contender's server in a child process; a context manager that starts and stops it."""

    def __init__(self, kind: str, store: str) -> None:
        super().__init__("server", _server_main, kind, store)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ask(self, what: str) -> ServerState:
        """``settled`` (after a full collection; between phases only) or ``state``."""
        state: ServerState = super().ask(what)
        return state


# --------------------------------------------------------------------------------------
# The client.


class Lost(Exception):
    """Runs or requests went missing, or came back wrong."""


async def bounded(
    items: list[Any],
    concurrency: int,
    job: Callable[[Any], Awaitable[float]],
) -> list[float]:
    """``job`` on every item, at most ``concurrency`` at once; each job's seconds."""
    seconds = [math.nan] * len(items)
    numbered = iter(enumerate(items))

    async def worker() -> None:
        for i, item in numbered:  # the workers share one iterator: the next free one takes it
            seconds[i] = await job(item)

    async with anyio.create_task_group() as tg:
        for _ in range(min(concurrency, len(items))):
            tg.start_soon(worker)
    return seconds


async def get_json(http: aiohttp.ClientSession, path: str) -> tuple[Any, int, float]:
    """GET ``path``: the decoded body, its size in bytes, and the seconds it took."""
    start = time.perf_counter()
    async with http.get(path) as reply:
        raw = await reply.read()
        if reply.status != 200:
            raise Lost(f"GET {path}: {reply.status} {raw[:200]!r}")
    return json.loads(raw), len(raw), time.perf_counter() - start


class Stall:
    """Raises :class:`Lost` when a count has not moved for ``STALL_SECONDS``."""

    def __init__(self, what: str, total: int, missing: str) -> None:
        self.what, self.total, self.missing = what, total, missing
        self.best = -1
        self.since = time.perf_counter()

    def check(self, count: int) -> None:
        now = time.perf_counter()
        if count > self.best:
            self.best, self.since = count, now
        elif now - self.since > STALL_SECONDS:
            raise Lost(
                f"{self.what}: stuck at {count} for {STALL_SECONDS:g} s;"
                f" {self.total - count} runs {self.missing}"
            )


async def cycle(
    http: aiohttp.ClientSession,
    server: Server,
    out: Figures,
    first: int,
    concurrency: int,
    store: Path | None,
) -> None:
    """Start, park, answer and finish ``out.runs`` runs numbered from ``first``."""
    clock = time.perf_counter
    numbers = list(range(first, first + out.runs))
    run_of: dict[int, str] = {}
    bad: list[str] = []

    async def start(n: int) -> float:
        begin = clock()
        try:
            async with http.post("/runs", json={"prompt": PROMPT.format(n=n)}) as reply:
                body = await reply.read()
                if reply.status != 202:
                    bad.append(f"POST /runs (run {n}): {reply.status} {body[:200]!r}")
                else:
                    run_of[n] = json.loads(body)["id"]
        except aiohttp.ClientError as exc:
            bad.append(f"POST /runs (run {n}): {exc!r}")
        return clock() - begin

    cpu0, server0, t0 = time.process_time(), server.ask("state"), clock()
    start_seconds = await bounded(numbers, concurrency, start)
    out.post_seconds = clock() - t0
    if bad:
        raise Lost(f"{len(bad)} runs refused, e.g. {bad[0]}")
    if len(set(run_of.values())) != out.runs:
        raise Lost("POST /runs gave the same run id twice")
    out.start_latency = Latency.of(start_seconds)

    # Until GET /requests lists one request per run started.
    stall = Stall("GET /requests", out.runs, "not parked")
    while True:
        requests, size, took = await get_every_page(http, "/requests", "requests")
        out.polls[0] += 1
        if len(requests) >= out.runs:
            break
        stall.check(len(requests))
        await anyio.sleep(POLL_SECONDS)
    out.parked_seconds = clock() - t0
    out.listing_seconds, out.listing_bytes = took, size
    # One request per run, each naming its run and the run's own invoice.
    number_of = {run_id: n for n, run_id in run_of.items()}
    answers: list[str] = []
    seen: set[str] = set()
    for item in requests:
        n = number_of.get(item.get("run_id", ""))
        if n is None or item["run_id"] in seen or (item.get("data") or {}).get("invoice") != n:
            raise Lost(f"GET /requests listed a request that is not one per run: {item!r}")
        seen.add(item["run_id"])
        answers.append(item["id"])

    if store is not None:  # --spill: until every run is saved to the store, none in memory
        stall = Stall("spilling", out.runs, "not in the store")
        while True:
            stored = stored_requests(store)
            if stored >= out.runs and server.ask("state").parked == 0:
                break
            stall.check(stored)
            await anyio.sleep(POLL_SECONDS)
        out.spilled_seconds = clock() - t0
    server1, cpu1 = server.ask("state"), time.process_time()
    out.server_start, out.client_cpu_start = server1.since(server0), cpu1 - cpu0
    if store is not None:  # what listing costs once every run is in the store, at rest
        _, _, out.listing_stored_seconds = await get_every_page(http, "/requests", "requests")
    out.parked = server.ask("settled")

    async def answer(request_id: str) -> float:
        begin = clock()
        path = f"/requests/{request_id}/answer"
        try:
            async with http.post(path, json={"ok": True}) as reply:
                body = await reply.read()
                if reply.status != 200:
                    bad.append(f"POST {path}: {reply.status} {body[:200]!r}")
        except aiohttp.ClientError as exc:
            bad.append(f"POST {path}: {exc!r}")
        return clock() - begin

    cpu0, server0, t1 = time.process_time(), server.ask("state"), clock()
    answer_seconds = await bounded(answers, concurrency, answer)
    out.answer_seconds = clock() - t1
    if bad:
        raise Lost(f"{len(bad)} answers refused, e.g. {bad[0]}")
    out.answer_latency = Latency.of(answer_seconds)

    # Until GET /runs shows every run done.
    stall = Stall("GET /runs", out.runs, "not done")
    ours = set(run_of.values())
    while True:
        runs, _, out.runs_listing_seconds = await get_every_page(http, "/runs", "runs")
        out.polls[1] += 1
        ended = [r for r in runs if r["id"] in ours and r["status"] not in ("running", "pending")]
        if len(ended) >= out.runs:
            break
        stall.check(len(ended))
        await anyio.sleep(POLL_SECONDS)
    out.done_seconds = clock() - t1
    out.server_answer = server.ask("state").since(server0)
    out.client_cpu_answer = time.process_time() - cpu0

    # Every run listed once, done, with its own text; nothing left outstanding.
    listed = [r for r in runs if r["id"] in ours]
    by_id = {r["id"]: r for r in listed}
    if len(listed) != out.runs or len(by_id) != out.runs:
        raise Lost(f"GET /runs lists {len(listed)} of our {out.runs} runs (or one twice)")
    for n, run_id in run_of.items():
        run = by_id[run_id]
        if run["status"] != "done" or run["text"] != expected_text(n):
            raise Lost(f"run {n} ({run_id}) ended wrong: {run!r}")
    left, _, _ = await get_json(http, "/requests")
    if left["requests"]:
        raise Lost(f"{len(left['requests'])} requests still outstanding after all were answered")


def stored_requests(path: Path) -> int:
    """Requests saved in the SQLite store, read by a second connection (WAL: no lock)."""
    try:
        with sqlite3.connect(path, timeout=5) as conn:
            return int(conn.execute("SELECT COUNT(*) FROM requests").fetchone()[0])
    except sqlite3.OperationalError:  # not created yet
        return 0


@dataclass(frozen=True)
class Database:
    """The round's database on the throwaway cluster, and the cluster's CPU so far."""

    dsn: str
    cpu: Callable[[], float]


async def measure(
    kind: str, name: str, args: argparse.Namespace, store: str, database: Database | None = None
) -> Figures:
    """One contender's figures; ``store`` is its SQLite file, or the DSN of ``database``."""
    connector = aiohttp.TCPConnector(limit=args.concurrency + 8, limit_per_host=0)
    timeout = aiohttp.ClientTimeout(total=600)
    with Server(kind, store) as server:
        async with aiohttp.ClientSession(
            server.base_url,
            connector=connector,
            timeout=timeout,
            headers={"Authorization": f"Bearer {BENCH_TOKEN}"},
        ) as http:
            spill_store = Path(store) if kind == "spill" else None
            if args.warmup:
                warm = Figures(name, args.warmup)
                await cycle(http, server, warm, 1_000_000, args.concurrency, spill_store)
            gc.collect()
            figures = Figures(name, args.runs)
            figures.before = server.ask("settled")
            if database is not None:
                from _pg import next_xid

                xid, database_cpu = await next_xid(database.dsn), database.cpu()
            await cycle(http, server, figures, 0, args.concurrency, spill_store)
            if database is not None:
                figures.database_cpu = database.cpu() - database_cpu
                figures.transactions = await next_xid(database.dsn) - xid
            figures.after = server.ask("settled")
    return figures


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="toolnexus_async serve: runs started, parked and answered over HTTP."
    )
    parser.add_argument("--runs", type=int, default=10_000, help="runs started, parked, answered")
    parser.add_argument(
        "--concurrency", type=int, default=200, help="HTTP requests in flight at most"
    )
    parser.add_argument(
        "--warmup", type=int, default=200, help="untimed runs through the whole cycle first"
    )
    parser.add_argument(
        "--spill",
        action="store_true",
        help=f"also measure runs spilled to the store (park_timeout {SPILL_PARK_TIMEOUT:g} s)",
    )
    parser.add_argument(
        "--freeze-gc",
        action="store_true",
        help="also measure the app with freeze_gc=True (serve --freeze-gc: a GcFreezer)",
    )
    parser.add_argument(
        "--stores",
        type=lambda text: [name.strip() for name in text.split(",")],
        default=[],
        help=f"instead of the floor and the app: the app on each of these run stores, side by"
        f" side ({','.join(STORES)}; postgres starts a throwaway cluster, fsync on)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="with --stores: rounds of every store, the order reversed every other round",
    )
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run of a few seconds (300 runs)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.warmup = 300, 20
    if args.runs < 1 or args.concurrency < 1 or args.warmup < 0:
        parser.error("--runs and --concurrency must be at least 1, --warmup at least 0")
    unknown = [name for name in args.stores if name not in STORES]
    if unknown:
        parser.error(f"--stores: no store {unknown[0]!r}; the stores are {', '.join(STORES)}")
    if len(set(args.stores)) != len(args.stores):
        parser.error(f"--stores names a store twice: {','.join(args.stores)}")
    if args.rounds < 1 or (args.rounds > 1 and not args.stores):
        parser.error("--rounds is at least 1, and more than 1 only with --stores")
    if args.stores and (args.spill or args.freeze_gc):
        parser.error(
            "--spill and --freeze-gc are contenders of the default comparison, not of --stores"
        )
    if args.runs > KEEP_FINISHED:
        # GET /runs forgets the oldest finished runs past this, so "none lost" is unprovable.
        parser.error(f"--runs is at most {KEEP_FINISHED:,}: the server lists that many finished")
    return args


async def measured(
    kind: str, name: str, args: argparse.Namespace, store: str, database: Database | None = None
) -> Figures:
    """:func:`measure`, its figures printed; a run lost ends the benchmark, saying which."""
    try:
        figures = await measure(kind, name, args, store, database)
    except Lost as exc:
        print(f"  {name}\n    LOST: {exc}")
        raise SystemExit(f"{name}: {exc}") from None
    print_figures(figures)
    return figures


STORE_CONTENDERS = {
    "memory": "create_app on a MemoryRunStore",
    "sqlite": "create_app on a SqliteRunStore (a new file per round)",
    "postgres": "create_app on a PostgresRunStore (a new database per round)",
}


async def compare_stores(args: argparse.Namespace, cluster: PgServer | None) -> None:
    """``--stores``: the app on each store, ``--rounds`` times, alternated."""
    database_line = None
    if cluster is not None:
        from _pg import describe

        database_line = await describe(cluster.dsn)
    print_header("aiohttp", "anyio", "aiosqlite", "SQLite", "asyncpg", database=database_line)
    print(
        f"serve on each run store: {args.runs:,} runs started over HTTP, all parked on one"
        f" approval, then all answered over HTTP; {args.concurrency} requests in flight at"
        f" most, {args.warmup} warm-up runs; server in its own process (park_timeout"
        f" {HOT_PARK_TIMEOUT:g} s: none spill); {args.rounds} round(s) of {', '.join(args.stores)},"
        f" the order reversed every other round"
    )
    rounds: list[StoreRound] = []
    with tempfile.TemporaryDirectory(prefix="serve-stores-") as tmp:
        for number in range(1, args.rounds + 1):
            order = args.stores if number % 2 else args.stores[::-1]
            round_ = StoreRound(number, load_average(), {})
            print(f"round {number}: {', '.join(order)} (load average {round_.load})")
            for kind in order:
                store, database = str(Path(tmp) / f"round{number}.sqlite"), None
                if kind == "postgres":
                    assert cluster is not None
                    from _pg import ServerCpu, create_database

                    store = await create_database(cluster, f"serve_round{number}")
                    database = Database(store, ServerCpu(cluster).seconds)
                name = f"{STORE_CONTENDERS[kind]}, round {number}"
                round_.figures[kind] = await measured(kind, name, args, store, database)
            print_store_round(round_)
            rounds.append(round_)
    print_store_summary(rounds)
    print("  none lost: every run of every store was started once, parked once, done once")
    print_footer()


async def main(args: argparse.Namespace) -> None:
    if args.stores:
        with contextlib.ExitStack() as stack:
            cluster = None
            if "postgres" in args.stores:
                from _pg import throwaway_cluster

                cluster = stack.enter_context(throwaway_cluster(fsync=True))
            await compare_stores(args, cluster)
        return
    print_header("aiohttp", "anyio", "aiosqlite", "SQLite")
    print(
        f"serve under load: {args.runs:,} runs started over HTTP, all parked on one approval,"
        f" then all answered over HTTP; {args.concurrency} requests in flight at most,"
        f" {args.warmup} warm-up runs; server in its own process, SqliteRunStore"
    )
    contenders = [
        ("floor", "floor (hand-written aiohttp, a dict of futures)"),
        ("hot", f"toolnexus_async create_app (park_timeout {HOT_PARK_TIMEOUT:g} s: none spill)"),
    ]
    if args.freeze_gc:
        contenders.append(
            ("freeze", "toolnexus_async create_app, freeze_gc=True (as serve --freeze-gc)")
        )
    if args.spill:
        contenders.append(
            (
                "spill",
                f"toolnexus_async create_app, spilled (park_timeout {SPILL_PARK_TIMEOUT:g} s)",
            )
        )
    results: dict[str, Figures] = {}
    with tempfile.TemporaryDirectory(prefix="serve-load-") as tmp:
        for kind, name in contenders:
            results[kind] = await measured(kind, name, args, str(Path(tmp) / f"{kind}.sqlite"))
    floor = results["floor"]
    for kind in ("hot", "freeze", "spill"):
        if kind in results:
            print_ratios(results[kind], floor)
    print("  none lost: every run of every contender was started once, parked once, done once")
    print_footer()


if __name__ == "__main__":
    anyio.run(main, parse_args(), backend="asyncio")
