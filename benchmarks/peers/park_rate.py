"""Parks and wakes per second over HTTP, toolnexus_async against the floor, alternated.

Run it with ``python benchmarks/peers/park_rate.py --parked 10000 --rounds 5`` from the
project's environment (``--help`` for the knobs). It needs none of the peers' environments:
only the floor (``run_floor.py``) and toolnexus_async (``run_toolnexus_async.py``) are
measured, as ``run.py``'s parking part runs them, against the same mock (0 ms latency).

Why a script of its own: a single park measurement per contender, as ``run.py`` takes, is
one wall-clock reading on a machine that other processes share, and the same tree read
from 0.51 to 1.50 of the floor that way. Here every round measures each contender in a
fresh process (``run_<name>.py park-rate``: park N runs 100 at a time, read the resident
set, wake all N 100 at a time), the order rotated every round, and each figure is taken as
a ratio to the floor's of the *same* round; what is printed is the median of those ratios
over the rounds, beside their spread. The process CPU time per park and per wake is
measured too: what the other processes of the machine do moves it far less than it moves
the wall clock, so its ratio is the steadier figure of the two.

``--base-tree PATH`` (repeatable) adds a contender, ``toolnexus_async@<name of PATH>``
imported from another checkout (``PYTHONPATH=PATH``; the runner and the harness are this
tree's), so that a change is measured against the tree it changes, alternated in the same
run: ``git archive <commit> | tar -x -C PATH`` makes one.

``--features`` adds the contender ``features`` (``run_features.py``): the package's own
features (typed transcript and codec, metrics, the toolkit, a ``require_approval`` gate,
an ``Inbox``) called one after another from the run's coroutine with no engine between
them, so that the engine's share of a park and of a wake shows beside the floor's.

``--callgrind P,D`` counts instructions instead, in one process per contender (and per
``--repeat``): after a lead of P parks, ``--windows`` windows of D parks, then the same of
wakes, each window a part of callgrind's count of its own with the collections that fell
in it (``_callgrind.py``). The mean over the windows is the figure; the collections of
each window say whether the floor's and ours compare. With ``--cache-sim`` callgrind also
simulates the first-level caches and each window's misses are printed beside its
instructions: a park or a wake touches more than those caches hold, so its time follows
its misses more than its instructions (docs/performance.md, "Parks and wakes timed").

The results go to ``benchmarks/results/park-rate-<UTC date and time>.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent / "results"
sys.path.insert(1, str(HERE.parent))

import _callgrind  # noqa: E402
from _mock import MockServer  # noqa: E402
from run import meta  # noqa: E402

_COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")

# (figure, how it is printed, scale, whether more is better)
FIGURES = (
    ("parks_per_s", "parks/s", 1.0, True),
    ("wakes_per_s", "wakes/s", 1.0, True),
    ("cpu_per_park_s", "CPU us/park", 1e6, False),
    ("cpu_per_wake_s", "CPU us/wake", 1e6, False),
    ("bytes_per_parked_run", "bytes/parked run", 1.0, False),
)


@dataclass(frozen=True)
class Contender:
    label: str
    script: str
    tree: Path | None = None  # toolnexus_async imported from there (PYTHONPATH)

    def measure(self, base_url: str, parked: int, batch: int) -> dict[str, Any]:
        """One park-rate measurement in a fresh process (a heap of its own)."""
        argv = [sys.executable, str(HERE / self.script), "park-rate", "--base-url", base_url]
        argv += [f"--parked={parked}", f"--batch={batch}"]
        env = dict(os.environ)
        if self.tree is not None:
            env["PYTHONPATH"] = str(self.tree)
        done = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
        if done.returncode != 0:
            sys.stderr.write(done.stderr)
            raise SystemExit(f"{self.label} failed ({done.returncode}): {shlex.join(argv)}")
        figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        figures["peer"] = self.label
        figures["load"] = [round(x, 2) for x in os.getloadavg()]
        return figures

    def count(
        self, base_url: str, lead: int, windows: int, size: int, batch: int, cache_sim: bool
    ) -> Any:
        """One process that parks ``lead`` runs then ``windows`` windows of ``size``, and
        wakes them alike, counted by callgrind part by part (the mock, a process of its
        own, is not counted): the instructions of each window, with its collections (and
        its first-level cache misses with ``cache_sim``)."""
        argv = ["valgrind", "--tool=callgrind", "--dump-before=getppid"]
        argv += ["--cache-sim=yes"] if cache_sim else []
        argv += [sys.executable, str(HERE / self.script), "park-count", "--base-url", base_url]
        argv += [f"--lead={lead}", f"--windows={windows}", f"--size={size}", f"--batch={batch}"]
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        if self.tree is not None:
            env["PYTHONPATH"] = str(self.tree)
        with tempfile.TemporaryDirectory(prefix="park-count-") as scratch:
            argv.insert(3, f"--callgrind-out-file={scratch}/part")
            done = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
            if done.returncode != 0 or _COLLECTED.search(done.stderr) is None:
                sys.stderr.write(done.stderr[-3000:])
                raise SystemExit(f"{self.label} under callgrind failed: {shlex.join(argv)}")
            parts = _callgrind.parts_of(Path(scratch), "part")
        marks = json.loads(done.stdout.strip().splitlines()[-1])["marks"]
        return {
            "peer": self.label,
            "lead": lead,
            **_callgrind.windows(parts, marks, windows, size),
        }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parked", default="10000", help="comma-separated sizes N")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per size")
    parser.add_argument("--batch", type=int, default=100, help="runs parked (woken) at once")
    parser.add_argument(
        "--base-tree",
        type=Path,
        action="append",
        default=[],
        help="also toolnexus_async from this checkout (labelled by its directory's name);"
        " may be given more than once",
    )
    parser.add_argument(
        "--callgrind",
        default=None,
        metavar="P,D",
        help="instead of the rates: instructions per park and per wake under callgrind, in"
        " windows of D after a lead of P (slow: about 50 times)",
    )
    parser.add_argument(
        "--windows", type=int, default=3, help="--callgrind: windows of parks (wakes) a process"
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="--callgrind: processes per contender, each one's lead D / N longer than the last's",
    )
    parser.add_argument(
        "--cache-sim",
        action="store_true",
        help="--callgrind: also count first-level cache misses (callgrind's simulation)",
    )
    parser.add_argument(
        "--features",
        action="store_true",
        help="also the package's features called in a row with no engine (run_features.py)",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.cache_sim and args.callgrind is None:
        parser.error("--cache-sim counts under --callgrind only")
    return args


def spread(values: list[float]) -> str:
    return f"{min(values):.3f}..{max(values):.3f}"


def report(rows: list[dict[str, Any]], parked: int, labels: list[str]) -> None:
    """Per contender: each figure's median, and the median of its per-round ratios to the
    floor's (for a cost, floor / it, so that every ratio reads 'at least 0.9' alike)."""
    mine = [r for r in rows if r["parked"] == parked]
    floors = {r["round"]: r for r in mine if r["peer"] == "floor"}
    print(
        f"\nN = {parked:,}: medians over {len(floors)} rounds; ratio = median of per-round ratios"
    )
    for key, name, scale, more_is_better in FIGURES:
        cells = []
        for label in labels:
            values = [r[key] * scale for r in mine if r["peer"] == label]
            cell = f"{label} {statistics.median(values):,.1f}"
            if label != "floor":
                ratios = [
                    (r[key] / floors[r["round"]][key])
                    if more_is_better
                    else (floors[r["round"]][key] / r[key])
                    for r in mine
                    if r["peer"] == label and r["round"] in floors
                ]
                what = "/ floor" if more_is_better else "floor /"
                cell += f" ({what} {statistics.median(ratios):.3f}, rounds {spread(ratios)})"
            cells.append(cell)
        print(f"  {name:<17} " + "; ".join(cells))


