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

The floor is a hand-written aiohttp server with the same routes and bodies and no framework:
``POST /runs`` starts a task that puts a bare ``asyncio.Future`` in a dict under a new
request id and awaits it; the answer route pops the future and sets it; the task then marks
its run done with the same text. The client, its session and its checks are the same.
"""

from __future__ import annotations

import argparse
import asyncio
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    malloc_trim,
    percentile,
    print_footer,
    print_header,
    rss_bytes,
    serve_over_pipe,
)
from aiohttp import web

from toolnexus_async import LlmClient, ToolContext, Toolkit, ToolResult, define_tool
from toolnexus_async.durable import SqliteRunStore
from toolnexus_async.serve import ServeInbox, create_app

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


def toolnexus_app(
    store_path: Path, park_timeout: float, freeze_gc: bool = False
) -> tuple[web.Application, Probe]:
    """``create_app`` on the one-approval scenario and a SqliteRunStore the app owns."""
    toolkit = Toolkit.create(builtins=False, extra_tools=[pay_invoice])
    store = SqliteRunStore(store_path)
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


@dataclass(frozen=True)
class ServerState:
    rss: int = 0  # bytes, after gc.collect() and malloc_trim() when settled
    blocks: int = 0  # pymalloc blocks in use (sys.getallocatedblocks)
    cpu: float = 0.0  # seconds of CPU the server process has used so far (all threads)
    parked: int = 0  # runs waiting in memory
    gc_seconds: float = 0.0  # in the cyclic collector so far (explicit collections too)
    gc_full: int = 0  # full collections so far

    def since(self, earlier: ServerState) -> ServerState:
        """CPU and collector figures between two states."""
        return ServerState(
            self.rss,
            self.blocks,
            self.cpu - earlier.cpu,
            self.parked,
            self.gc_seconds - earlier.gc_seconds,
            self.gc_full - earlier.gc_full,
        )


async def _serve(conn: multiprocessing.connection.Connection, kind: str, store: str) -> None:
    if kind == "floor":
        app, probe = floor_app()
    else:
        timeout = SPILL_PARK_TIMEOUT if kind == "spill" else HOT_PARK_TIMEOUT
        app, probe = toolnexus_app(Path(store), timeout, freeze_gc=kind == "freeze")
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

    def __init__(self, kind: str, store: Path) -> None:
        super().__init__("server", _server_main, kind, str(store))

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ask(self, what: str) -> ServerState:
        """``settled`` (after a full collection; between phases only) or ``state``."""
        state: ServerState = super().ask(what)
        return state


# --------------------------------------------------------------------------------------
# The client.


@dataclass(frozen=True)
class Latency:
    p50: float
    p99: float
    max: float

    @classmethod
    def of(cls, seconds: list[float]) -> Latency:
        seconds = sorted(seconds)
        return cls(percentile(seconds, 50), percentile(seconds, 99), seconds[-1])

    def text(self) -> str:
        return f"p50 {ms(self.p50)}  p99 {ms(self.p99)}  max {ms(self.max)}"


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


@dataclass
class Figures:
    name: str
    runs: int
    post_seconds: float = 0.0  # first POST /runs sent -> last 202 read
    parked_seconds: float = 0.0  # first POST /runs sent -> GET /requests listed all
    spilled_seconds: float = 0.0  # --spill: first POST -> every run saved, none in memory
    answer_seconds: float = 0.0  # first answer sent -> last 200 read
    done_seconds: float = 0.0  # first answer sent -> GET /runs showed every run done
    start_latency: Latency = Latency(0, 0, 0)
    answer_latency: Latency = Latency(0, 0, 0)
    listing_seconds: float = 0.0  # the GET /requests that listed all N
    listing_bytes: int = 0
    polls: list[int] = field(default_factory=lambda: [0, 0])  # GET /requests, GET /runs
    listing_stored_seconds: float = 0.0  # --spill: a GET /requests with all N in the store
    before: ServerState = ServerState()
    parked: ServerState = ServerState()
    after: ServerState = ServerState()
    server_start: ServerState = ServerState()  # first POST -> all parked (and spilled)
    server_answer: ServerState = ServerState()  # first answer -> all done
    client_cpu_start: float = 0.0
    client_cpu_answer: float = 0.0

    def rate(self, seconds: float) -> float:
        return self.runs / seconds

    @property
    def start_wall(self) -> float:
        """The start phase's wall time: until all parked (and, with --spill, all saved)."""
        return self.spilled_seconds or self.parked_seconds

    @property
    def bytes_per_run(self) -> float:
        return (self.parked.rss - self.before.rss) / self.runs

    @property
    def blocks_per_run(self) -> float:
        return (self.parked.blocks - self.before.blocks) / self.runs

    @property
    def server_cpu_start(self) -> float:
        return self.server_start.cpu

    @property
    def server_cpu_answer(self) -> float:
        return self.server_answer.cpu


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
        runs, _, _ = await get_every_page(http, "/runs", "runs")
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


