"""Part 1c of ``park.py``, ``--model http``: the hot parking of part 1 with the model behind HTTP.

Imported by ``park.py`` (run as a script, so this directory is on ``sys.path``). The same
N runs, the same harness (``_park_hot.park_and_wake``) and the same ``Inbox`` as part 1,
but the client is ``LlmClient(base_url, style="openai", ...)`` talking to the mock provider
of ``overhead.py`` (``_mock.MockServer``, a process of its own, no latency) over loopback:
turn 1 is a POST whose reply calls ``pay_invoice``, the tool parks on the inbox, and once
answered turn 2 is a second POST whose reply is the final text. Every run opens its
requests through the client's default transport (``AiohttpTransport()``, or
``--max-connections``), so what the pool keeps open while the runs are parked is
measured, not assumed:

- open sockets: the entries of ``/proc/self/fd`` that are sockets, less those open before
  the first run (the event loop's self-pipe, the mock's pipe), counted once all runs are
  parked (after the harness's ``gc.collect()``) and sampled every 100 ms from the first run
  started to the last one done (the peak); the sampling costs this process a few per cent;
- the mock's CPU while the runs park and while they are woken, as a share of one core, so
  that a saturated mock is visible;
- a floor for the HTTP part alone: N bare aiohttp POSTs of turn 1's body, all started at
  once on a session with the same connection cap, against the same mock; requests per
  second. A run's park costs one such request and its wake-up (to done) another, so this is
  the ceiling of both rates.

The process's soft ``RLIMIT_NOFILE`` is raised to the hard limit first (printed), so that a
run of the old unbounded pool fails on the pool, not on a low default.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import time
from typing import Self

import aiohttp
import anyio
import anyio.abc
from _common import PROMPT, dist_version, expected_text, verdict
from _mock import API_KEY, MODEL, MockServer
from _park_hot import HotFigures, Probe, Toolnexus, make_tool, ms, park_and_wake, print_hot

from toolnexus_async import AiohttpTransport, Inbox, LlmClient, Toolkit
from toolnexus_async._io.transport import DEFAULT_MAX_CONNECTIONS

SAMPLE_EVERY = 0.1  # seconds between two counts of the open sockets


def raise_nofile() -> tuple[int, int]:
    """The soft limit on open files raised to the hard one; (soft, hard) afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def open_sockets() -> int:
    """How many of this process's file descriptors are sockets; 0 when none is left to
    look (EMFILE: the runs say so themselves, with their errors)."""
    count = 0
    try:
        entries = os.scandir("/proc/self/fd")
    except OSError:
        return 0
    with entries:
        for entry in entries:
            with contextlib.suppress(OSError):  # the scandir's own fd, gone by now
                if os.readlink(entry.path).startswith("socket:"):
                    count += 1
    return count


class HttpToolnexus(Toolnexus):
    """The hot contender with its model behind HTTP: ``LlmClient(base_url, ...)`` on the
    mock, ``wait_for`` one ``Inbox``. A run that raises is counted as a failure (with its
    error), so that a pool or descriptor failure stops the harness with its message."""

    def __init__(self, probe: Probe, server: MockServer, max_connections: int | None) -> None:
        super().__init__(probe)
        self.name = "toolnexus_async, model over HTTP"
        self.server = server
        self.inbox = Inbox()
        transport = (
            AiohttpTransport()
            if max_connections == DEFAULT_MAX_CONNECTIONS
            else AiohttpTransport(max_connections=max_connections)
        )
        self.client = LlmClient(
            server.park_url,
            style="openai",
            model=MODEL,
            api_key=API_KEY,
            wait_for=self.inbox,
            transport=transport,
        )
        self.toolkit = Toolkit.create(builtins=False, extra_tools=[make_tool(probe)])
        # Counts of sockets, less those open before the first run (the loop's self-pipe, the
        # mock's pipe): the runs' own.
        self.sockets_before = 0
        self.sockets_parked = 0
        self.sockets_peak = 0
        # (this process's CPU, the mock's CPU, wall clock): at the start, once parked, at
        # the end.
        self.marks: list[tuple[float, float, float]] = []
        self._group: anyio.abc.TaskGroup | None = None

    def mark(self) -> None:
        self.marks.append((time.process_time(), self.server.cpu_seconds(), time.perf_counter()))

    async def __aenter__(self) -> Self:
        self._group = anyio.create_task_group()
        await self._group.__aenter__()
        self.sockets_before = open_sockets()
        self._group.start_soon(self._sample)
        self.mark()
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._group is not None
        self._group.cancel_scope.cancel()
        await self._group.__aexit__(None, None, None)
        await self.client.aclose()

    async def _sample(self) -> None:
        while True:
            self.sockets_peak = max(self.sockets_peak, self.sockets())
            await anyio.sleep(SAMPLE_EVERY)

    def sockets(self) -> int:
        return open_sockets() - self.sockets_before

    async def run(self, n: int) -> None:
        try:
            result = await self.client.run(PROMPT.format(n=n), self.toolkit)
        except Exception as exc:
            self.wrong.append(f"run {n} raised {exc!r}")
            return
        if result.status != "done" or result.text != expected_text(n):
            self.wrong.append(f"run {n}: {result.status} {result.text!r}")

    def verify_parked(self, runs: int) -> None:
        self.sockets_parked = self.sockets()
        self.sockets_peak = max(self.sockets_peak, self.sockets_parked)
        self.mark()

    def verify_answered(self, runs: int) -> None:
        self.sockets_peak = max(self.sockets_peak, self.sockets())
        self.mark()


