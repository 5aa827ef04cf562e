"""Overhead and throughput of toolnexus_async against a hand-written raw-aiohttp floor.

Run it with ``nox -s bench`` or ``python benchmarks/overhead.py`` (``--help`` for the knobs,
``--quick`` for a smoke run of a few seconds). Every figure that matters is a ratio against
the floor measured in the same process, on the same event loop, in the same minute, so the
figures travel between machines better than absolute milliseconds do.

The scenario is the standard agent run of issue 2, item 9, against an OpenAI-style mock:

- turn 1 (the request carries no tool message yet): the model asks for two parallel tool
  calls, ``get_weather(city)`` and ``add(a, b)``;
- turn 2 (tool results present): the model answers with a final text built from those
  results, so a wrong or missing tool result shows up as a wrong answer, not as a fast run.

Two contenders do that run:

- **toolnexus_async**: ``LlmClient(base_url, style="openai", ...)`` and a ``Toolkit`` of the
  two ``define_tool`` tools, ``await client.run(prompt, toolkit)``;
- **floor**: what a person would write by hand with no framework: one shared
  ``aiohttp.ClientSession``, the same two POSTs, ``json.dumps``/``json.loads``, the two tool
  functions awaited directly, the second request's messages built by hand.

Part 1, *overhead*: N runs of each, interleaved ABAB on one event loop (so machine noise hits
both alike), with 0 ms of simulated model latency; p50/p95 per run and the p50 ratio.
Target: p50 ratio <= 1.2.

Part 2, *throughput*: rounds of C concurrent runs (anyio task group) against the mock with
20 ms of simulated latency, alternating toolnexus / floor round by round; runs per second
and the ratio. toolnexus uses its default pool (``AiohttpTransport()``: at most 1000
connections; ``--max-connections`` sets another cap, ``none`` for no cap), the floor a pool
without a cap (``aiohttp.TCPConnector(limit=0)``). Target: ratio >= 0.8.
``--compare-uncapped`` adds a third contender, alternated with the two: toolnexus with
``AiohttpTransport(max_connections=None)`` (the default before the pool had a cap), with its
own ratio to the floor.

``--processes N`` runs the throughput part's rounds in N fresh processes, one after another,
and pools their round pairs: how a process happens to lay out its memory moves its ratio by
more than the rounds within it do (0.81 to 0.99 across twelve processes of one tree, see
docs/performance.md), so one process cannot tell 0.85 from 0.88.

``--tracing`` traces every toolnexus run (``LlmClient(tracing=Tracing(...))``) through the
OpenTelemetry SDK: a ``TracerProvider`` whose ``BatchSpanProcessor`` hands the spans to an
exporter that drops them, so the figures are what making and exporting spans costs, without
a collector's.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import anyio
from _common import percentile, print_footer, print_header, verdict
from _mock import API_KEY, MODEL, MockServer

from toolnexus_async import AiohttpTransport, LlmClient, Toolkit, Tracing, define_tool

PROMPT = "What is the weather in Paris, and what is 2 + 3?"
EXPECTED_TEXT = "Paris: 21 C, clear | 5"
P50_TARGET = 1.2
THROUGHPUT_TARGET = 0.8
_SCRIPT = __file__


# --------------------------------------------------------------------------------------
# The tools. The floor calls these functions directly; toolnexus wraps them with define_tool.


async def get_weather(city: str) -> str:
    """The current weather in a city.

    Args:
        city: the city's name.
    """
    return f"{city}: 21 C, clear"


async def add(a: int, b: int) -> str:
    """Add two integers.

    Args:
        a: the first addend.
        b: the second addend.
    """
    return str(a + b)


# What the floor sends as ``tools``, written by hand. ``check_same_schema`` asserts at start-up
# that it equals what the toolkit renders, so both contenders send the same bytes' worth of
# tool schema on every request.
FLOOR_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "the city's name."}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "description": "the first addend."},
                    "b": {"type": "integer", "description": "the second addend."},
                },
                "required": ["a", "b"],
                "additionalProperties": False,
            },
        },
    },
]


def make_toolkit() -> Toolkit:
    # builtins=False: the built-in ``question`` tool would add its schema to every request
    # body, and the floor would then have to send it too for the bytes to match.
    return Toolkit.create(builtins=False, extra_tools=[define_tool(get_weather), define_tool(add)])


def check_same_schema(toolkit: Toolkit) -> None:
    if toolkit.to_openai() != FLOOR_TOOLS:
        raise SystemExit(
            "the floor's hand-written tool schema differs from the toolkit's:\n"
            f"{json.dumps(toolkit.to_openai(), indent=1)}"
        )


# --------------------------------------------------------------------------------------
# The two contenders. Each is a zero-argument coroutine function returning the final text.

RunOnce = Callable[[], Awaitable[str]]


def toolnexus_runner(client: LlmClient, toolkit: Toolkit) -> RunOnce:
    async def run_once() -> str:
        result = await client.run(PROMPT, toolkit)
        if result.status != "done":
            raise RuntimeError(f"toolnexus run ended {result.status!r}")
        return result.text

    return run_once


def floor_session() -> aiohttp.ClientSession:
    # No connection cap (what a hand-written client has unless it sets one) and the 600 s
    # total timeout the client's own session gets.
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600))


def floor_runner(session: aiohttp.ClientSession, base_url: str) -> RunOnce:
    url = base_url + "/chat/completions"
    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    functions: dict[str, Callable[..., Awaitable[str]]] = {"get_weather": get_weather, "add": add}

    async def post(messages: list[dict[str, Any]]) -> dict[str, Any]:
        body = {"model": MODEL, "messages": messages, "tools": FLOOR_TOOLS}
        data = json.dumps(body, separators=(",", ":")).encode()
        async with session.post(url, data=data, headers=headers) as response:
            raw = await response.read()
            if response.status != 200:
                raise RuntimeError(f"floor: HTTP {response.status}")
        reply: dict[str, Any] = json.loads(raw)
        message: dict[str, Any] = reply["choices"][0]["message"]
        return message

    async def run_once() -> str:
        messages: list[dict[str, Any]] = [{"role": "user", "content": PROMPT}]
        assistant = await post(messages)
        messages.append(assistant)
        for call in assistant["tool_calls"]:
            function = call["function"]
            output = await functions[function["name"]](**json.loads(function["arguments"]))
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
        final = await post(messages)
        text: str = final["content"]
        return text

    return run_once


# --------------------------------------------------------------------------------------
# Measurement.


@dataclass
class Latencies:
    name: str
    seconds: list[float]

    def p(self, q: float) -> float:
        return percentile(sorted(self.seconds), q)

    def line(self) -> str:
        return (
            f"  {self.name:<16} p50 {self.p(50) * 1000:7.3f} ms   p95 {self.p(95) * 1000:7.3f} ms"
            f"   mean {statistics.fmean(self.seconds) * 1000:7.3f} ms   (n={len(self.seconds)})"
        )


def check_text(name: str, text: str) -> None:
    if text != EXPECTED_TEXT:
        raise SystemExit(f"{name} answered {text!r}, expected {EXPECTED_TEXT!r}")


async def measure_overhead(
    base_url: str, runs: int, warmup: int, tracing: Tracing | None = None
) -> tuple[Latencies, Latencies]:
    toolkit = make_toolkit()
    check_same_schema(toolkit)
    async with (
        http_client(base_url, tracing=tracing) as client,
        floor_session() as session,
    ):
        contenders = [
            ("toolnexus_async", toolnexus_runner(client, toolkit)),
            ("floor", floor_runner(session, base_url)),
        ]
        for name, run_once in contenders:
            for _ in range(warmup):
                check_text(name, await run_once())
        timings: list[list[float]] = [[], []]
        clock = time.perf_counter
        gc.collect()
        for _ in range(runs):
            # ABAB...: each pair runs back to back, so drift and noise hit both alike.
            for (name, run_once), out in zip(contenders, timings, strict=True):
                start = clock()
                text = await run_once()
                out.append(clock() - start)
                check_text(name, text)
    return Latencies("toolnexus_async", timings[0]), Latencies("floor", timings[1])


@dataclass
class Round:
    runs: int
    seconds: float  # wall clock
    cpu_seconds: float  # this process only: the client's work, whatever else the machine does


async def one_round(run_once: RunOnce, concurrency: int, runs_per_task: int) -> Round:
    """``concurrency`` tasks, each doing ``runs_per_task`` runs back to back."""
    failures: list[str] = []

    async def worker() -> None:
        for _ in range(runs_per_task):
            text = await run_once()
            if text != EXPECTED_TEXT:
                failures.append(text)

    # Collect the previous round's garbage now, untimed, so that no round pays for the
    # collections its predecessor (possibly the other contender) made necessary.
    gc.collect()
    cpu_start = time.process_time()
    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(worker)
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    if failures:
        raise SystemExit(f"{len(failures)} runs answered wrongly, e.g. {failures[0]!r}")
    return Round(concurrency * runs_per_task, elapsed, cpu)


@dataclass
class Throughput:
    name: str
    rounds: list[Round]

    @property
    def rates(self) -> list[float]:
        return [r.runs / r.seconds for r in self.rounds]

    @property
    def median(self) -> float:
        return statistics.median(self.rates)

    def paired(self, floor: Throughput) -> float:
        """The median of this contender's rate over the floor's, round by round (the pairs
        the alternation makes)."""
        return statistics.median(a / b for a, b in zip(self.rates, floor.rates, strict=True))

    @property
    def cpu_per_run(self) -> float:
        return sum(r.cpu_seconds for r in self.rounds) / sum(r.runs for r in self.rounds)

    def line(self) -> str:
        return (
            f"  {self.name:<16} median {self.median:6.0f} runs/s   best {max(self.rates):6.0f}"
            f"   client CPU {self.cpu_per_run * 1e6:5.0f} us/run"
            f"   rounds: {', '.join(f'{r:.0f}' for r in self.rates)}"
        )


def http_client(
    base_url: str, transport: AiohttpTransport | None = None, tracing: Tracing | None = None
) -> LlmClient:
    return LlmClient(
        base_url, style="openai", model=MODEL, api_key=API_KEY, transport=transport, tracing=tracing
    )


def sdk_tracing() -> Tracing:
    """Tracing through the OpenTelemetry SDK, batched, to an exporter that drops the spans."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Drop(SpanExporter):
        def export(self, spans):  # type: ignore[no-untyped-def]
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Drop()))
    return Tracing(tracer_provider=provider)


