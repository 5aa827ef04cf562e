"""toolnexus_async beside its peers: the same agent run in each framework, side by side.

Run it with ``nox -s bench-peers`` (which creates the peers' virtual environments first,
with the versions pinned in ``requirements-<peer>.txt``, and passes its arguments here;
``--quick`` for a smoke run, ``--help`` for the knobs). Each framework does overhead.py's
scenario with its own idiomatic API in a runner of its own (``run_<peer>.py``, see their
docstrings), executed by the python of its own environment; toolnexus_async and the raw
aiohttp floor run the same way from the project's environment. A runner prints each
measurement as one JSON line. This script starts the OpenAI-style mock of
overhead.py once per simulated latency (0 ms and 20 ms: two processes, shared by every
runner), then runs the runners round-robin, in an order rotated every round, so that every
figure can be taken as a ratio to the floor of the same round (the figures printed at the
end and drawn by ``plots.py`` are the medians over rounds of those ratios).

Measurements:

- *sequential*: ``--seq-runs`` runs one after another, 0 ms model latency: p50/p95 per run;
- *throughput*: runs/s at each ``--concurrency`` level (tasks running at once; each task does
  ``ceil(100 / C)`` runs, so a round has at least 100), 20 ms model latency, after a warm-up
  round of ``min(C, 100)`` concurrent runs; the client process's CPU per run too;
- *parking* (frameworks with an approval mechanism): ``add`` needs approval; N runs are
  taken up to it (``--parked`` sizes, 100 at a time), the resident set's growth per parked
  run is read (after a full collection and ``malloc_trim``), then ``--sample`` runs are
  approved one at a time, the others still parked: *continue* is from the answer to the
  approved ``add`` running, *done* to the run's final text.

A measurement whose predicted duration (from the runner's previous rate) exceeds
``--budget`` seconds is skipped and listed as such in the results (the first parking size is
always measured): the slower frameworks cannot do 2,000 concurrent runs, or 10^5 parked runs
through the mock, in the time a run of this script may take on a 2-core machine.

The sequential and throughput measurements are short and many (``--rounds`` rounds of
``--seq-runs`` runs each), so each runner is one process kept for all of them
(``run_<peer>.py serve``: one measurement per line of its stdin); each parking size is a
fresh process, so that every RSS reading starts from a heap of its own.

The results go to ``benchmarks/results/peers-<UTC date and time>.json`` (``--out``); ``nox -s
plots`` draws ``docs/img/peers-*.png`` from the newest.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent / "results"
sys.path.insert(1, str(HERE.parent))

from _mock import MockServer  # noqa: E402


@dataclass(frozen=True)
class Runner:
    name: str  # as the runner reports itself
    script: str
    venv: str | None  # under --venvs; None: the project's environment (this python)

    def python(self, venvs: Path) -> str:
        if self.venv is None:
            return sys.executable
        return str(venvs / self.venv / "bin" / "python")


RUNNERS = (
    Runner("floor", "run_floor.py", None),
    Runner("toolnexus_async", "run_toolnexus_async.py", None),
    Runner("toolnexus", "run_toolnexus.py", "toolnexus"),
    Runner("openai-agents", "run_openai_agents.py", "openai_agents"),
    Runner("langgraph", "run_langgraph.py", "langgraph"),
    Runner("pydantic-ai", "run_pydantic_ai.py", "pydantic_ai"),
)
PARKS = {"floor", "toolnexus_async", "openai-agents", "langgraph", "pydantic-ai"}


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "load average: " + ", ".join(map(str, load()))


def command(runner: Runner, venvs: Path, base_url: str, *args: str) -> list[str]:
    return [runner.python(venvs), str(HERE / runner.script), *args, "--base-url", base_url]


def measure(runner: Runner, venvs: Path, base_url: str, *args: str) -> dict[str, Any]:
    """One measurement in a process of its own (parking: a fresh heap for each size)."""
    argv = command(runner, venvs, base_url, *args)
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        raise SystemExit(f"{runner.name} failed ({done.returncode}): {shlex.join(argv)}")
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    figures["seconds"] = time.perf_counter() - started
    figures["load"] = load()
    return figures


class RunnerFailed(Exception):
    """A runner's process died in a measurement (its traceback went to stderr)."""