async def measure(kind: str, name: str, args: argparse.Namespace, directory: Path) -> Figures:
    store = directory / f"{kind}.sqlite"
    connector = aiohttp.TCPConnector(limit=args.concurrency + 8, limit_per_host=0)
    timeout = aiohttp.ClientTimeout(total=600)
    with Server(kind, store) as server:
        async with aiohttp.ClientSession(
            server.base_url,
            connector=connector,
            timeout=timeout,
            headers={"Authorization": f"Bearer {BENCH_TOKEN}"},
        ) as http:
            spill_store = store if kind == "spill" else None
            if args.warmup:
                warm = Figures(name, args.warmup)
                await cycle(http, server, warm, 1_000_000, args.concurrency, spill_store)
            gc.collect()
            figures = Figures(name, args.runs)
            figures.before = server.ask("settled")
            await cycle(http, server, figures, 0, args.concurrency, spill_store)
            figures.after = server.ask("settled")
    return figures


# --------------------------------------------------------------------------------------
# The report.


def print_figures(f: Figures) -> None:
    mib = 1024 * 1024
    n = f.runs
    print(f"  {f.name}")
    print(
        f"    start     {n:,} POST /runs in {f.post_seconds:.3f} s = {f.rate(f.post_seconds):,.0f}"
        f" runs/s; all listed parked by GET /requests after {f.parked_seconds:.3f} s"
        f" = {f.rate(f.parked_seconds):,.0f} runs/s ({f.polls[0]} polls)"
    )
    if f.spilled_seconds:
        print(
            f"    spill     every run saved to the store, none in memory, after"
            f" {f.spilled_seconds:.3f} s = {f.rate(f.spilled_seconds):,.0f} runs/s"
        )
    print(f"    POST /runs          {f.start_latency.text()}")
    print(
        f"    GET /requests with all {n:,} parked: {ms(f.listing_seconds)},"
        f" {f.listing_bytes / 1024:,.0f} KiB"
        + (
            f"; again once all were in the store, at rest: {ms(f.listing_stored_seconds)}"
            if f.listing_stored_seconds
            else ""
        )
    )
    print(
        f"    answer    {n:,} POST /requests/{{id}}/answer in {f.answer_seconds:.3f} s"
        f" = {f.rate(f.answer_seconds):,.0f} answers/s; every run done after"
        f" {f.done_seconds:.3f} s = {f.rate(f.done_seconds):,.0f} runs/s ({f.polls[1]} polls)"
    )
    print(f"    POST /answer        {f.answer_latency.text()}")
    print(
        f"    memory    server RSS {f.before.rss / mib:.1f} -> {f.parked.rss / mib:.1f} MiB"
        f" with all parked -> {f.after.rss / mib:.1f} MiB after all done"
        f" = {f.bytes_per_run:,.0f} bytes per parked run"
        f" ({f.parked.parked:,} in memory when parked); pymalloc blocks"
        f" {f.blocks_per_run:.1f} per parked run, {f.after.blocks - f.before.blocks:+,} after"
    )
    print(
        f"    CPU       server {f.server_cpu_start / n * 1e6:,.0f} us/run starting"
        f" ({f.server_cpu_start / f.start_wall:.0%} of a core),"
        f" {f.server_cpu_answer / n * 1e6:,.0f} us/run answering"
        f" ({f.server_cpu_answer / f.done_seconds:.0%});"
        f" client {f.client_cpu_start / n * 1e6:,.0f} and {f.client_cpu_answer / n * 1e6:,.0f}"
        f" us/run ({f.client_cpu_start / f.start_wall:.0%},"
        f" {f.client_cpu_answer / f.done_seconds:.0%})"
    )
    a, b = f.server_start, f.server_answer
    print(
        f"    server gc {a.gc_seconds:.3f} s ({a.gc_full} full) starting,"
        f" {b.gc_seconds:.3f} s ({b.gc_full} full) answering"
    )


