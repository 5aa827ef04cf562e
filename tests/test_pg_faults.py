"""When the database goes away, nothing is lost and nothing runs twice (issue 32).

Rules of this module:

- Everything is real: a PostgreSQL cluster of the test's own (``pg_cluster``, tests/pg.py),
  which a test crashes and starts again on the same port; two serve workers on one
  database, child processes (:mod:`tests.fault_worker`, started with
  :func:`tests.test_serve_crash.server`, which kills and waits for each on the way out,
  failure or not); clients over HTTP.
- The promise checked: a run that got a 202 finishes as it would have without the fault;
  an answer that got a 200 is applied (its run ends paid); a tool call executes exactly
  once (no worker dies here, so no at-least-once window excuses a second execution); each
  worker recovers by itself; no client call waits past the store timeout plus
  :data:`MARGIN`. The figures come from the store (``toolnexus.runs``) and from the
  ledger file the tool appends to as it executes (``tests/fault_worker.py``), which does
  not live in the database because the database is down while tools run.
- The load is shaped so that the fault hits a mix: runs parked, answers being sent, tools
  executing (a third of the parked runs were approved just before, and their payments take
  :data:`WORK` seconds), and runs being started. A client retries a 503 or a connection
  error until a deadline; a 202 or a 200 counts only once received.
- Nothing sleeps to synchronise: every wait polls a condition under a deadline. What does
  sleep is the fault itself (an outage of five seconds is five seconds long, a lock is
  held that long) and a client's pause before it retries.
- With ``TOOLNEXUS_FAULTS_REPORT=<file>`` set, a test appends its figures (one JSON line:
  runs lost, calls executed twice, recovery times) to the file and asserts nothing: the
  measurement of code that does not keep the promise yet.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import anyio
import asyncpg
import pytest

from tests.pg import PgCluster, terminate_others
from tests.test_serve_crash import TOKEN, Server, server
from toolnexus_async import RunResult

LEASE = 4.0  # seconds: an outage of 5 s is longer than a lease, one of 8 s twice as long
STORE_TIMEOUT = 1.0  # seconds a statement may take (the workers' command_timeout)
# A client call may take the store timeout plus this; past it, it counts as an overrun.
MARGIN = 0.5
CALL_LIMIT = STORE_TIMEOUT + MARGIN
WORK = 0.8  # seconds an approved payment takes
RUNS_BEFORE = 24  # started and parked before the fault
RUNS_DURING = 12  # started as the fault begins
BATCH = RUNS_BEFORE // 3  # answered before the fault; as many more as it begins
IN_FLIGHT = 6  # client calls of each kind at once
POLL = 0.1  # seconds between two looks at the store or the workers
RETRY_PAUSE = 0.2  # seconds a client waits before it retries (at most; or Retry-After)
START_WAIT = 20.0  # seconds to start a cluster's workers and park the first runs
FINISH = 45.0  # seconds, from the end of the fault, for every accepted run to finish
LOCK_HOLD = 3 * STORE_TIMEOUT  # seconds the lock is held: well past the store timeout
LIMIT = 150.0  # seconds a whole test may take: the hang guard
REPORT = os.environ.get("TOOLNEXUS_FAULTS_REPORT")


async def observe(dsn: str, query: str, *args: Any) -> list[Any] | None:
    """``query``'s rows on a connection of its own, or None while the database cannot be
    reached (a connection kept across a fault would be ended by it)."""
    try:
        with anyio.fail_after(5):
            conn = await asyncpg.connect(dsn, timeout=2)
            try:
                rows: list[Any] = await conn.fetch(query, *args)
                return rows
            finally:
                await conn.close()
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
        return None


def clock(at: float) -> str:
    """A wall-clock time as the workers' logs show it (``HH:MM:SS.mmm``, local time)."""
    return time.strftime("%H:%M:%S", time.localtime(at)) + f".{int(at % 1 * 1000):03d}"