class Served:
    """A runner process kept for many short measurements (``run_<peer>.py serve``), so that
    the measurements of all runners can alternate finely without an interpreter start (and
    the framework's imports) for each."""

    def __init__(self, runner: Runner, venvs: Path, base_url: str) -> None:
        self.runner = runner
        self.argv = command(runner, venvs, base_url, "serve")
        self.process = subprocess.Popen(
            self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def measure(self, **options: Any) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        started = time.perf_counter()
        self.process.stdin.write(json.dumps(options) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            code = self.process.wait()
            raise RunnerFailed(f"exit status {code}")
        figures: dict[str, Any] = json.loads(line)
        figures["seconds"] = time.perf_counter() - started
        figures["load"] = load()
        return figures

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        if self.process.wait(120) != 0:
            raise SystemExit(f"{self.runner.name} failed on closing: {shlex.join(self.argv)}")


@contextlib.contextmanager
def served(runners: list[Runner], venvs: Path, base_url: str) -> Iterator[dict[str, Served]]:
    processes: dict[str, Served] = {}
    try:
        for runner in runners:
            processes[runner.name] = Served(runner, venvs, base_url)
        yield processes
        for process in processes.values():
            process.close()
    finally:
        for process in processes.values():
            if process.process.poll() is None:
                process.process.kill()
                process.process.wait()


def rotated(runners: list[Runner], k: int) -> list[Runner]:
    k %= len(runners)
    return runners[k:] + runners[:k]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="toolnexus_async beside its peers.")
    parser.add_argument("--venvs", type=Path, default=Path(".nox/peers"), help="peer venvs")
    parser.add_argument("--only", default="", help="comma-separated runner names (and floor)")
    parser.add_argument("--rounds", type=int, default=10, help="sequential rounds")
    parser.add_argument("--throughput-rounds", type=int, default=2)
    parser.add_argument("--seq-runs", type=int, default=30, help="sequential runs per round")
    parser.add_argument("--seq-warmup", type=int, default=20)
    parser.add_argument("--concurrency", default="1,10,100,500,1000,2000")
    parser.add_argument("--parked", default="1000,10000,100000")
    parser.add_argument("--sample", type=int, default=100, help="parked runs woken, timed")
    parser.add_argument("--budget", type=float, default=150.0, help="seconds per measurement")
    parser.add_argument("--skip", default="", help="parts to skip: sequential,throughput,park")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--resume",
        type=Path,
        default=None,
        help="a results file of an interrupted run: keep its sequential figures, its"
        " complete throughput levels and its parking sizes, measure the rest into it",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run (small sizes)")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.throughput_rounds, args.seq_runs, args.seq_warmup = 2, 1, 10, 5
        args.concurrency, args.parked, args.sample = "1,10,100", "200", 20
    return args


def meta(now: datetime.datetime) -> dict[str, str]:
    """What every results file of this directory says of its run (``park_rate.py``'s too)."""
    return {
        "date": now.isoformat(timespec="seconds"),
        "command": shlex.join(sys.orig_argv),
        "machine": f"{platform.platform()}, {os.cpu_count()} CPUs",
        "python": platform.python_version(),
    }


def main(args: argparse.Namespace) -> None:
    only = {name for name in args.only.split(",") if name}
    runners = [r for r in RUNNERS if not only or r.name in only or r.name == "floor"]
    skip = set(args.skip.split(","))
    now = datetime.datetime.now(datetime.UTC)
    out = args.out or RESULTS / f"peers-{now:%Y%m%dT%H%M%SZ}.json"
    results: dict[str, Any] = {
        "meta": {
            **meta(now),
            "uptime_start": uptime(),
            "scenario": "overhead.py's: 2 model turns, 2 parallel tool calls, loopback mock",
            "mock_latency_ms": {"sequential": 0, "throughput": 20, "park": 0},
            "options": {k: str(v) for k, v in vars(args).items()},
        },
        "versions": {},
        "sequential": [],
        "throughput": [],
        "park": [],
        "skipped": [],
    }
    rate: dict[str, float] = {}  # the last runs/s seen of each runner, for predictions
    done_levels: set[int] = set()
    if args.resume is not None:
        out = args.resume
        earlier = json.loads(out.read_text())
        # "resumed": how the first run began; "resumes": each later start, this one last.
        first = earlier["meta"].get("resumed") or earlier["meta"]
        results["meta"]["resumed"] = {k: first[k] for k in ("date", "uptime_start")}
        results["meta"]["resumes"] = [
            *earlier["meta"].get("resumes", []),
            {k: results["meta"][k] for k in ("date", "command", "uptime_start")},
        ]
        results["versions"] = earlier["versions"]
        results["sequential"] = earlier["sequential"]
        if results["sequential"]:
            skip.add("sequential")
        for row in results["sequential"]:
            rate[row["peer"]] = 1 / row["p50_s"]
        # A level is complete when its last round has a row (or a skip) for every runner.
        last = args.throughput_rounds - 1
        for c in {r["concurrency"] for r in earlier["throughput"]}:
            seen = {
                r["peer"]
                for r in earlier["throughput"]
                if (r["concurrency"], r["round"]) == (c, last)
            }
            seen |= {r["peer"] for r in earlier["skipped"] if r.get("concurrency") == c}
            if seen >= {r.name for r in runners}:
                done_levels.add(c)
        results["throughput"] = [
            r for r in earlier["throughput"] if r["concurrency"] in done_levels
        ]
        results["skipped"] = [r for r in earlier["skipped"] if r.get("concurrency") in done_levels]
        results["park"] = earlier["park"]  # a size measured is kept; a size skipped is retried
        results["skipped"] += [r for r in earlier["skipped"] if r["part"] == "park"]

    def record(part: str, figures: dict[str, Any], **where: Any) -> None:
        results["versions"][figures["peer"]] = figures["versions"]
        results[part].append({**where, **figures})
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1) + "\n")  # kept current, in case of ^C
        print(f"{part:<10} {where} {figures['peer']:<16} {summary(part, figures)}", flush=True)

    def skipped(part: str, runner: Runner, why: str, **where: Any) -> None:
        results["skipped"].append({"part": part, "peer": runner.name, "why": why, **where})
        print(f"{part:<10} {where} {runner.name:<16} skipped: {why}", flush=True)

    with MockServer(0) as fast, MockServer(20) as slow:
        if "sequential" not in skip:
            with served(runners, args.venvs, fast.base_url) as processes:
                for runner in runners:  # warm-up, untimed
                    processes[runner.name].measure(
                        mode="sequential", runs=1, warmup=args.seq_warmup
                    )
                for k in range(args.rounds):
                    for runner in rotated(runners, k):
                        figures = processes[runner.name].measure(
                            mode="sequential", runs=args.seq_runs, warmup=0
                        )
                        rate[runner.name] = 1 / figures["p50_s"]
                        record("sequential", figures, round=k)
        if "throughput" not in skip:
            with served(runners, args.venvs, slow.base_url) as processes:
                for c in (int(x) for x in args.concurrency.split(",")):
                    if c in done_levels:
                        continue
                    per_task = math.ceil(100 / c)
                    for k in range(args.throughput_rounds):
                        for runner in rotated(runners, k):
                            runs = c * per_task + min(c, 100)
                            predicted = runs / rate.get(runner.name, math.inf)
                            if predicted > args.budget:
                                why = f"predicted {predicted:.0f} s > budget {args.budget:g} s"
                                skipped("throughput", runner, why, concurrency=c, round=k)
                                continue
                            try:
                                figures = processes[runner.name].measure(
                                    mode="throughput", concurrency=c, runs_per_task=per_task
                                )
                            except RunnerFailed as error:
                                why = f"failed ({error}; its traceback is on stderr)"
                                skipped("throughput", runner, why, concurrency=c, round=k)
                                processes[runner.name] = Served(runner, args.venvs, slow.base_url)
                                rate.pop(runner.name, None)
                                continue
                            rate[runner.name] = runs / figures["seconds"]
                            record("throughput", figures, round=k)
        if "park" not in skip:
            rate.clear()  # the first size is always measured; its rate predicts the next
            for n in (int(x) for x in args.parked.split(",")):
                for runner in rotated(runners, 0):
                    if runner.name not in PARKS or any(
                        (r["peer"], r["parked"]) == (runner.name, n) for r in results["park"]
                    ):
                        continue
                    results["skipped"] = [
                        r
                        for r in results["skipped"]
                        if (r["part"], r["peer"], r.get("parked")) != ("park", runner.name, n)
                    ]
                    predicted = (n + 2 * args.sample) / rate.get(runner.name, math.inf)
                    if runner.name in rate and predicted > args.budget:
                        why = f"predicted {predicted:.0f} s > budget {args.budget:g} s"
                        skipped("park", runner, why, parked=n)
                        continue
                    figures = measure(
                        runner,
                        args.venvs,
                        fast.base_url,
                        "park",
                        f"--parked={n}",
                        f"--sample={min(args.sample, n)}",
                    )
                    rate[runner.name] = (n + 2 * args.sample) / figures["seconds"]
                    record("park", figures)
                for row in results["park"]:  # the next size's prediction, on a resumed run too
                    if row["parked"] == n and "seconds" in row:
                        rate.setdefault(row["peer"], (n + 2 * args.sample) / row["seconds"])
    results["meta"]["uptime_end"] = uptime()
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"\nresults: {out}\nuptime at the end: {results['meta']['uptime_end']}")
    print_ratios(results)


