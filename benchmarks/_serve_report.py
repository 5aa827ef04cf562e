"""The figures of ``serve_load.py`` and their report.

Not a benchmark itself: ``serve_load.py`` measures, this module holds what a contender's
measurement gives (:class:`Figures`, with the server's :class:`ServerState` readings) and
prints it: each contender's figures, their ratios to the floor, and with ``--stores`` the
stores of each round side by side, their ratios in the same round (PostgreSQL / SQLite and
each / memory) against the targets of issue 41, and at the end the median and the range of
every ratio over the rounds.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from _common import percentile, verdict


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
    runs_listing_seconds: float = 0.0  # the GET /runs that showed every run done (in done_)
    polls: list[int] = field(default_factory=lambda: [0, 0])  # GET /requests, GET /runs
    listing_stored_seconds: float = 0.0  # --spill: a GET /requests with all N in the store
    before: ServerState = ServerState()
    parked: ServerState = ServerState()
    after: ServerState = ServerState()
    server_start: ServerState = ServerState()  # first POST -> all parked (and spilled)
    server_answer: ServerState = ServerState()  # first answer -> all done
    client_cpu_start: float = 0.0
    client_cpu_answer: float = 0.0
    database_cpu: float = 0.0  # --stores postgres: the database server's, the timed cycle
    transactions: int = 0  # write transactions the cluster assigned over the timed cycle

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

    @property
    def server_cpu_per_run(self) -> float:
        """The server's CPU per run over the whole cycle, in microseconds."""
        return (self.server_cpu_start + self.server_cpu_answer) / self.runs * 1e6


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
        f" {f.done_seconds:.3f} s = {f.rate(f.done_seconds):,.0f} runs/s ({f.polls[1]} polls,"
        f" the last {ms(f.runs_listing_seconds)})"
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
    if f.database_cpu:
        print(
            f"    database  PostgreSQL server (postmaster and backends)"
            f" {f.database_cpu / n * 1e6:,.0f} us/run over the cycle;"
            f" {f.transactions / n:.2f} write transactions per run"
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


# --------------------------------------------------------------------------------------
# --stores: the same app on each run store, round after round.

STORE_LABELS = {"memory": "memory", "sqlite": "SQLite", "postgres": "PostgreSQL"}
DONE_TARGET = 0.6  # issue 41: PostgreSQL (one worker) >= 0.6 of SQLite's runs done/s
CPU_TARGET = 1.5  # and the worker's CPU per durable run <= 1.5 times SQLite's


@dataclass(frozen=True)
class Metric:
    label: str
    of: Callable[[Figures], float]
    unit: str
    at_least: float | None = None  # the target of PostgreSQL / SQLite, if any: a floor
    at_most: float | None = None  # or a ceiling

    @property
    def target(self) -> str:
        if self.at_least is not None:
            return f">= {self.at_least:g}"
        return "" if self.at_most is None else f"<= {self.at_most:g}"

    def met(self, ratio: float) -> bool:
        if self.at_least is not None and ratio < self.at_least:
            return False
        return self.at_most is None or ratio <= self.at_most


METRICS = (
    Metric("parks/s (all listed parked)", lambda f: f.rate(f.parked_seconds), "/s"),
    Metric("runs done/s (answers)", lambda f: f.rate(f.done_seconds), "/s", at_least=DONE_TARGET),
    Metric("runs/s, whole cycle", lambda f: f.runs / (f.start_wall + f.done_seconds), "/s"),
    Metric("server CPU per run", lambda f: f.server_cpu_per_run, "us", at_most=CPU_TARGET),
    # PostgreSQL's own work is in other processes; SQLite's is in the server's.
    Metric(
        "server + database CPU per run",
        lambda f: f.server_cpu_per_run + f.database_cpu / f.runs * 1e6,
        "us",
    ),
)


@dataclass
class StoreRound:
    number: int
    load: str  # the load average when the round began
    figures: dict[str, Figures]  # by store, in the order they were measured

    def pairs(self) -> list[tuple[str, str]]:
        """(store, baseline) of the ratios: PostgreSQL / SQLite, then each / memory."""
        found = self.figures
        pairs = [("postgres", "sqlite")] if "postgres" in found and "sqlite" in found else []
        if "memory" in found:
            pairs += [(s, "memory") for s in ("sqlite", "postgres") if s in found]
        return pairs

    def ratio(self, metric: Metric, store: str, baseline: str) -> float:
        return metric.of(self.figures[store]) / metric.of(self.figures[baseline])


def pair_label(store: str, baseline: str) -> str:
    return f"{STORE_LABELS[store]} / {STORE_LABELS[baseline]}"


def print_store_round(r: StoreRound) -> None:
    """The round's stores side by side, and their ratios in the round."""
    print(f"  round {r.number} (load average {r.load} when it began), side by side:")
    print(
        f"    {'store':<11} {'parks/s':>8} {'done/s':>8} {'cycle/s':>8} {'server CPU/run':>15}"
        f" {'database CPU/run':>17} {'write xacts/run':>16}"
    )
    for store, f in r.figures.items():
        database = (
            f"{f.database_cpu / f.runs * 1e6:>14,.0f} us {f.transactions / f.runs:>16.2f}"
            if f.database_cpu
            else f"{'-':>17} {'-':>16}"
        )
        print(
            f"    {STORE_LABELS[store]:<11} {METRICS[0].of(f):>8,.0f} {METRICS[1].of(f):>8,.0f}"
            f" {METRICS[2].of(f):>8,.0f} {f.server_cpu_per_run:>12,.0f} us {database}"
        )
    for store, baseline in r.pairs():
        print(f"    {pair_label(store, baseline)}:")
        for metric in METRICS:
            a, b = metric.of(r.figures[store]), metric.of(r.figures[baseline])
            line = ratio_line(metric.label, a, b, metric.unit)
            if metric.target and (store, baseline) == ("postgres", "sqlite"):
                line += f"   target {metric.target}: {verdict(metric.met(a / b))}"
            print(line)


def print_store_summary(rounds: list[StoreRound]) -> None:
    """Every ratio over the rounds: each round's, the median and the range."""
    pairs = rounds[0].pairs()
    if not pairs:  # one store: nothing to compare it with
        return
    print(f"  over {len(rounds)} round(s) (each round's ratio; median; range):")
    for store, baseline in pairs:
        print(f"    {pair_label(store, baseline)}:")
        for metric in METRICS:
            ratios = [r.ratio(metric, store, baseline) for r in rounds]
            median = statistics.median(ratios)
            line = (
                f"      {metric.label:<30} {', '.join(f'{x:.2f}' for x in ratios)};"
                f" median {median:.2f}; {min(ratios):.2f} to {max(ratios):.2f}"
            )
            if metric.target and (store, baseline) == ("postgres", "sqlite"):
                held = sum(metric.met(x) for x in ratios)
                line += (
                    f"   target {metric.target}: median {verdict(metric.met(median))},"
                    f" {held} of {len(ratios)} rounds"
                )
            print(line)