def read_ledger(path: Path) -> list[tuple[str, str, int, float]]:
    """The ledger's lines: (run id, idempotency key, pid, time), one per execution."""
    if not path.exists():
        return []
    lines = []
    for line in path.read_text().splitlines():
        run_id, key, pid, at = line.split()
        lines.append((run_id, key, int(pid), float(at)))
    return lines


class Clients:
    """The test's clients of the workers: every call bounded by :data:`CALL_LIMIT`, every
    status counted, every call that hit the bound recorded as an overrun."""

    def __init__(self, workers: list[Server]) -> None:
        self.workers = workers
        self.statuses: Counter[str] = Counter()
        self.overruns: list[str] = []
        self.slowest: dict[str, float] = {}  # "<method> <route> <status>" -> seconds

    async def call(
        self, worker: Server, method: str, path: str, body: Any = None
    ) -> tuple[int, Any, float] | None:
        """(status, JSON body or None, Retry-After seconds or 0), or None for no answer:
        a connection error, or the bound passed (an overrun)."""
        kind = f"{method} {path.split('/')[1]}"
        began, began_at = time.monotonic(), time.time()
        try:
            with anyio.fail_after(CALL_LIMIT):
                async with worker.session.request(method, path, json=body) as reply:
                    try:
                        data = await reply.json(content_type=None)
                    except ValueError:
                        data = None
                    retry_after = float(reply.headers.get("Retry-After", "0") or 0)
                    status = reply.status
        except TimeoutError:
            self.overruns.append(f"{clock(began_at)} {worker.name} {method} {path}")
            self.statuses[f"{kind} overrun"] += 1
            return None
        except (aiohttp.ClientError, ValueError):
            self.statuses[f"{kind} no connection"] += 1
            return None
        took = time.monotonic() - began
        self.statuses[f"{kind} {status}"] += 1
        self.slowest[f"{kind} {status}"] = round(
            max(self.slowest.get(f"{kind} {status}", 0), took), 2
        )
        return status, data, retry_after

    async def retrying(
        self, first: int, method: str, path: str, body: Any, done: Callable[[int], bool]
    ) -> tuple[int, Any] | None:
        """Send until ``done(status)``, taking the workers in turn from ``first``, pausing
        before each retry; None if the deadline passed first."""
        with anyio.move_on_after(FINISH):
            for attempt in range(first, first + 1_000_000):
                got = await self.call(self.workers[attempt % len(self.workers)], method, path, body)
                if got is not None and done(got[0]):
                    return got[0], got[1]
                pause = RETRY_PAUSE if got is None else min(got[2] or RETRY_PAUSE, RETRY_PAUSE)
                await anyio.sleep(pause)
        return None