def summary(part: str, f: dict[str, Any]) -> str:
    if part == "sequential":
        return f"p50 {f['p50_s'] * 1e3:8.2f} ms  p95 {f['p95_s'] * 1e3:8.2f} ms"
    if part == "throughput":
        return (
            f"C={f['concurrency']:<5} {f['runs_per_s']:8.1f} runs/s"
            f"  CPU {f['cpu_per_run_s'] * 1e3:6.2f} ms/run"
        )
    return (
        f"N={f['parked']:<6} {f['bytes_per_parked_run'] / 1024:7.1f} KiB/run"
        f"  continue p50 {f['continue_p50_s'] * 1e3:.2f} ms p99 {f['continue_p99_s'] * 1e3:.2f} ms"
    )


def ratios(rows: list[dict[str, Any]], key: str, group: str | None) -> dict[Any, dict[str, float]]:
    """Per (group value, peer): the median over rounds of figure / the floor's of that round."""
    floors = {(r.get(group or ""), r["round"]): r[key] for r in rows if r["peer"] == "floor"}
    out: dict[Any, dict[str, list[float]]] = {}
    for r in rows:
        floor = floors.get((r.get(group or ""), r["round"]))
        if floor:
            out.setdefault(r.get(group or ""), {}).setdefault(r["peer"], []).append(r[key] / floor)
    return {g: {p: statistics.median(v) for p, v in d.items()} for g, d in out.items()}


def print_ratios(results: dict[str, Any]) -> None:
    seq = ratios(results["sequential"], "p50_s", None).get(None, {})
    print("sequential p50 / floor's: " + ", ".join(f"{p} {v:.2f}" for p, v in seq.items()))
    for c, by_peer in ratios(results["throughput"], "runs_per_s", "concurrency").items():
        print(
            f"runs/s at C={c} / floor's: " + ", ".join(f"{p} {v:.3f}" for p, v in by_peer.items())
        )


if __name__ == "__main__":
    main(parse_args())
