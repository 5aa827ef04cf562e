"""Draw the peers benchmark's charts from its results: ``nox -s plots`` (or ``python plots.py
[RESULTS.json]`` with matplotlib installed).

Reads the newest ``benchmarks/results/peers-*.json`` (or the file given) and writes into
``docs/img/``:

- ``peers-overhead.png``: sequential p50 per run as a ratio to the floor's of the same round;
- ``peers-throughput.png``: runs/s against concurrency (log-log), the floor included;
- ``peers-park-memory.png``: resident memory per parked run against runs parked (log-log);
- ``peers-wake.png``: wake latency p50 and p99, answer -> the approved tool running.

The figures are drawn from the results only; nothing is typed in by hand. Run ``run.py``
(``nox -s bench-peers``) first.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent / "results"
IMG = HERE.parent.parent / "docs" / "img"

ORDER = ["floor", "toolnexus_async", "toolnexus", "openai-agents", "langgraph", "pydantic-ai"]
COLORS = {
    "floor": "#444444",
    "toolnexus_async": "#d62728",
    "toolnexus": "#ff7f0e",
    "openai-agents": "#2ca02c",
    "langgraph": "#1f77b4",
    "pydantic-ai": "#9467bd",
}


def newest() -> Path:
    found = sorted(RESULTS.glob("peers-*.json"))
    if not found:
        raise SystemExit(f"no peers-*.json in {RESULTS}: run nox -s bench-peers first")
    return found[-1]


def by_peer(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        grouped[row["peer"]].append(row)
    return {p: grouped[p] for p in ORDER if p in grouped}


def subtitle(results: dict[str, Any]) -> str:
    meta = results["meta"]
    first = meta.get("resumed", meta)  # a resumed run: when and how it began
    load = first["uptime_start"].split("load average:")[-1].strip()
    end = meta.get("uptime_end", "").split("load average:")[-1].strip()
    return (
        f"{first['date']}, Python {meta['python']}, {meta['machine']}\n"
        f"load average at start {load}, at end {end}"
    )


def overhead(results: dict[str, Any], ax: Any) -> None:
    rows = results["sequential"]
    floors = {r["round"]: r["p50_s"] for r in rows if r["peer"] == "floor"}
    names, values = [], []
    for peer, mine in by_peer(rows).items():
        names.append(peer)
        values.append(statistics.median(r["p50_s"] / floors[r["round"]] for r in mine))
    bars = ax.bar(names, values, color=[COLORS[n] for n in names])
    ax.bar_label(bars, labels=[f"{v:.2f}" for v in values], padding=2)
    ax.set_yscale("log")
    ax.set_ylabel("p50 per run / floor's p50 (log scale)")
    ax.set_title("Overhead: sequential runs, 0 ms model latency (lower is better)")
    ax.axhline(1, color="black", linewidth=0.8)


def line_of(peer: str) -> dict[str, Any]:
    """How a peer's line looks on every chart: its colour, and the floor dashed."""
    return {
        "marker": "o",
        "label": peer,
        "color": COLORS[peer],
        "linestyle": "--" if peer == "floor" else "-",
    }


