"""The durable parts of ``park.py``: parking through a ``DurableHost`` (on SQLite or
PostgreSQL), and halt -> resume.

Imported by ``park.py`` (run as a script, so this directory is on ``sys.path``); see its
docstring for what is measured and how.
"""

from __future__ import annotations

import gc
import json
import sqlite3
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Self

import anyio
from _common import PROMPT, approval_model, expected_text, percentile
from _park_hot import Probe, Toolnexus, make_tool, ms, request_id

from toolnexus_async import Answer, LlmClient, RunResult, Toolkit
from toolnexus_async.durable import (
    DurableHost,
    MemoryRunStore,
    PostgresRunStore,
    RunStore,
    SqliteRunStore,
    resume_stored,
)

# --------------------------------------------------------------------------------------
# Durable parking: the hot contender's runs, kept in a run store by a DurableHost.


class Durable(Toolnexus):
    """Every run through a ``DurableHost`` over a run store, parked in the host's
    ``Inbox``: a request is in the inbox only once its suspension is committed, and an
    answer counts once ``host.answer`` returned, which is once it is committed.

    Made by :meth:`sqlite` or :meth:`postgres`; ``committed()`` counts the requests by
    status through a connection of its own (untimed checks)."""

    # The SQLite store works in a thread: a busy poll would hold the GIL it needs (and
    # the PostgreSQL store's replies need the loop too).
    poll = 0.001

    def __init__(
        self,
        probe: Probe,
        store: RunStore,
        name: str,
        committed: Callable[[], dict[str, int]],
        server_cpu: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(probe)
        self.store = store
        self.host = DurableHost(self.client, self.toolkit, self.store)
        self.name = name
        self.committed = committed
        # CPU seconds of this process and of the database server (if it has one of its
        # own), read once the store is open, once all are parked and once all are done.
        self.server_cpu = server_cpu
        self.cpu: list[tuple[float, float]] = []

    @classmethod
    def sqlite(cls, probe: Probe, path: Path, synchronous: Literal["FULL", "NORMAL"]) -> Durable:
        """A ``SqliteRunStore`` in ``path`` (``synchronous=FULL`` is the store's default)."""
        # Every ended run is kept (not only the default 10,000), so that the check after
        # the burst can count every committed answer.
        store = SqliteRunStore(path, keep_finished=probe.size, synchronous=synchronous)
        name = f"toolnexus_async + SqliteRunStore (synchronous={synchronous})"
        return cls(probe, store, name, lambda: committed(path))

    @classmethod
    def maker(
        cls, path: Path, synchronous: Literal["FULL", "NORMAL"]
    ) -> Callable[[Probe], Durable]:
        """What makes a :meth:`sqlite` contender from its probe, for the harnesses."""
        return lambda probe: cls.sqlite(probe, path, synchronous)

    @classmethod
    def postgres(
        cls,
        probe: Probe,
        dsn: str,
        pool: int,
        timeout: float,
        server_cpu: Callable[[], float] | None = None,
    ) -> Durable:
        """A ``PostgresRunStore`` on ``dsn``, its pool of ``pool`` connections opened
        before the clock starts (``min_size = max_size``); ``timeout`` is its
        ``command_timeout``;
        ``server_cpu()`` reads the database server's CPU seconds."""
        # Imported here: it brings tests.pg and pytest, which the other modes do without.
        from _pg import committed as pg_committed
        from _pg import run_blocking

        store = PostgresRunStore(
            dsn, min_size=pool, max_size=pool, keep_finished=probe.size, command_timeout=timeout
        )
        name = f"toolnexus_async + PostgresRunStore (pool of {pool})"
        return cls(
            probe, store, name, lambda: run_blocking(pg_committed(dsn))["requests"], server_cpu
        )

    async def __aenter__(self) -> Self:
        await self.store.__aenter__()
        await self.host.__aenter__()
        self.read_cpu()
        return self

    def read_cpu(self) -> None:
        if self.server_cpu is not None:
            self.cpu.append((time.process_time(), self.server_cpu()))

    async def __aexit__(self, *exc: object) -> None:
        await self.host.__aexit__(None, None, None)
        await self.store.aclose()

    async def run(self, n: int) -> None:
        try:
            result = await self.host.run(PROMPT.format(n=n))
        except Exception as exc:  # a store error: counted, so that the harness stops
            self.wrong.append(f"run {n} raised {exc!r}")
            return
        if result.status != "done" or result.text != expected_text(n):
            self.wrong.append(f"run {n}: {result.status} {result.text!r}")

    def answer(self, answer: Answer) -> None:
        raise NotImplementedError("a durable answer is awaited: answer_one")

    async def answer_one(self, answer: Answer) -> None:
        await self.host.answer(answer)

    async def burst(self, answers: list[tuple[int, Answer]]) -> None:
        """Every answer at once, each in a task of its own (as a web server's handlers
        would be), done when every one of them returned: was committed."""
        answered_at = self.probe.answered_at
        answer = self.host.answer
        clock = time.perf_counter
        async with anyio.create_task_group() as tg:
            for n, a in answers:
                answered_at[n] = clock()
                tg.start_soon(answer, a)

    def verify_parked(self, runs: int) -> None:
        self.read_cpu()
        found = self.committed()
        if found.get("pending") != runs:
            raise SystemExit(f"{self.name}: {runs} runs parked, but committed: {found}")

    def verify_answered(self, runs: int) -> None:
        self.read_cpu()
        found = self.committed()
        if found.get("answered") != runs:
            raise SystemExit(f"{self.name}: {runs} runs answered, but committed: {found}")


def print_cpu(kept: Durable, runs: int) -> None:
    """CPU per run of this process and of the database server, in the two halves."""
    if len(kept.cpu) != 3:
        return
    (p0, s0), (p1, s1), (p2, s2) = kept.cpu
    print(
        f"    CPU/run   parking: this process {(p1 - p0) / runs * 1e6:,.0f} us, database server"
        f" {(s1 - s0) / runs * 1e6:,.0f} us; waking (one at a time, then the burst): this"
        f" process {(p2 - p1) / runs * 1e6:,.0f} us, database server"
        f" {(s2 - s1) / runs * 1e6:,.0f} us  (the parking half includes one gc.collect())"
    )


def committed(path: Path) -> dict[str, int]:
    """Requests by status, as another connection to the file sees them: what was
    committed. (The table layout is internal; the benchmark reads it only to check.)"""
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT status, count(*) FROM requests GROUP BY status")
        return dict(rows.fetchall())


# --------------------------------------------------------------------------------------
# Part 2: durable halt -> save -> claim -> resume.


@dataclass
class DurableFigures:
    name: str
    halt: list[float] = field(default_factory=list)
    save: list[float] = field(default_factory=list)
    halt_save: list[float] = field(default_factory=list)
    claim_resume: list[float] = field(default_factory=list)

    def line(self, what: str, values: list[float]) -> str:
        s = sorted(values)
        return (
            f"    {what:<14} p50 {ms(percentile(s, 50))}  p95 {ms(percentile(s, 95))}"
            f"  mean {ms(statistics.fmean(s))}"
        )


async def durable(
    runs: int, directory: Path
) -> tuple[DurableFigures, DurableFigures, dict[str, float]]:
    client = LlmClient.in_process(approval_model)
    toolkit = Toolkit.create(builtins=False, extra_tools=[make_tool(None)])
    path = directory / "runs.sqlite"
    figures = [DurableFigures("SqliteRunStore"), DurableFigures("MemoryRunStore")]
    clock = time.perf_counter
    sizes: dict[str, float] = {}
    json_bytes: list[int] = []
    compact_bytes: list[int] = []
    async with SqliteRunStore(path) as sqlite_store, MemoryRunStore() as memory_store:
        stores: list[RunStore] = [sqlite_store, memory_store]
        # Warm-up: one run through each store, untimed (opens the file, warms the code).
        for store in stores:
            halted = await client.run(PROMPT.format(n=runs), toolkit)
            await store.save(halted)
            await resume_stored(client, toolkit, store, Answer(request_id(runs), True))
        gc.collect()
        pairs = list(zip(stores, figures, strict=True))
        for n in range(runs):
            # Alternate which store goes first, so neither always follows the other.
            for store, out in pairs if n % 2 == 0 else pairs[::-1]:
                start = clock()
                halted = await client.run(PROMPT.format(n=n), toolkit)
                middle = clock()
                await store.save(halted)
                end = clock()
                out.halt.append(middle - start)
                out.save.append(end - middle)
                out.halt_save.append(end - start)
                if halted.status != "pending":
                    raise SystemExit(f"run {n} did not halt: {halted.status}")
            payload = halted.to_dict()
            json_bytes.append(len(json.dumps(payload)))
            compact_bytes.append(
                len(json.dumps(payload, ensure_ascii=False, separators=(",", ":")))
            )
        db, wal, settled = file_sizes(path)
        sizes = {
            "json": statistics.fmean(json_bytes),
            "compact": statistics.fmean(compact_bytes),
            "db": db,
            "wal": wal,
            "settled": settled,
        }
        gc.collect()
        for n in range(runs):
            for store, out in pairs if n % 2 == 0 else pairs[::-1]:
                start = clock()
                result: RunResult = await resume_stored(
                    client, toolkit, store, Answer(request_id(n), True)
                )
                out.claim_resume.append(clock() - start)
                if result.status != "done" or result.text != expected_text(n):
                    raise SystemExit(f"resumed run {n} ended {result.status} {result.text!r}")
    return figures[0], figures[1], sizes


def file_sizes(path: Path) -> tuple[int, int, int]:
    """The SQLite file and its WAL as they are, then the file after a WAL checkpoint."""
    db = path.stat().st_size
    wal_path = Path(f"{path}-wal")
    wal = wal_path.stat().st_size if wal_path.exists() else 0
    # A second connection folds the WAL into the file, to see the settled size.
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return db, wal, path.stat().st_size


def print_durable(
    sq: DurableFigures, mem: DurableFigures, sizes: dict[str, float], runs: int
) -> None:
    for f in (sq, mem):
        print(f"  {f.name}")
        print(f.line("halt (run)", f.halt))
        print(f.line("save", f.save))
        print(f.line("halt+save", f.halt_save))
        print(f.line("claim+resume", f.claim_resume))
    print(
        f"  stored per halted run: json.dumps(run.to_dict()) {sizes['json']:,.0f} bytes"
        f" (compact, as stores write it: {sizes['compact']:,.0f});"
        f" SQLite file {sizes['db'] / runs:,.0f} bytes/run + WAL {sizes['wal'] / runs:,.0f}"
        f" bytes/run ({sizes['settled'] / runs:,.0f} bytes/run after a checkpoint)"
    )
    print("  SqliteRunStore / MemoryRunStore:")
    for label, a, b in (
        ("halt+save p50", sq.halt_save, mem.halt_save),
        ("claim+resume p50", sq.claim_resume, mem.claim_resume),
    ):
        x, y = statistics.median(a), statistics.median(b)
        print(f"    {label:<22} {x * 1e6:8.1f} / {y * 1e6:8.1f} us = {x / y:.2f}")
