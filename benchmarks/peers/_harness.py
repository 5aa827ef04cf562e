"""What every runner of ``benchmarks/peers/`` shares: the scenario, the measurements, the output.

Standard library only: it is imported by runners that execute in the peers' own virtual
environments (``nox -s bench-peers`` creates them), where neither toolnexus_async nor
aiohttp is installed, and by the two runners of the project's environment (our client and
the floor). A runner is a script: ``python run_<name>.py MODE [options]`` does a warm-up and
one measurement and prints one JSON line on stdout; ``run.py`` starts them, round-robin.

The scenario is ``benchmarks/overhead.py``'s (see its docstring), against the same
OpenAI-style mock (started once by ``run.py``): turn 1 the model asks for ``get_weather``
and ``add`` in parallel, turn 2 it answers with the tool outputs joined by `` | ``; every run's
final text is checked, so a wrong run cannot look fast.

For the parking mode the ``add`` call needs a human's approval: the run parks (or, for the
frameworks whose approval ends the run, returns with the state it needs to go on), and a
wake answers "approved", the framework runs ``add`` and the final turn.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import ctypes.util
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Protocol

MODEL = "bench-model"
API_KEY = "sk-bench-not-a-secret"
PROMPT = "What is the weather in Paris, and what is 2 + 3?"
EXPECTED_TEXT = "Paris: 21 C, clear | 5"

WEATHER_DOC = "The current weather in a city."
ADD_DOC = "Add two integers."


def weather(city: str) -> str:
    return f"{city}: 21 C, clear"


def addition(a: int, b: int) -> str:
    return str(a + b)


clock = time.perf_counter


class Peer(Protocol):
    """One framework's side. ``park``/``wake`` are only called when ``parks`` is true."""

    name: str
    packages: tuple[str, ...]  # distributions whose versions the result reports
    parks: bool
    mechanism: str  # what "parked" means for this framework, one line

    async def start(self, base_url: str) -> None: ...

    async def close(self) -> None: ...

    async def run_once(self) -> str:
        """One run of the scenario; the final text."""
        ...

    async def park(self, n: int) -> None:
        """Take run ``n`` up to its pending approval of ``add``; return once it waits."""
        ...

    async def wake(self, n: int) -> str:
        """Approve run ``n``'s ``add`` and finish the run; its final text."""
        ...

    def continued_at(self, n: int) -> float:
        """``clock()`` when run ``n``'s approved ``add`` ran (after its approval)."""
        ...


def check(text: str) -> None:
    if text != EXPECTED_TEXT:
        raise SystemExit(f"a run answered {text!r}, expected {EXPECTED_TEXT!r}")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


# --------------------------------------------------------------------------------------
# Memory, read as park.py reads it: the resident set after a full collection, with glibc's
# free heap handed back first.

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
_libc: Any = None


def settled_rss() -> int:
    global _libc
    gc.collect()
    if _libc is None:
        name = ctypes.util.find_library("c")
        _libc = ctypes.CDLL(name) if name else False
    if _libc and hasattr(_libc, "malloc_trim"):
        _libc.malloc_trim(0)
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE_SIZE


# --------------------------------------------------------------------------------------
# The measurements.


async def sequential(peer: Peer, runs: int, warmup: int) -> dict[str, Any]:
    for _ in range(warmup):
        check(await peer.run_once())
    seconds: list[float] = []
    gc.collect()
    for _ in range(runs):
        start = clock()
        text = await peer.run_once()
        seconds.append(clock() - start)
        check(text)
    return {
        "runs": runs,
        "p50_s": percentile(seconds, 50),
        "p95_s": percentile(seconds, 95),
        "mean_s": statistics.fmean(seconds),
    }


async def _round(peer: Peer, concurrency: int, runs_per_task: int) -> tuple[float, float]:
    """Wall and CPU seconds of ``concurrency`` tasks doing ``runs_per_task`` runs each."""
    failures: list[str] = []

    async def worker() -> None:
        for _ in range(runs_per_task):
            text = await peer.run_once()
            if text != EXPECTED_TEXT:
                failures.append(text)

    gc.collect()
    cpu = time.process_time()
    start = clock()
    async with asyncio.TaskGroup() as tg:
        for _ in range(concurrency):
            tg.create_task(worker())
    wall = clock() - start
    cpu = time.process_time() - cpu
    if failures:
        raise SystemExit(f"{len(failures)} runs answered wrongly, e.g. {failures[0]!r}")
    return wall, cpu