def ratio_line(label: str, tn: float, floor: float, unit: str) -> str:
    return f"    {label:<30} {tn:>12,.1f} / {floor:>12,.1f} {unit:<6} = {tn / floor:.2f}"


def print_ratios(tn: Figures, floor: Figures) -> None:
    print(f"  {tn.name} / floor:")
    for label, a, b, unit in (
        ("runs started/s (POSTs)", tn.rate(tn.post_seconds), floor.rate(floor.post_seconds), "/s"),
        (
            "runs started/s (all parked)",
            tn.rate(tn.parked_seconds),
            floor.rate(floor.parked_seconds),
            "/s",
        ),
        (
            "answers/s (POSTs)",
            tn.rate(tn.answer_seconds),
            floor.rate(floor.answer_seconds),
            "/s",
        ),
        ("answers/s (all done)", tn.rate(tn.done_seconds), floor.rate(floor.done_seconds), "/s"),
        ("POST /runs p50", tn.start_latency.p50 * 1e3, floor.start_latency.p50 * 1e3, "ms"),
        ("POST /runs p99", tn.start_latency.p99 * 1e3, floor.start_latency.p99 * 1e3, "ms"),
        ("POST /answer p50", tn.answer_latency.p50 * 1e3, floor.answer_latency.p50 * 1e3, "ms"),
        ("POST /answer p99", tn.answer_latency.p99 * 1e3, floor.answer_latency.p99 * 1e3, "ms"),
        ("bytes of RSS per parked run", tn.bytes_per_run, floor.bytes_per_run, "bytes"),
        (
            "server CPU per run, starting",
            tn.server_cpu_start / tn.runs * 1e6,
            floor.server_cpu_start / floor.runs * 1e6,
            "us",
        ),
        (
            "server CPU per run, answering",
            tn.server_cpu_answer / tn.runs * 1e6,
            floor.server_cpu_answer / floor.runs * 1e6,
            "us",
        ),
        (
            "server CPU per run (whole)",
            (tn.server_cpu_start + tn.server_cpu_answer) / tn.runs * 1e6,
            (floor.server_cpu_start + floor.server_cpu_answer) / floor.runs * 1e6,
            "us",
        ),
    ):
        print(ratio_line(label, a, b, unit))


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
        "--quick", action="store_true", help="a smoke run of a few seconds (300 runs)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.warmup = 300, 20
    if args.runs < 1 or args.concurrency < 1 or args.warmup < 0:
        parser.error("--runs and --concurrency must be at least 1, --warmup at least 0")
    if args.runs > KEEP_FINISHED:
        # GET /runs forgets the oldest finished runs past this, so "none lost" is unprovable.
        parser.error(f"--runs is at most {KEEP_FINISHED:,}: the server lists that many finished")
    return args


async def main(args: argparse.Namespace) -> None:
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
            try:
                results[kind] = await measure(kind, name, args, Path(tmp))
            except Lost as exc:
                print(f"  {name}\n    LOST: {exc}")
                raise SystemExit(f"{name}: {exc}") from None
            print_figures(results[kind])
    floor = results["floor"]
    for kind in ("hot", "freeze", "spill"):
        if kind in results:
            print_ratios(results[kind], floor)
    print("  none lost: every run of every contender was started once, parked once, done once")
    print_footer()


if __name__ == "__main__":
    anyio.run(main, parse_args(), backend="asyncio")