def log_log(ax: Any, ticks: list[int], xlabel: str, ylabel: str) -> None:
    """Both axes logarithmic, the x ticks at the measured levels, a grid and the legend."""
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(ticks, [f"{n:,}" for n in ticks])
    ax.set_xlabel(f"{xlabel} (log scale)")
    ax.set_ylabel(f"{ylabel} (log scale)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()


def throughput(results: dict[str, Any], ax: Any) -> None:
    for peer, mine in by_peer(results["throughput"]).items():
        per_c: dict[int, list[float]] = defaultdict(list)
        for r in mine:
            per_c[r["concurrency"]].append(r["runs_per_s"])
        cs = sorted(per_c)
        ax.plot(
            cs,
            [statistics.median(per_c[c]) for c in cs],
            **line_of(peer),
        )
    levels = sorted({r["concurrency"] for r in results["throughput"]})
    log_log(ax, levels, "concurrent runs", "runs per second")
    ax.set_title("Throughput, 20 ms model latency (higher is better)")


def park_memory(results: dict[str, Any], ax: Any) -> None:
    for i, (peer, mine) in enumerate(by_peer(results["park"]).items()):
        mine = sorted(mine, key=lambda r: r["parked"])
        for r in mine:  # labelled: single points of two peers may lie on each other
            ax.annotate(
                f"{peer} {r['bytes_per_parked_run'] / 1024:.1f}",
                (r["parked"], r["bytes_per_parked_run"] / 1024),
                xytext=(8, 10 - 7 * i),
                textcoords="offset points",
                fontsize=7,
                color=COLORS[peer],
            )
        ax.plot(
            [r["parked"] for r in mine],
            [r["bytes_per_parked_run"] / 1024 for r in mine],
            **line_of(peer),
        )
    sizes = sorted({r["parked"] for r in results["park"]})
    log_log(ax, sizes, "runs parked", "resident memory per parked run, KiB")
    ax.set_title("Memory per run waiting for an approval (lower is better)")


def wake(results: dict[str, Any], ax: Any) -> None:
    grouped = by_peer(results["park"])
    names = list(grouped)
    # The largest parked count each peer reached: its wake latency with the most parked.
    rows = [max(grouped[n], key=lambda r: r["parked"]) for n in names]
    x = range(len(names))
    width = 0.38
    p50 = [r["continue_p50_s"] * 1e3 for r in rows]
    p99 = [r["continue_p99_s"] * 1e3 for r in rows]
    b1 = ax.bar([i - width / 2 for i in x], p50, width, label="p50", color="#1f77b4")
    b2 = ax.bar([i + width / 2 for i in x], p99, width, label="p99", color="#ff7f0e")
    ax.bar_label(b1, labels=[f"{v:.2g}" for v in p50], padding=2, fontsize=8)
    ax.bar_label(b2, labels=[f"{v:.2g}" for v in p99], padding=2, fontsize=8)
    ax.set_xticks(
        list(x), [f"{n}\n({r['parked']:,} parked)" for n, r in zip(names, rows, strict=True)]
    )
    ax.set_yscale("log")
    ax.set_ylabel("answer -> approved tool runs, ms (log scale)")
    ax.set_title("Wake latency, the others still parked (lower is better)")
    ax.legend()


def table(results: dict[str, Any]) -> str:
    """The figures as a Markdown table (printed, for docs/performance.md)."""
    seq = results["sequential"]
    floors = {r["round"]: r["p50_s"] for r in seq if r["peer"] == "floor"}
    tput = results["throughput"]
    tfloors = {
        (r["concurrency"], r["round"]): r["runs_per_s"] for r in tput if r["peer"] == "floor"
    }
    cs = sorted({r["concurrency"] for r in tput})
    park = by_peer(results["park"])
    head = ["framework", "p50 / floor", "p50 ms", "p95 ms"]
    head += [f"runs/s C={c} (/ floor)" for c in cs]
    head += ["CPU ms/run C=500", "KiB per parked run (N)", "wake p50 / p99 ms"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for peer, mine in by_peer(seq).items():
        cells = [f"`{peer}`"]
        cells.append(f"{statistics.median(r['p50_s'] / floors[r['round']] for r in mine):.2f}")
        cells.append(f"{statistics.median(r['p50_s'] for r in mine) * 1e3:.1f}")
        cells.append(f"{statistics.median(r['p95_s'] for r in mine) * 1e3:.1f}")
        cpu = "-"
        for c in cs:
            rows = [r for r in tput if r["peer"] == peer and r["concurrency"] == c]
            if not rows:
                cells.append("skipped")
                continue
            rate = statistics.median(r["runs_per_s"] for r in rows)
            ratio = statistics.median(r["runs_per_s"] / tfloors[(c, r["round"])] for r in rows)
            cells.append(f"{rate:.0f} ({ratio:.2f})")
            if c == 500:
                cpu = f"{statistics.median(r['cpu_per_run_s'] for r in rows) * 1e3:.2f}"
        cells.append(cpu)
        if peer in park:
            sizes = sorted(park[peer], key=lambda r: r["parked"])
            cells.append(
                ", ".join(
                    f"{r['bytes_per_parked_run'] / 1024:.1f} ({r['parked']:,})" for r in sizes
                )
            )
            last = sizes[-1]
            cells.append(f"{last['continue_p50_s'] * 1e3:.2f} / {last['continue_p99_s'] * 1e3:.2f}")
        else:
            cells += ["-", "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    path = Path(argv[0]) if argv else newest()
    results = json.loads(path.read_text())
    IMG.mkdir(parents=True, exist_ok=True)
    charts = {
        "peers-overhead.png": overhead,
        "peers-throughput.png": throughput,
        "peers-park-memory.png": park_memory,
        "peers-wake.png": wake,
    }
    for name, draw in charts.items():
        fig, ax = plt.subplots(figsize=(9, 5.5), layout="constrained")
        draw(results, ax)
        plain = FuncFormatter(lambda v, _: f"{v:g}")  # 20, not 2 x 10^1
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(
            plain if ax.get_yscale() == "log" else ax.yaxis.get_minor_formatter()
        )
        fig.suptitle(f"{path.name}: {subtitle(results)}", fontsize=8)
        fig.savefig(IMG / name, dpi=110)
        plt.close(fig)
        print(f"wrote {IMG / name}")
    print()
    print(table(results))


if __name__ == "__main__":
    main(sys.argv[1:])