def _line(it: dict[str, Any], floor: dict[str, Any], key: str, bounds: str = "") -> str:
    """One figure of a contender, and floor / it (so that every ratio reads 'at least 0.9')."""
    shown = f"{key.replace('_', ' ')} {it[key]:9,.0f}"
    if bounds:
        shown += f" [{it[bounds][0]:,.0f}..{it[bounds][1]:,.0f}]"
    return f"{shown} (floor / it {floor[key] / it[key]:.3f})"


def callgrind(
    args: argparse.Namespace, contenders: list[Contender], results: dict[str, Any], out: Path
) -> None:
    """Every contender counted in ``--repeat`` processes, two at a time (a count does not
    depend on what else runs); what decides is the mean over all the windows of each."""
    p, d = (int(x) for x in args.callgrind.split(","))
    results["callgrind"] = {
        "p": p,
        "d": d,
        "windows": args.windows,
        "repeat": args.repeat,
        "cache_sim": args.cache_sim,
    }
    jobs = [(c, p + k * (d // args.repeat)) for k in range(args.repeat) for c in contenders]
    with MockServer(0) as mock, ThreadPoolExecutor(2) as pool:
        results["rows"] = list(
            pool.map(
                lambda job: job[0].count(
                    mock.base_url, job[1], args.windows, d, args.batch, args.cache_sim
                ),
                jobs,
            )
        )
    results["meta"]["load_end"] = os.getloadavg()
    results["summary"] = {
        phase: {
            c.label: _callgrind.summary(
                [w for row in results["rows"] if row["peer"] == c.label for w in row[phase]]
            )
            for c in contenders
        }
        for phase in ("park", "wake")
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    for phase, figures in results["summary"].items():
        print(f"\ninstructions per {phase}, {args.repeat} x {args.windows} windows of {d}:")
        for label, it in figures.items():
            rows = [row[phase] for row in results["rows"] if row["peer"] == label]
            means = ", ".join(
                f"{sum(w['instructions'] for w in r) / (d * len(r)):,.0f}" for r in rows
            )
            print(f"  {label:<24} {_line(it, figures['floor'], 'mean')} (per process {means})")
            print(f"  {'':<24} {_line(it, figures['floor'], 'median', 'range')}")
            print(f"  {'':<24} {_line(it, figures['floor'], 'outside_median', 'outside_range')}")
            gens = "  ".join("/".join(map(str, c)) for c in it["collections"])
            if args.cache_sim:
                print(f"  {'':<24} first-level cache {_line(it, figures['floor'], 'misses')}")
            print(f"  {'':<24} collector (mean) {it['collector']:,.0f}; collections (gen 0/1/2)")
            print(f"  {'':<24} per window {gens}")
    print(f"\nresults: {out}")


def main(args: argparse.Namespace) -> None:
    contenders = [
        Contender("floor", "run_floor.py"),
        Contender("toolnexus_async", "run_toolnexus_async.py"),
    ]
    contenders += [
        Contender(f"toolnexus_async@{tree.name}", "run_toolnexus_async.py", tree.resolve())
        for tree in args.base_tree
    ]
    if args.features:
        contenders.append(Contender("features", "run_features.py"))
    now = datetime.datetime.now(datetime.UTC)
    out = args.out or RESULTS / f"park-rate-{now:%Y%m%dT%H%M%SZ}.json"
    results: dict[str, Any] = {
        "meta": {
            **meta(now),
            "load_start": os.getloadavg(),
            "base_trees": [str(tree.resolve()) for tree in args.base_tree],
        },
        "rows": [],
    }
    print(f"park-rate: {results['meta']['command']}; load {os.getloadavg()}", flush=True)
    if args.callgrind is not None:
        callgrind(args, contenders, results, out)
        return
    sizes = [int(x) for x in args.parked.split(",")]
    with MockServer(0) as mock:
        for parked in sizes:
            for k in range(args.rounds):
                turn = k % len(contenders)
                for contender in contenders[turn:] + contenders[:turn]:
                    started = time.perf_counter()
                    figures = contender.measure(mock.base_url, parked, args.batch)
                    figures["round"] = k
                    figures["seconds"] = time.perf_counter() - started
                    results["rows"].append(figures)
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_text(json.dumps(results, indent=1) + "\n")
                    print(
                        f"N={parked:<7,} round {k} {contender.label:<21}"
                        f" parks/s {figures['parks_per_s']:8,.0f}"
                        f"  wakes/s {figures['wakes_per_s']:8,.0f}"
                        f"  CPU/park {figures['cpu_per_park_s'] * 1e6:6.1f} us"
                        f"  CPU/wake {figures['cpu_per_wake_s'] * 1e6:6.1f} us"
                        f"  {figures['bytes_per_parked_run']:7,.0f} B/run"
                        f"  load {figures['load'][0]}",
                        flush=True,
                    )
    results["meta"]["load_end"] = os.getloadavg()
    out.write_text(json.dumps(results, indent=1) + "\n")
    for parked in sizes:
        report(results["rows"], parked, [c.label for c in contenders])
    print(f"\nresults: {out}; load at the end {os.getloadavg()}")


if __name__ == "__main__":
    main(parse_args())