async def measure_throughput(
    server: MockServer,
    concurrency: int,
    runs_per_task: int,
    rounds: int,
    cap: int | str | None,
    compare_uncapped: bool,
    tracing: Tracing | None = None,
) -> tuple[list[Throughput], float, float]:
    """Runs/s of each contender (the floor last), plus the mock's CPU seconds and wall
    seconds while timed. ``cap``: the toolnexus transport's max_connections, or "default"."""
    base_url = server.base_url
    toolkit = make_toolkit()
    transport = None if isinstance(cap, str) else AiohttpTransport(max_connections=cap)
    async with (
        http_client(base_url, transport, tracing) as client,
        http_client(base_url, AiohttpTransport(max_connections=None), tracing) as uncapped,
        floor_session() as session,
    ):
        contenders = [Throughput("toolnexus_async", [])]
        runners = [toolnexus_runner(client, toolkit)]
        if compare_uncapped:
            contenders.append(Throughput("tn no pool cap", []))
            runners.append(toolnexus_runner(uncapped, toolkit))
        contenders.append(Throughput("floor", []))
        runners.append(floor_runner(session, base_url))
        # Warm-up round each: opens the pools' connections and warms every code path.
        for run_once in runners:
            await one_round(run_once, concurrency, 1)
        server_cpu = 0.0
        wall = 0.0
        for _ in range(rounds):
            for contender, run_once in zip(contenders, runners, strict=True):
                cpu_before = server.cpu_seconds()
                measured = await one_round(run_once, concurrency, runs_per_task)
                server_cpu += server.cpu_seconds() - cpu_before
                wall += measured.seconds
                contender.rounds.append(measured)
    return contenders, server_cpu, wall