async def throughput(
    peer: Peer, concurrency: int, runs_per_task: int, rounds: int
) -> dict[str, Any]:
    # Warm-up: every code path once, and a pool of up to 100 connections open (a full round
    # of C runs would cost the slowest peers minutes at C = 2,000).
    await _round(peer, min(concurrency, 100), 1)
    rates: list[float] = []
    cpu_total = 0.0
    for _ in range(rounds):
        wall, cpu = await _round(peer, concurrency, runs_per_task)
        rates.append(concurrency * runs_per_task / wall)
        cpu_total += cpu
    runs = concurrency * runs_per_task * rounds
    return {
        "concurrency": concurrency,
        "runs": runs,
        "runs_per_s": statistics.median(rates),
        "rates": rates,
        "cpu_per_run_s": cpu_total / runs,
    }


async def parking(peer: Peer, parked: int, sample: int, batch: int) -> dict[str, Any]:
    """Park ``parked`` runs, ``batch`` at a time; RSS delta per run; then wake a sample.

    The sample is spread evenly over the parked runs and woken one at a time while the others
    stay parked: ``continue`` is from the answer to the approved tool running, ``done`` to
    the run's final text.
    """
    # Warm-up: a few full cycles, so that code paths, caches and the pool exist before the
    # baseline reading (runs numbered from ``parked`` up do not collide with the measured).
    for n in range(parked, parked + 5):
        await peer.park(n)
        check(await peer.wake(n))
    before = settled_rss()
    start = clock()
    for first in range(0, parked, batch):
        async with asyncio.TaskGroup() as tg:
            for n in range(first, min(first + batch, parked)):
                tg.create_task(peer.park(n))
    park_seconds = clock() - start
    after = settled_rss()
    step = max(1, parked // sample)
    chosen = list(range(0, parked, step))[:sample]
    cont: list[float] = []
    done: list[float] = []
    for n in chosen:
        answered = clock()
        text = await peer.wake(n)
        finished = clock()
        check(text)
        cont.append(peer.continued_at(n) - answered)
        done.append(finished - answered)
    return {
        "parked": parked,
        "park_seconds": park_seconds,
        "rss_before": before,
        "rss_after": after,
        "bytes_per_parked_run": (after - before) / parked,
        "woken": len(chosen),
        "continue_p50_s": percentile(cont, 50),
        "continue_p99_s": percentile(cont, 99),
        "done_p50_s": percentile(done, 50),
        "done_p99_s": percentile(done, 99),
    }


async def _in_batches(action: Any, count: int, batch: int, start: int = 0) -> tuple[float, float]:
    """Wall and CPU seconds of ``action(n)`` for ``start`` <= n < ``start + count``,
    ``batch`` at a time."""
    cpu = time.process_time()
    began = clock()
    end = start + count
    for first in range(start, end, batch):
        async with asyncio.TaskGroup() as tg:
            for n in range(first, min(first + batch, end)):
                tg.create_task(action(n))
    return clock() - began, time.process_time() - cpu


async def park_rate(peer: Peer, parked: int, batch: int) -> dict[str, Any]:
    """Park ``parked`` runs, then wake them all, ``batch`` at a time: the rates, and this
    process's CPU per park and per wake (``time.process_time``, which the other processes
    of a busy machine move far less than they move the wall clock).

    A park is turn 1's request and the run up to its pending approval; a wake is the
    answer, the approved ``add`` and turn 2's request, to the run's final text. The
    resident set's growth per parked run is read between the two (untimed).
    """
    for n in range(parked, parked + 5):  # warm-up, as in parking()
        await peer.park(n)
        check(await peer.wake(n))
    before = settled_rss()
    park_wall, park_cpu = await _in_batches(peer.park, parked, batch)
    after = settled_rss()
    texts: list[str] = []

    async def wake(n: int) -> None:
        texts.append(await peer.wake(n))

    gc.collect()
    wake_wall, wake_cpu = await _in_batches(wake, parked, batch)
    # Each wake's moment of continuing is not read here (the wakes overlap).
    getattr(peer, "continued", {}).clear()
    wrong = [text for text in texts if text != EXPECTED_TEXT]
    if len(texts) != parked or wrong:
        raise SystemExit(f"{len(texts)} of {parked} runs woke, {len(wrong)} wrongly")
    return {
        "parked": parked,
        "batch": batch,
        "bytes_per_parked_run": (after - before) / parked,
        "park_seconds": park_wall,
        "wake_seconds": wake_wall,
        "parks_per_s": parked / park_wall,
        "wakes_per_s": parked / wake_wall,
        "cpu_per_park_s": park_cpu / parked,
        "cpu_per_wake_s": wake_cpu / parked,
        "park_cpu_share": park_cpu / park_wall,
        "wake_cpu_share": wake_cpu / wake_wall,
    }


def _mark(marks: list[list[int]]) -> None:
    """End a part of the callgrind count here (``park_rate.py --callgrind`` runs the process
    with ``--dump-before=getppid``: nothing else here calls it), noting the collections of
    each generation so far, so that each part can be told which collections fell in it."""
    marks.append([generation["collections"] for generation in gc.get_stats()])
    os.getppid()


async def park_count(peer: Peer, lead: int, windows: int, size: int, batch: int) -> None:
    """Park ``lead`` runs, then ``windows`` windows of ``size`` more; wake ``lead`` of them,
    then ``windows`` windows of ``size`` more (all of them, in the order they parked).

    For counting instructions (``park_rate.py --callgrind``): each window ends a part of
    callgrind's count (``_mark``), so that one process gives the instructions of every
    window of parks and of wakes, each with the collections that fell in it. The lead keeps
    what happens once (the pool's connections opened by the first batch) out of the windows.
    The process ends with ``os._exit``: nothing after the last window is counted.
    """
    total = lead + windows * size
    for n in range(total, total + 5):  # warm-up, as in parking()
        await peer.park(n)
        check(await peer.wake(n))

    async def wake(n: int) -> None:
        check(await peer.wake(n))

    marks: list[list[int]] = []
    for action in (peer.park, wake):
        await _in_batches(action, lead, batch)
        _mark(marks)
        for window in range(windows):
            await _in_batches(action, size, batch, lead + window * size)
            _mark(marks)
    print(json.dumps({"peer": peer.name, "parked": total, "marks": marks}), flush=True)
    os._exit(0)


# --------------------------------------------------------------------------------------
# The command line every runner has.


def dist_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "(not installed)"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="One peer benchmark measurement, or (serve) one per line of stdin;"
        " each printed as one JSON line."
    )
    parser.add_argument(
        "mode",
        choices=("sequential", "throughput", "park", "park-rate", "park-count", "serve"),
    )
    parser.add_argument("--base-url", required=True, help="the mock's base URL, ending in /v1")
    parser.add_argument("--runs", type=int, default=200, help="sequential: timed runs")
    parser.add_argument("--warmup", type=int, default=20, help="sequential: untimed runs")
    parser.add_argument("--concurrency", type=int, default=100, help="throughput: tasks")
    parser.add_argument("--runs-per-task", type=int, default=1, help="throughput: runs each")
    parser.add_argument("--rounds", type=int, default=1, help="throughput: timed rounds")
    parser.add_argument("--parked", type=int, default=1000, help="park: runs parked")
    parser.add_argument("--sample", type=int, default=200, help="park: runs woken, timed")
    parser.add_argument("--batch", type=int, default=100, help="park: runs parked at once")
    parser.add_argument("--lead", type=int, default=100, help="park-count: runs before the windows")
    parser.add_argument("--windows", type=int, default=3, help="park-count: windows counted")
    parser.add_argument("--size", type=int, default=200, help="park-count: runs per window")
    return parser.parse_args(argv)