class Load:
    """Runs started, requests answered: what the clients were told, as they were told it."""

    def __init__(self, clients: Clients) -> None:
        self.clients = clients
        self.amount: dict[str, int] = {}  # run id -> amount, for every 202
        self.refused: list[tuple[int, Any]] = []  # a start that got a final non-202
        self.released: set[str] = set()  # runs whose requests may be answered
        self.release_all = False
        self.answered: dict[str, str] = {}  # request id -> run id, for every 200
        self.closed: dict[str, tuple[int, Any]] = {}  # request id -> a final non-200
        self.sending: set[str] = set()  # request ids whose answer is being sent
        self.requests_of: dict[str, set[str]] = {}  # run id -> request ids seen listed
        self.sent = anyio.Event()  # set (and replaced) whenever answers begin to be sent
        self.stop = anyio.Event()

    async def start(self, i: int) -> None:
        got = await self.clients.retrying(
            i, "POST", "/runs", {"prompt": f"pay {i}"}, lambda s: s not in (429, 500, 502, 503)
        )
        if got is not None and got[0] == 202:
            self.amount[got[1]["id"]] = i
        elif got is not None:
            self.refused.append(got)

    async def start_all(self, numbers: range) -> None:
        limiter = anyio.CapacityLimiter(IN_FLIGHT)

        async def one(i: int) -> None:
            async with limiter:
                await self.start(i)

        async with anyio.create_task_group() as tg:
            for i in numbers:
                tg.start_soon(one, i)

    async def answer(self, request_id: str, run_id: str, first: int) -> None:
        try:
            got = await self.clients.retrying(
                first,
                "POST",
                f"/requests/{request_id}/answer",
                {"ok": True},
                lambda s: s not in (429, 500, 502, 503),
            )
            if got is not None and got[0] == 200:
                self.answered[request_id] = run_id
            elif got is not None:
                self.closed[request_id] = got
        finally:
            self.sending.discard(request_id)

    async def answer_all(self) -> None:
        """Answer every released request as it is listed, by any worker, until stopped."""
        limiter = anyio.CapacityLimiter(IN_FLIGHT)

        async def one(request_id: str, run_id: str, first: int) -> None:
            async with limiter:
                await self.answer(request_id, run_id, first)

        async with anyio.create_task_group() as tg:
            for turn in range(1_000_000_000):
                if self.stop.is_set():
                    break
                workers = self.clients.workers
                got = await self.clients.call(workers[turn % len(workers)], "GET", "/requests")
                if got is not None and got[0] == 200:
                    for request in got[1]["requests"]:
                        request_id, run_id = request["id"], request["run_id"]
                        self.requests_of.setdefault(run_id, set()).add(request_id)
                        if request_id in self.answered or request_id in self.closed:
                            continue
                        if request_id in self.sending:
                            continue
                        if run_id in self.released or self.release_all:
                            self.sending.add(request_id)
                            tg.start_soon(one, request_id, run_id, turn)
                if self.sending:
                    self.sent.set()
                    self.sent = anyio.Event()
                with anyio.move_on_after(POLL):
                    await self.stop.wait()
            # Answers being sent still get their reply: a 200 counts once received.


def final_text(final: str | None) -> str:
    """What a run ended with, from its ``final`` column (the store keeps the whole run as
    JSON; its text is what the model ended with)."""
    return RunResult.from_dict(json.loads(final)).text or "" if final else ""


class StoreView(Protocol):
    """The store as the harness reads it, on a connection of its own: each answer is None
    while the store cannot be read (the fault may not be over)."""

    async def ended(self, run_ids: list[str]) -> dict[str, tuple[str, str]] | None:
        """run id -> (status, final text) of those of ``run_ids`` the store has as ended
        (done, or failed: a failed run is never resumed by itself)."""
        ...

    async def runs(self) -> list[tuple[Any, ...]] | None:
        """Every run the store has: (run id, status, owner, error, prompt)."""
        ...

    async def asked(self) -> list[tuple[str, int]] | None:
        """(run id, how many requests it made), for each run that made one."""
        ...


class PgStore:
    """:class:`StoreView` of the ``toolnexus`` schema of the database at ``dsn``."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    async def ended(self, run_ids: list[str]) -> dict[str, tuple[str, str]] | None:
        rows = await observe(
            self.dsn,
            "SELECT run_id, status, final FROM toolnexus.runs"
            " WHERE run_id = ANY($1) AND status IN ('done', 'failed')",
            run_ids,
        )
        return None if rows is None else {row[0]: (row[1], final_text(row[2])) for row in rows}

    async def runs(self) -> list[tuple[Any, ...]] | None:
        query = "SELECT run_id, status, owner, error, prompt FROM toolnexus.runs"
        rows = await observe(self.dsn, query)
        return None if rows is None else [tuple(row) for row in rows]

    async def asked(self) -> list[tuple[str, int]] | None:
        query = "SELECT run_id, count(*) FROM toolnexus.requests GROUP BY run_id"
        rows = await observe(self.dsn, query)
        return None if rows is None else [(row[0], row[1]) for row in rows]


async def serving(clients: Clients, worker: Server) -> bool:
    """Whether ``worker`` serves: ``GET /readyz`` is 200 (a worker without it: ``GET
    /requests`` is)."""
    got = await clients.call(worker, "GET", "/readyz")
    if got is not None and got[0] == 404:
        got = await clients.call(worker, "GET", "/requests")
    return got is not None and got[0] == 200


async def until(seconds: float, check: Callable[[], Awaitable[bool]]) -> bool:
    """Poll ``check`` until it holds (True) or ``seconds`` passed (False)."""
    with anyio.move_on_after(seconds):
        while True:
            if await check():
                return True
            await anyio.sleep(POLL)
    return False


@asynccontextmanager
async def two_workers(dsn: str, tmp_path: Path, ledger: Path) -> AsyncIterator[list[Server]]:
    command = [sys.executable, "-m", "tests.fault_worker", "--dsn", dsn, "--token", TOKEN]
    command += ["--lease", str(LEASE), "--ledger", str(ledger)]
    command += ["--store-timeout", str(STORE_TIMEOUT), "--work", str(WORK)]
    async with AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(server(command, tmp_path / f"worker{i}.log"))
            for i in range(2)
        ]


async def database(cluster: PgCluster) -> str:
    """A new database on the test's cluster, its DSN."""
    rows = await observe(cluster.server.dsn, "SELECT 1")
    assert rows is not None, cluster.log_tail()
    conn = await asyncpg.connect(cluster.server.dsn)
    try:
        await conn.execute("CREATE DATABASE app TEMPLATE template0")
    finally:
        await conn.close()
    return cluster.server.dsn_for("app")


