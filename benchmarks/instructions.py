"""Instructions per run, counted by callgrind: toolnexus_async against the raw-aiohttp floor.

Run it with ``nox -s bench -- instructions`` or ``python benchmarks/instructions.py``
(``--help`` for the knobs). It needs valgrind.

Why: ``overhead.py``'s throughput ratio is a timing on a shared machine, and it moves by more
than a change to the hot path does (see docs/performance.md). Callgrind counts the machine
instructions a process executes, which does not depend on what else the machine is doing,
so the same code gives the same count to within a few hundredths of a percent, and a
change of 1 % can be seen in one run. The price: the process runs about fifty times slower,
and instructions are not time (a cache miss costs more than an instruction).

What is counted: ``overhead.py``'s scenario (two model turns, two tool calls) with each
contender's own runner, ``--concurrency`` runs at a time against the same loopback mock,
which is a process of its own and is not counted. Each contender runs in a process of its
own under ``valgrind --tool=callgrind``, twice: after its warm-up, once with ``--base``
runs and once with ``--base`` + ``--runs``; the difference divided by ``--runs`` is the
cost of one run, without the interpreter's start-up, the imports and the warm-up. The
hash seed is fixed, so dicts and sets are laid out alike in every process.

``--cache-sim`` adds callgrind's simulated first-level cache misses (instruction reads,
data reads and data writes; 32 KiB, 64-byte lines, as the machine reports) per run. Why:
one run touches more code and data than those caches hold, even one run at a time, so a
run that executes few more instructions than the floor's but touches more costs more time
than its instruction count says (docs/performance.md, "Where C = 500's time goes: the
first-level caches"). Simulated misses are not measured ones, but they are counted, so
they too come out alike in every run.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys

import anyio
from _common import print_footer, print_header
from _mock import MockServer
from overhead import (
    EXPECTED_TEXT,
    floor_runner,
    floor_session,
    http_client,
    make_toolkit,
    toolnexus_runner,
)

CONTENDERS = ("toolnexus_async", "floor")
_SCRIPT = os.path.abspath(__file__)
_EVENTS = re.compile(r"Events\s*:\s*(.+)")
_COLLECTED = re.compile(r"Collected\s*:\s*(.+)")
# callgrind's names for the first-level misses: instruction reads, data reads, data writes.
_L1_MISSES = ("I1mr", "D1mr", "D1mw")


async def child(contender: str, runs: int, concurrency: int, latency_ms: float) -> None:
    """The measured process: a warm-up round, then ``runs`` runs, ``concurrency`` at once."""
    with MockServer(latency_ms) as server:
        async with http_client(server.base_url) as client, floor_session() as session:
            if contender == "floor":
                run_once = floor_runner(session, server.base_url)
            else:
                run_once = toolnexus_runner(client, make_toolkit())

            async def worker(count: int) -> None:
                for _ in range(count):
                    if await run_once() != EXPECTED_TEXT:
                        raise SystemExit(f"{contender} answered wrongly")

            for count in (2, runs // concurrency):
                async with anyio.create_task_group() as tg:
                    for _ in range(concurrency):
                        tg.start_soon(worker, count)


async def count(contender: str, runs: int, args: argparse.Namespace) -> dict[str, int]:
    """callgrind's totals (``Ir``, and the cache events with ``--cache-sim``) of one child
    process doing ``runs`` runs."""
    command = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        *(["--cache-sim=yes"] if args.cache_sim else []),
        sys.executable,
        _SCRIPT,
        "--child",
        contender,
        "--child-runs",
        str(runs),
        "--concurrency",
        str(args.concurrency),
        "--latency-ms",
        str(args.latency_ms),
    ]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    done = await anyio.run_process(command, env=env, check=False)
    stderr = done.stderr.decode(errors="replace")
    totals = read_totals(stderr)
    if done.returncode != 0 or totals is None:
        raise SystemExit(f"{contender} under callgrind failed:\n{stderr[-3000:]}")
    return totals


def read_totals(stderr: str) -> dict[str, int] | None:
    """callgrind's closing ``Events`` and ``Collected`` lines as one dict, or None if the
    process did not get that far."""
    events, found = _EVENTS.search(stderr), _COLLECTED.search(stderr)
    if events is None or found is None:
        return None
    names, values = events.group(1).split(), found.group(1).split()
    if len(names) != len(values):
        return None
    return dict(zip(names, map(int, values), strict=True))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000, help="runs whose cost is counted")
    parser.add_argument("--base", type=int, default=200, help="runs of the shorter process")
    parser.add_argument("--concurrency", type=int, default=50, help="runs at a time")
    parser.add_argument("--latency-ms", type=float, default=5.0, help="the mock's latency")
    parser.add_argument("--quick", action="store_true", help="100 runs over a base of 50")
    parser.add_argument(
        "--cache-sim", action="store_true", help="also count first-level cache misses"
    )
    parser.add_argument("--child", choices=CONTENDERS, help=argparse.SUPPRESS)
    parser.add_argument("--child-runs", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.base = 100, 50
    for name in ("runs", "base", "concurrency"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    # A child is told its runs alone; the parent checked them against --concurrency.
    if args.child is None and (args.runs % args.concurrency or args.base % args.concurrency):
        parser.error("--runs and --base must be multiples of --concurrency")
    return args


async def main(args: argparse.Namespace) -> None:
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    print_header("aiohttp", "anyio")
    print(
        f"instructions per run under callgrind: {args.runs} runs over a base of {args.base},"
        f" {args.concurrency} at a time, mock latency {args.latency_ms:g} ms"
    )
    per_run: dict[str, dict[str, float]] = {}
    for contender in CONTENDERS:
        short = await count(contender, args.base, args)
        long = await count(contender, args.base + args.runs, args)
        per_run[contender] = {name: (long[name] - short[name]) / args.runs for name in long}
        if args.cache_sim:
            per_run[contender]["L1"] = sum(per_run[contender][name] for name in _L1_MISSES)
        print(f"  {contender:<16} {per_run[contender]['Ir']:12,.0f} instructions per run")
        if args.cache_sim:
            print(
                f"  {'':<16} {per_run[contender]['L1']:12,.0f} first-level cache misses per run"
                " (" + ", ".join(f"{n} {per_run[contender][n]:,.0f}" for n in _L1_MISSES) + ")"
            )
    ours, floor = per_run["toolnexus_async"], per_run["floor"]
    print(f"  ratio toolnexus/floor: {ours['Ir'] / floor['Ir']:.3f}")
    if args.cache_sim:
        print(f"  ratio toolnexus/floor, first-level misses: {ours['L1'] / floor['L1']:.3f}")
    print_footer()


if __name__ == "__main__":
    parsed = parse_args()
    if parsed.child is not None:
        anyio.run(
            child,
            parsed.child,
            parsed.child_runs,
            parsed.concurrency,
            parsed.latency_ms,
            backend="asyncio",
        )
    else:
        anyio.run(main, parsed, backend="asyncio")