async def measure(peer: Peer, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    if mode == "sequential":
        figures = await sequential(peer, args.runs, args.warmup)
    elif mode == "throughput":
        figures = await throughput(peer, args.concurrency, args.runs_per_task, args.rounds)
    elif not peer.parks:
        raise SystemExit(f"{peer.name} has no approval mechanism measured here")
    elif mode == "park-count":
        await park_count(peer, args.lead, args.windows, args.size, args.batch)
        raise AssertionError("park_count ends the process")
    elif mode == "park-rate":
        figures = await park_rate(peer, args.parked, args.batch)
    else:
        figures = await parking(peer, args.parked, args.sample, args.batch)
    return {
        "peer": peer.name,
        "mode": mode,
        "python": platform.python_version(),
        "versions": {name: dist_version(name) for name in peer.packages},
        "mechanism": peer.mechanism if mode.startswith("park") else None,
        **figures,
    }


async def _main(peer: Peer, args: argparse.Namespace) -> None:
    await peer.start(args.base_url)
    try:
        if args.mode != "serve":
            print(json.dumps(await measure(peer, args.mode, args)), flush=True)
            return
        # serve: run.py keeps this process and sends one measurement per line (a JSON
        # object of the options above, "mode" included), so that it can interleave short
        # measurements of every runner without paying an interpreter start for each. The
        # loop is blocked on stdin between measurements only, when nothing runs.
        for line in sys.stdin:
            options = json.loads(line)
            mode = options.pop("mode")
            for key, value in options.items():
                setattr(args, key, value)
            print(json.dumps(await measure(peer, mode, args)), flush=True)
    finally:
        await peer.close()


def main(peer: Peer, argv: list[str] | None = None) -> None:
    """Measure ``peer`` as the command line says; each measurement one JSON line."""
    asyncio.run(_main(peer, parse_args(argv)))