# A fault: done to the cluster (or the database at the DSN) while the load goes on; returns
# once the database is back, with figures of its own.
Fault = Callable[[PgCluster, str, "Load"], Awaitable[dict[str, Any]]]


def crash_for(seconds: float) -> Fault:
    async def fault(cluster: PgCluster, dsn: str, load: Load) -> dict[str, Any]:
        await anyio.to_thread.run_sync(cluster.crash)
        await anyio.sleep(seconds)  # the outage itself, not a wait for anything
        await anyio.to_thread.run_sync(cluster.start)
        return {}

    return fault


async def terminate(cluster: PgCluster, dsn: str, load: Load) -> dict[str, Any]:
    return {"terminated": await terminate_others(dsn)}


async def lock_runs(cluster: PgCluster, dsn: str, load: Load) -> dict[str, Any]:
    """Hold ``runs`` locked for :data:`LOCK_HOLD` seconds; meanwhile each worker is asked
    ``POST /runs`` (which needs the table) over and over: each must be told 503 in time.
    The last probe is let finish before the lock goes (one cut off would leave a run its
    client never heard of); a probe accepted all the same is one more run that must
    finish."""
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            await conn.execute("LOCK TABLE toolnexus.runs IN ACCESS EXCLUSIVE MODE")
            probes = await probe_starts(load, LOCK_HOLD)
    finally:
        await conn.close()
    return {"probes while locked": probes}


async def probe_starts(load: Load, seconds: float) -> dict[str, int]:
    """Ask the workers in turn ``POST /runs`` over and over for ``seconds``; how many
    probes got each answer. The last probe finishes before this returns; a probe accepted
    is one more run of ``load`` (``pay 0``) that must finish."""
    clients = load.clients
    probes: Counter[str] = Counter()
    until = time.monotonic() + seconds
    for turn in range(1_000_000):
        if time.monotonic() >= until:
            break
        worker = clients.workers[turn % len(clients.workers)]
        got = await clients.call(worker, "POST", "/runs", {"prompt": "pay 0"})
        probes["no answer" if got is None else str(got[0])] += 1
        if got is not None and got[0] == 202:
            load.amount[got[1]["id"]] = 0
    return dict(probes)


async def exercise(cluster: PgCluster, tmp_path: Path, name: str, fault: Fault) -> dict[str, Any]:
    """:func:`drive` on PostgreSQL: two workers on a new database of ``cluster``."""
    dsn = await database(cluster)
    ledger = tmp_path / "ledger.txt"

    async def at_the_database(load: Load) -> dict[str, Any]:
        return await fault(cluster, dsn, load)

    return await drive(
        two_workers(dsn, tmp_path, ledger), PgStore(dsn), ledger, name, at_the_database
    )


