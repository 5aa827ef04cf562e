"""Memory over time with ``freeze_gc``: a server that is never without a parked run.

Run it with ``python benchmarks/gc_soak.py`` (``--help`` for the knobs, ``--quick`` for a
smoke run of a few seconds).

What it answers: whether ``create_app(freeze_gc=True)`` (``serve --freeze-gc``) can be left
on in a server whose inbox is never empty. Its freezer hands the frozen objects back to the
collector only when no run is parked, so a reference cycle that became garbage after it was
frozen is kept until then; in such a server, never. This measures how much that is, with
real components on every side of a run:

- the model is the loopback mock of ``_mock.py`` (its own process), reached over HTTP by
  ``LlmClient(style="openai")``: two model turns per run;
- the tool is ``pay_invoice(invoice)``: it asks for approval, and once approved it pays
  through an :func:`~toolnexus_async.tools.http_tool` (``POST /pay/{invoice}`` on the mock,
  which counts the payments), so every run also makes an HTTP call through the tool
  machinery and its egress guard;
- with ``--mcp``, the approved tool first calls ``add`` on the tests' demo MCP server
  (``tests/mcp_servers/demo.py``, written with the ``mcp`` SDK, over stdio), so the MCP
  client's session and streams take part too;
- the server is ``create_app`` on a ``SqliteRunStore`` in a temporary directory, in its own
  process (``serve_load.py``'s pipe), with ``freeze_gc`` off and then on.

The load keeps ``--parked`` runs (default 1,000) waiting at all times and churns others
through them for ``--seconds`` (default 300) per server: a round starts ``--batch`` runs
(``POST /runs``), waits until ``GET /requests`` lists them, and answers as many of the
oldest outstanding requests (``POST /requests/{id}/answer``), so the runs parked first stay
parked to the end and the inbox is never empty. Every ``--every`` seconds (default 30) the
server reports its resident set size, pymalloc's block count and its collector's work so
far; nothing is collected for these readings. At the end, with the kept runs still parked,
the server hands everything frozen back (``gc.unfreeze()``) and collects it all once: the
unreachable objects that collection finds are the cyclic garbage that had piled up. Then
the kept runs are answered, and the payments the mock counted must equal the runs started.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import multiprocessing.connection
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import anyio
from _common import (
    PROMPT,
    ChildServer,
    GcWatch,
    get_every_page,
    invoice_approval,
    print_footer,
    print_header,
    rss_bytes,
    serve_over_pipe,
)
from _mock import API_KEY, MODEL, MockServer
from aiohttp import web

from toolnexus_async import LlmClient, ToolContext, Toolkit, ToolResult, define_tool, http_tool
from toolnexus_async.durable import SqliteRunStore
from toolnexus_async.serve import ServeInbox, create_app

# The demo MCP server of the tests (``--mcp``): the repository's root on sys.path, as
# _pg.py does for tests.pg.
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from tests.mcp_servers.fixtures import stdio_server  # noqa: E402

TOKEN = "gc-soak-benchmark-token"
POLL_SECONDS = 0.05


# --------------------------------------------------------------------------------------
# The server process.


@dataclass(frozen=True)
class Reading:
    at: float  # seconds since the load began (filled in by the parent)
    rss: int  # bytes, as they are: nothing collected for the reading
    blocks: int  # pymalloc blocks in use
    parked: int
    gc_full: int  # full collections so far
    gc_seconds: float  # in the collector so far
    gc_full_max: float  # the longest full collection so far


@dataclass(frozen=True)
class Final:
    frozen: int  # objects frozen before the hand-back (gc.get_freeze_count())
    garbage: int  # unreachable objects one full collection of everything found
    collect_seconds: float  # how long that collection took
    rss_after: int


@dataclass(frozen=True)
class Setup:
    """What the server process is made of (pickled to it)."""

    store: str  # the SqliteRunStore's file
    llm_url: str  # the mock's OpenAI-style base URL
    pay_url: str  # the mock's payment API
    freeze: bool  # create_app(freeze_gc=...)
    mcp: bool  # the tool calls the demo MCP server too


def make_app(setup: Setup) -> tuple[web.Application, list[ServeInbox]]:
    mcp = setup.mcp
    pay = http_tool(
        "pay",
        "Pay an invoice.",
        "POST",
        setup.pay_url,
        {"type": "object", "properties": {"invoice": {"type": "integer"}}},
        allow_hosts=["127.0.0.1"],
    )

    @define_tool
    async def pay_invoice(invoice: int, ctx: ToolContext | None = None) -> ToolResult:
        """Pay an invoice; a human must approve the payment first.

        Args:
            invoice: the invoice number.
        """
        if ctx is None or ctx.answer is None:
            return ToolResult.pending(invoice_approval(invoice))
        if mcp:  # the demo MCP server's ``add``, over its stdio session, before paying
            add = toolkit.get("demo_add")
            assert add is not None
            checked = await add.execute({"a": invoice, "b": 0}, ctx)
            if checked.is_error:
                return checked
        return await pay.execute({"invoice": invoice}, ctx)

    servers = {"demo": stdio_server()} if mcp else None
    toolkit = Toolkit.create(
        builtins=False,
        extra_tools=[pay_invoice],
        mcp=None if servers is None else {"mcpServers": servers},
    )
    run_store = SqliteRunStore(Path(setup.store))
    inboxes: list[ServeInbox] = []

    def make_client(inbox: ServeInbox) -> LlmClient:
        inboxes.append(inbox)
        return LlmClient(
            setup.llm_url, style="openai", model=MODEL, api_key=API_KEY, wait_for=inbox
        )

    app = create_app(
        make_client=make_client,
        toolkit=toolkit,
        store=run_store,
        park_timeout=3600,
        token=TOKEN,
        freeze_gc=setup.freeze,
    )

    async def owned(app: web.Application) -> AsyncIterator[None]:
        async with toolkit, run_store:
            try:
                yield
            finally:
                await pay.aclose()

    app.cleanup_ctx.insert(0, owned)
    return app, inboxes


async def _serve(conn: multiprocessing.connection.Connection, setup: Setup) -> None:
    app, inboxes = make_app(setup)
    watch = GcWatch()

    def reply(message: str) -> Reading | Final:
        if message == "final":
            frozen = gc.get_freeze_count()
            gc.unfreeze()
            begin = time.perf_counter()
            garbage = gc.collect()
            return Final(frozen, garbage, time.perf_counter() - begin, rss_bytes())
        span = watch.mark()
        parked = len(inboxes[0]) if inboxes else 0
        return Reading(
            0.0,
            rss_bytes(),
            sys.getallocatedblocks(),
            parked,
            span.full,
            span.seconds,
            watch.longest_full,
        )

    await serve_over_pipe(conn, app, reply)


def _server_main(conn: multiprocessing.connection.Connection, setup: Setup) -> None:
    asyncio.run(_serve(conn, setup))


class Server(ChildServer):
    def __init__(self, setup: Setup) -> None:
        super().__init__("server", _server_main, setup)


# --------------------------------------------------------------------------------------
# The load.


class Load:
    def __init__(self, http: aiohttp.ClientSession, concurrency: int) -> None:
        self.http = http
        self.limit = anyio.CapacityLimiter(concurrency)
        self.started = 0
        self.outstanding: dict[str, None] = {}  # request ids, oldest first

    async def _post(self, path: str, body: Mapping[str, object], status: int) -> None:
        async with self.limit, self.http.post(path, json=body) as reply:
            text = await reply.read()
            if reply.status != status:
                raise SystemExit(f"POST {path}: {reply.status} {text[:200]!r}")

    async def start(self, count: int) -> None:
        async with anyio.create_task_group() as tg:
            for _ in range(count):
                tg.start_soon(self._post, "/runs", {"prompt": PROMPT.format(n=self.started)}, 202)
                self.started += 1

    async def listed(self, count: int) -> None:
        """Until ``GET /requests`` lists ``count`` requests; new ones join the queue."""
        deadline = time.monotonic() + 60
        while True:
            listing, _, _ = await get_every_page(self.http, "/requests", "requests")
            if len(listing) >= count:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"only {len(listing)} of {count} requests listed after 60 s")
            await anyio.sleep(POLL_SECONDS)
        for item in listing:
            self.outstanding.setdefault(item["id"], None)

    async def answer(self, count: int) -> None:
        oldest = list(self.outstanding)[:count]
        async with anyio.create_task_group() as tg:
            for request_id in oldest:
                del self.outstanding[request_id]
                tg.start_soon(self._post, f"/requests/{request_id}/answer", {"ok": True}, 200)


@dataclass
class Soak:
    name: str
    readings: list[Reading]
    final: Final
    started: int
    paid: int
    seconds: float


async def soak(name: str, freeze: bool, mock: MockServer, args: argparse.Namespace) -> Soak:
    paid_before = mock.paid()
    with (
        tempfile.TemporaryDirectory() as tmp,
        Server(
            Setup(str(Path(tmp) / "runs.sqlite"), mock.park_url, mock.pay_url, freeze, args.mcp)
        ) as server,
    ):
        headers = {"Authorization": f"Bearer {TOKEN}"}
        connector = aiohttp.TCPConnector(limit=args.concurrency + 4)
        async with aiohttp.ClientSession(
            f"http://127.0.0.1:{server.port}", headers=headers, connector=connector
        ) as http:
            load = Load(http, args.concurrency)
            await load.start(args.parked)
            await load.listed(args.parked)
            readings: list[Reading] = []
            begin = time.perf_counter()
            next_reading = begin
            while True:
                now = time.perf_counter()
                if now >= next_reading:
                    reading: Reading = server.ask("state")
                    readings.append(dataclasses.replace(reading, at=now - begin))
                    next_reading += args.every
                if now - begin >= args.seconds:
                    break
                await load.start(args.batch)
                await load.listed(args.parked + args.batch)
                await load.answer(args.batch)
            seconds = time.perf_counter() - begin
            final: Final = server.ask("final")
            await load.answer(len(load.outstanding))
            deadline = time.monotonic() + 60
            while mock.paid() - paid_before < load.started:
                if time.monotonic() > deadline:
                    raise SystemExit(
                        f"{name}: {mock.paid() - paid_before} payments of {load.started} runs"
                    )
                await anyio.sleep(POLL_SECONDS)
    return Soak(name, readings, final, load.started, mock.paid() - paid_before, seconds)


def report(s: Soak, batch: int) -> None:
    mib = 1024 * 1024
    print(f"  {s.name}: {s.started:,} runs in {s.seconds:.0f} s, {s.paid:,} payments made")
    print("       s   RSS MiB     blocks   parked  full gcs   gc s  longest full")
    for r in s.readings:
        print(
            f"    {r.at:5.0f} {r.rss / mib:9.1f} {r.blocks:10,} {r.parked:8,}"
            f" {r.gc_full:8} {r.gc_seconds:6.2f} {r.gc_full_max * 1000:8.1f} ms"
        )
    first, last = s.readings[0], s.readings[-1]
    span = max(last.at - first.at, 1e-9)
    print(
        f"    growth from the first reading to the last: RSS {(last.rss - first.rss) / mib:+.1f}"
        f" MiB ({(last.rss - first.rss) / mib / span * 60:+.2f} MiB/min), blocks"
        f" {last.blocks - first.blocks:+,}"
    )
    f = s.final
    print(
        f"    at the end: {f.frozen:,} objects frozen; one full collection of everything found"
        f" {f.garbage:,} unreachable ({f.garbage / max(s.started, 1):.1f} per run started) in"
        f" {f.collect_seconds * 1000:.0f} ms; RSS then {f.rss_after / mib:.1f} MiB"
    )


async def main(args: argparse.Namespace) -> None:
    print_header("aiohttp", "anyio", "SQLite", *(("mcp",) if args.mcp else ()))
    print(
        f"gc soak: {args.parked:,} runs kept parked, {args.batch} more per round, "
        f"{args.seconds:.0f} s per server, readings every {args.every:.0f} s"
        + (", the tool also calling an MCP server over stdio" if args.mcp else "")
    )
    with MockServer(0) as mock:
        for name, freeze in (("freeze_gc off", False), ("freeze_gc on", True)):
            result = await soak(name, freeze, mock, args)
            if result.paid != result.started:
                raise SystemExit(f"{name}: {result.paid} payments for {result.started} runs")
            report(result, args.batch)
    print_footer()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=300.0, help="per server (default 300)")
    parser.add_argument("--parked", type=int, default=1000, help="runs kept parked (1,000)")
    parser.add_argument("--batch", type=int, default=200, help="runs per round (default 200)")
    parser.add_argument("--every", type=float, default=30.0, help="seconds between readings")
    parser.add_argument("--concurrency", type=int, default=50, help="requests in flight (50)")
    parser.add_argument(
        "--mcp",
        action="store_true",
        help="the tool also calls the demo MCP server's add (stdio) once approved",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.parked, args.batch, args.every = 4.0, 50, 20, 1.0
    return args


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