async def http_floor(server: MockServer, runs: int, max_connections: int | None) -> float:
    """Requests per second of ``runs`` bare aiohttp POSTs of turn 1, all started at once."""
    url = server.park_url + "/chat/completions"
    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=max_connections or 0, limit_per_host=0)
    failures: list[str] = []
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=600)
    ) as session:

        async def post(n: int) -> None:
            body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT.format(n=n)}]}
            data = json.dumps(body, separators=(",", ":")).encode()
            async with session.post(url, data=data, headers=headers) as response:
                reply = json.loads(await response.read())
            if reply["choices"][0]["finish_reason"] != "tool_calls":
                failures.append(f"request {n}: {reply!r}")

        start = time.perf_counter()
        async with asyncio.TaskGroup() as group:
            for n in range(runs):
                group.create_task(post(n))
        seconds = time.perf_counter() - start
    if failures:
        raise SystemExit(f"http floor: {len(failures)} wrong replies, e.g. {failures[0]}")
    return runs / seconds


def ratio_line(label: str, value: float, base: float, unit: str) -> str:
    return f"    {label:<26} {value:>12,.1f} / {base:>12,.1f} {unit:<8} = {value / base:.2f}"


async def park_http(
    runs: int,
    sample: int,
    spawner: str,
    max_connections: int | None,
    in_process: HotFigures,
    targets: tuple[float, float, float, float],
    lever: str = "off",
) -> None:
    """Part 1c: park and wake ``runs`` runs with the model over HTTP, and print it all next
    to ``in_process`` (part 1's toolnexus figures of the same GC ``lever``, this
    process)."""
    soft, hard = raise_nofile()
    bytes_target, park_target, answer_target, p99_target = targets
    cap = "no cap" if max_connections is None else f"max_connections={max_connections}"
    default = " (the default)" if max_connections == DEFAULT_MAX_CONNECTIONS else ""
    print(
        f"hot parking, model over HTTP: the same {runs:,} runs, LlmClient(base_url) on the"
        f" loopback mock of overhead.py (own process, no latency), AiohttpTransport {cap}"
        f"{default}, aiohttp {dist_version('aiohttp')}, gc lever {lever}; RLIMIT_NOFILE soft"
        f" {soft:,} / hard {hard:,}"
    )
    with MockServer(0.0) as server:
        made: list[HttpToolnexus] = []

        def make(probe: Probe) -> HttpToolnexus:
            made.append(HttpToolnexus(probe, server, max_connections))
            return made[-1]

        figures = await park_and_wake(make, runs, sample, spawner, lever)
        floor_rate = await http_floor(server, runs, max_connections)
    tn = made[0]
    print_hot(figures)
    (p0, s0, w0), (p1, s1, w1), (p2, s2, w2) = tn.marks
    print(
        f"    sockets   {tn.sockets_parked:,} open while {runs:,} parked; peak {tn.sockets_peak:,}"
        f" (sampled every {SAMPLE_EVERY * 1000:g} ms from the first run to the last; besides"
        f" the {tn.sockets_before} open before the first run)"
    )
    print(
        f"    CPU       parking: this process {(p1 - p0) / (w1 - w0):.0%}, the mock"
        f" {(s1 - s0) / (w1 - w0):.0%} of one core; waking: this process"
        f" {(p2 - p1) / (w2 - w1):.0%}, the mock {(s2 - s1) / (w2 - w1):.0%}"
    )
    print(
        f"  http floor: {runs:,} bare aiohttp POSTs of turn 1 at once, same cap:"
        f" {floor_rate:,.0f} requests/s"
    )
    print("  over HTTP / in-process (toolnexus_async, this process):")
    print(
        ratio_line("bytes per parked run", figures.bytes_per_run, in_process.bytes_per_run, "bytes")
    )
    print(ratio_line("parks per second", figures.park_rate, in_process.park_rate, "/s"))
    print(ratio_line("answer() calls/s", figures.answer_rate, in_process.answer_rate, "/s"))
    print(
        ratio_line("wake all, runs done/s", figures.wake_all_rate, in_process.wake_all_rate, "/s")
    )
    print(
        ratio_line(
            "wake p99 (one at a time)", figures.sample.p99 * 1e6, in_process.sample.p99 * 1e6, "us"
        )
    )
    print("  over HTTP / http floor:")
    print(ratio_line("parks per second", figures.park_rate, floor_rate, "/s"))
    print(ratio_line("wake all, runs done/s", figures.wake_all_rate, floor_rate, "/s"))
    p99 = figures.sample.p99
    bound = max_connections if max_connections is not None else runs
    print("  targets (toolnexus_async, model over HTTP):")
    print(
        f"    open sockets <= the pool cap ({bound:,}):"
        f" {tn.sockets_parked:,} parked, peak {tn.sockets_peak:,}"
        f"   {verdict(tn.sockets_peak <= bound)}"
    )
    print(
        f"    <= {bytes_target:,.0f} bytes per parked run: {figures.bytes_per_run:,.0f}"
        f"   {verdict(figures.bytes_per_run <= bytes_target)}"
    )
    print(
        f"    >= {park_target:,.0f} parks/s: {figures.park_rate:,.0f}"
        f"   {verdict(figures.park_rate >= park_target)}"
    )
    print(
        f"    >= {answer_target:,.0f} answers/s: answer() calls {figures.answer_rate:,.0f}"
        f"   {verdict(figures.answer_rate >= answer_target)};"
        f" until all runs done {figures.wake_all_rate:,.0f}"
        f"   {verdict(figures.wake_all_rate >= answer_target)}"
    )
    print(
        f"    p99 wake < {p99_target * 1000:g} ms while {runs:,} parked: {ms(p99)}"
        f"   {verdict(p99 < p99_target)}"
    )