async def drive(
    started_workers: AbstractAsyncContextManager[list[Server]],
    view: StoreView,
    ledger: Path,
    name: str,
    fault: Callable[[Load], Awaitable[dict[str, Any]]],
) -> dict[str, Any]:
    """The harness: load on the workers (whose tool appends to ``ledger``), the fault
    (which returns once it is over, with figures of its own), recovery; returns the
    figures (see :func:`judge`)."""
    figures: dict[str, Any] = {"fault": name}
    async with started_workers as workers, anyio.create_task_group() as tg:
        figures["workers"] = len(workers)
        clients = Clients(workers)
        load = Load(clients)
        tg.start_soon(load.answer_all)
        with anyio.fail_after(START_WAIT):
            await load.start_all(range(RUNS_BEFORE))
        early = list(load.amount)
        assert len(early) == RUNS_BEFORE, load.refused

        async def all_parked() -> bool:
            return all(load.requests_of.get(r) for r in early)

        assert await until(START_WAIT, all_parked), "the early runs did not all park"

        # A third approved: the fault comes while their payments are being made.
        load.released.update(early[:BATCH])

        async def paying() -> bool:
            ran = {line[0] for line in read_ledger(ledger)}
            return len(ran & set(early[:BATCH])) >= BATCH // 2

        assert await until(START_WAIT, paying), "the first approvals were not acted on"

        # The fault: a third more answered, and more runs started, as it begins. It begins
        # as the answers leave, so that it finds some on their way.
        sent = load.sent
        load.released.update(early[BATCH : 2 * BATCH])
        with anyio.fail_after(START_WAIT):
            await sent.wait()
        starting, started = anyio.Event(), anyio.Event()

        async def start_more() -> None:
            starting.set()
            await load.start_all(range(RUNS_BEFORE, RUNS_BEFORE + RUNS_DURING))
            started.set()

        tg.start_soon(start_more)
        await starting.wait()
        began = time.time()
        figures["at the fault"] = {
            "answered": len(load.answered),
            "answers in flight": len(load.sending),
            "executing": sum(1 for line in read_ledger(ledger) if line[3] > began - WORK),
        }
        figures.update(await fault(load))
        back = time.time()
        figures["fault seconds"] = round(back - began, 2)
        figures["fault from/to"] = f"{clock(began)} {clock(back)}"
        load.release_all = True

        # Recovery: each worker serves again by itself; every accepted run finishes.
        serving_after: dict[str, float] = {}

        async def recovered() -> bool:
            for worker in workers:
                if worker.name not in serving_after and await serving(clients, worker):
                    serving_after[worker.name] = round(time.time() - back, 2)
            return len(serving_after) == len(workers)

        finished_at: dict[str, float] = {}
        texts: dict[str, str] = {}  # the done runs' texts
        failed: set[str] = set()

        async def all_ended() -> bool:
            for run_id, (status, text) in (await view.ended(list(load.amount)) or {}).items():
                if status == "done":
                    finished_at.setdefault(run_id, time.time())
                    texts[run_id] = text
                else:
                    failed.add(run_id)
            return set(texts) | failed == set(load.amount)

        # Each wait ends at its deadline, not with the test: the figures say what it missed.
        await until(FINISH, recovered)
        with anyio.move_on_after(FINISH):
            await started.wait()  # every start retried during the fault got its reply
            await until(FINISH, all_ended)
        load.stop.set()
        tg.cancel_scope.cancel()

    store = await view.runs()
    asked = await view.asked()
    lines = read_ledger(ledger)
    executions = Counter(key for _, key, _, _ in lines)
    runs_of_key = {key: run_id for run_id, key, _, _ in lines}
    accepted = set(load.amount)
    lost = sorted(accepted - set(texts))
    unpaid = sorted(r for r in texts if texts[r] != f"pay=paid {load.amount[r]}")
    not_applied = sorted(
        r for r in set(load.answered.values()) & accepted if "paid" not in texts.get(r, "")
    )
    figures.update(
        {
            "accepted": len(accepted),
            "lost": lost,
            "failed": sorted(failed),
            "lost rows": [tuple(row) for row in (store or []) if row[0] in lost],
            "unpaid": unpaid,
            "answers 200": len(load.answered),
            "answers not applied": not_applied,
            "answers closed": {k: v[0] for k, v in load.closed.items()},
            "starts refused": load.refused,
            "executions": len(lines),
            "twice": {k: [runs_of_key[k], n] for k, n in executions.items() if n > 1},
            "paid without execution": sorted(
                r for r in accepted if texts.get(r) and r not in runs_of_key.values()
            ),
            "asked twice": {row[0]: row[1] for row in (asked or []) if row[1] > 1},
            # Kept by a worker though its client never got the 202 (it gave up waiting, or
            # was told 503): no promise covers them, but a retried start made a second run.
            "runs nobody was told of": sorted(
                (row[4], row[0], row[1]) for row in (store or []) if row[0] not in accepted
            ),
            "serving again after": serving_after,
            "last run done after": (
                round(max(finished_at.values()) - back, 2) if finished_at else None
            ),
            "overruns": clients.overruns,
            "slowest call": max(clients.slowest.values(), default=0.0),
            "slowest": dict(sorted(clients.slowest.items())),
            "statuses": dict(sorted(clients.statuses.items())),
        }
    )
    return figures