def _forwarded(args: argparse.Namespace) -> list[str]:
    """The throughput part's options, for a child process to run it with."""
    argv = [
        f"--concurrency={args.concurrency}",
        f"--runs-per-task={args.runs_per_task}",
        f"--rounds={args.rounds}",
        f"--throughput-latency-ms={args.throughput_latency_ms}",
        f"--max-connections={'none' if args.max_connections is None else args.max_connections}",
    ]
    if args.compare_uncapped:
        argv.append("--compare-uncapped")
    if args.tracing:
        argv.append("--tracing")
    return argv


def throughput_in_processes(
    args: argparse.Namespace,
) -> tuple[list[Throughput], float, float, list[float]]:
    """The throughput part run ``args.processes`` times, each in a fresh process, one after
    another: the contenders' rounds pooled (in order, so that pairs stay pairs), the mock's
    CPU and wall seconds summed, and each process's median of round pairs."""
    pooled: list[Throughput] = []
    server_cpu = wall = 0.0
    per_process: list[float] = []
    for _ in range(args.processes):
        done = subprocess.run(
            [sys.executable, _SCRIPT, "--throughput-child", *_forwarded(args)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"a throughput process failed:\n{done.stderr[-2000:]}")
        report = json.loads(done.stdout.splitlines()[-1])
        measured = [
            Throughput(name, [Round(*r) for r in rounds]) for name, rounds in report["contenders"]
        ]
        if not pooled:
            pooled = [Throughput(t.name, []) for t in measured]
        for into, t in zip(pooled, measured, strict=True):
            into.rounds.extend(t.rounds)
        server_cpu += report["server_cpu"]
        wall += report["wall"]
        per_process.append(measured[0].paired(measured[-1]))
    return pooled, server_cpu, wall, per_process


async def throughput_here(
    args: argparse.Namespace, tracing: Tracing | None
) -> tuple[list[Throughput], float, float]:
    """The throughput part in this process, against a mock of its own."""
    with MockServer(args.throughput_latency_ms) as server:
        return await measure_throughput(
            server,
            args.concurrency,
            args.runs_per_task,
            args.rounds,
            args.max_connections,
            args.compare_uncapped,
            tracing,
        )


async def throughput_child(args: argparse.Namespace) -> None:
    """``--throughput-child``: the throughput part alone, its rounds printed as JSON."""
    tracing = sdk_tracing() if args.tracing else None
    contenders, server_cpu, wall = await throughput_here(args, tracing)
    rounds = [[t.name, [[r.runs, r.seconds, r.cpu_seconds] for r in t.rounds]] for t in contenders]
    print(json.dumps({"contenders": rounds, "server_cpu": server_cpu, "wall": wall}))


# --------------------------------------------------------------------------------------
# The command line.


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="toolnexus_async overhead and throughput against a raw-aiohttp floor."
    )
    parser.add_argument("--runs", type=int, default=2000, help="timed runs per contender")
    parser.add_argument("--warmup", type=int, default=200, help="untimed runs per contender")
    parser.add_argument(
        "--latency-ms", type=float, default=0.0, help="mock latency for the overhead part"
    )
    parser.add_argument("--concurrency", type=int, default=500, help="concurrent runs")
    parser.add_argument(
        "--runs-per-task",
        type=int,
        default=4,
        help="runs each concurrent task does back to back in a throughput round",
    )
    parser.add_argument("--rounds", type=int, default=8, help="throughput rounds per contender")
    parser.add_argument(
        "--throughput-latency-ms",
        type=float,
        default=20.0,
        help="mock latency for the throughput part",
    )
    parser.add_argument(
        "--max-connections",
        default="default",
        help="the toolnexus transport's max_connections in the throughput part: a number,"
        " none (no cap), or default (AiohttpTransport's own)",
    )
    parser.add_argument(
        "--compare-uncapped",
        action="store_true",
        help="throughput part: also run toolnexus with max_connections=None, alternated",
    )
    parser.add_argument(
        "--tracing",
        action="store_true",
        help="trace the toolnexus runs through the OpenTelemetry SDK (spans made, batched and "
        "dropped by the exporter)",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="throughput part: run its rounds in this many fresh processes, one after another,"
        " and pool their round pairs",
    )
    parser.add_argument("--throughput-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run of a few seconds (small sizes)"
    )
    args = parser.parse_args(argv)
    if args.max_connections == "none":
        args.max_connections = None
    elif args.max_connections != "default":
        try:
            args.max_connections = int(args.max_connections)
        except ValueError:
            parser.error("--max-connections must be a number, none or default")
    if args.quick:
        args.runs, args.warmup = 200, 20
        args.concurrency, args.runs_per_task, args.rounds = 50, 1, 2
    for name in ("runs", "warmup", "concurrency", "runs_per_task", "rounds", "processes"):
        if getattr(args, name) < (0 if name == "warmup" else 1):
            parser.error(f"--{name.replace('_', '-')} is too small")
    return args


async def main(args: argparse.Namespace) -> None:
    if args.throughput_child:
        await throughput_child(args)
        return
    print_header("aiohttp", "anyio")
    tracing = sdk_tracing() if args.tracing else None
    if tracing is not None:
        print("toolnexus_async runs are traced: OpenTelemetry SDK, batched, spans dropped")

    print(
        f"overhead: {args.runs} interleaved runs each after {args.warmup} warm-up runs, "
        f"mock latency {args.latency_ms:g} ms"
    )
    with MockServer(args.latency_ms) as server:
        tn, floor = await measure_overhead(server.base_url, args.runs, args.warmup, tracing)
    p50_ratio = tn.p(50) / floor.p(50)
    print(tn.line())
    print(floor.line())
    print(
        f"  ratio toolnexus/floor: p50 {p50_ratio:.3f}, p95 {tn.p(95) / floor.p(95):.3f}   "
        f"(target p50 <= {P50_TARGET}: {verdict(p50_ratio <= P50_TARGET)})"
    )
    print()

    print(
        f"throughput: {args.concurrency} concurrent tasks x {args.runs_per_task} runs per round, "
        f"{args.rounds} rounds each (alternating), mock latency {args.throughput_latency_ms:g} ms"
        + (f", in {args.processes} processes (pooled)" if args.processes > 1 else "")
    )
    cap = args.max_connections
    print(
        "  toolnexus_async pool: "
        + ("AiohttpTransport() defaults" if cap == "default" else f"max_connections={cap}")
    )
    per_process: list[float] = []
    if args.processes > 1:
        contenders, server_cpu, wall, per_process = throughput_in_processes(args)
    else:
        contenders, server_cpu, wall = await throughput_here(args, tracing)
    *tns, floor_rate = contenders
    for rate in (*tns, floor_rate):
        print(rate.line())
    print(f"  mock server CPU while timed: {server_cpu / wall:.0%} of one core")
    for tn_rate in tns:
        rate_ratio = tn_rate.median / floor_rate.median
        paired = tn_rate.paired(floor_rate)
        label = "toolnexus" if tn_rate is tns[0] else "no pool cap"
        print(
            f"  ratio {label}/floor: median runs/s {rate_ratio:.3f}   "
            f"(target >= {THROUGHPUT_TARGET}: {verdict(rate_ratio >= THROUGHPUT_TARGET)});"
            f"   median of round pairs {paired:.3f};"
            f"   CPU per run {tn_rate.cpu_per_run / floor_rate.cpu_per_run:.3f}"
        )
    if per_process:
        print(
            "  each process's median of round pairs (toolnexus/floor): "
            + ", ".join(f"{r:.3f}" for r in per_process)
            + f"; their median {statistics.median(per_process):.3f}"
        )
    print_footer()


if __name__ == "__main__":
    anyio.run(main, parse_args(), backend="asyncio")