def judge(figures: dict[str, Any]) -> None:
    """Report the figures (``TOOLNEXUS_FAULTS_REPORT``), or assert the promise on them."""
    print(json.dumps(figures, indent=1, default=str))
    if REPORT:
        with open(REPORT, "a") as report:
            report.write(json.dumps(figures, default=str) + "\n")
        return
    # Every broken promise at once: which runs, which calls, which requests.
    others = [k for k in figures["statuses"] if k.split()[-1][0] == "5" and k[-4:] != " 503"]
    broken = {
        "202'd runs not done (their rows)": figures["lost rows"],
        "done runs not paid": figures["unpaid"],
        "200'd answers not applied": figures["answers not applied"],
        "starts refused": figures["starts refused"],
        "calls executed more than once": figures["twice"],
        "paid without an execution": figures["paid without execution"],
        "workers not serving again": figures["workers"] - len(figures["serving again after"]),
        "client calls past the store timeout + margin": figures["overruns"],
        "5xx other than 503": others,
        "probes while locked answered other than 503": {
            k: n for k, n in figures.get("probes while locked", {}).items() if k != "503"
        },
    }
    broken = {promise: what for promise, what in broken.items() if what}
    assert not broken, json.dumps(broken, indent=1, default=str)


@pytest.mark.parametrize("outage", [5.0, 2 * LEASE], ids=["5s", "twice-the-lease"])
async def test_database_killed_and_started_again(
    pg_cluster: PgCluster, tmp_path: Path, outage: float
):
    """``pg_ctl stop -m immediate``, started again on the same port after ``outage``."""
    with anyio.fail_after(LIMIT):
        figures = await exercise(pg_cluster, tmp_path, f"crash {outage:g}s", crash_for(outage))
    judge(figures)


async def test_every_worker_connection_terminated(pg_cluster: PgCluster, tmp_path: Path):
    """``pg_terminate_backend`` of every connection the workers have."""
    with anyio.fail_after(LIMIT):
        figures = await exercise(pg_cluster, tmp_path, "terminate", terminate)
    judge(figures)


async def test_runs_locked_past_the_store_timeout(pg_cluster: PgCluster, tmp_path: Path):
    """``LOCK TABLE toolnexus.runs IN ACCESS EXCLUSIVE MODE`` held for three store
    timeouts: meanwhile the workers answer 503 in time; then they recover."""
    with anyio.fail_after(LIMIT):
        figures = await exercise(pg_cluster, tmp_path, "lock", lock_runs)
    assert figures["probes while locked"], "no worker was asked while the lock was held"
    judge(figures)
