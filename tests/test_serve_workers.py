"""Several ``serve`` workers on one PostgreSQL database form one inbox (issue 13).

Every worker is a child process, :mod:`tests.serve_worker`: ``create_app`` and
``run_server`` on a :class:`PostgresRunStore` of the test's database (``pg_dsn``, a real
server: tests/pg.py), each on a free port of its own, all with the same token and a short
lease. Its tool ``pay`` asks for an approval, then pays; each ask and each payment is a
row of an ``effects`` table in the same database, with the process id and the call's
idempotency key, so the test counts what every process did. The servers are started with
:func:`tests.test_serve_crash.server`, which kills and waits for each on the way out,
whatever happened.

Nothing sleeps to synchronise: a test polls the HTTP API or the database until it shows
what the test waits for, under ``anyio.fail_after`` (``eventually``).

When the worker is killed: only while it has no tool executing. A tool's side effect (the
payment) and the commit of its recorded result are two writes; a worker killed between
them leaves a result that is not recorded, and the next worker runs the call again, with
the same idempotency key. That at-least-once window is the contract (a tool closes it by
passing the key to an API that deduplicates; ``test_serve_crash`` covers the re-run) and no
store can close it, so a test that counted payments across a kill at a random moment would
fail now and then for a reason that is not a bug. The victim is therefore killed once every
answer sent so far has produced its payment and its run has finished, while it still holds
runs parked in memory whose answers are not sent yet: what a kill must not lose is exactly
those (their requests, the answers other workers take for them after the kill, and the
runs, which the others take over once the dead worker's lease ran out).
"""

from __future__ import annotations

import random
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio
import asyncpg

from tests.conftest import assert_no_leaks
from tests.serve_worker import EFFECTS_TABLE
from tests.test_serve_api import Events
from tests.test_serve_crash import TOKEN, WAIT, Server, eventually, server
from toolnexus_async.durable import PostgresRunStore

T = TypeVar("T")

LEASE = "2"  # seconds: a dead worker's runs are taken over this soon
RUNS = 300
IN_FLIGHT = 16  # HTTP requests sent at once
LIMIT = 90  # seconds the 300-run test may take; the others take far less
SHORT_LIMIT = 40


@asynccontextmanager
async def workers(dsn: str, tmp_path: Path, count: int) -> AsyncIterator[list[Server]]:
    """``count`` workers on the database ``dsn``, each a child process on a port of its own;
    each is killed (if it still runs) and waited for on the way out, failure or not."""
    command = [sys.executable, "-m", "tests.serve_worker", dsn, TOKEN, LEASE]
    async with AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(server(command, tmp_path / f"worker{i}.log"))
            for i in range(count)
        ]


@asynccontextmanager
async def database(dsn: str) -> AsyncIterator[Any]:
    """A connection to the test's database, where the ``effects`` table is created first."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(EFFECTS_TABLE)
        yield conn
    finally:
        await conn.close()


def pid_of(worker_name: str) -> int:
    """The process id in a worker's name in the store (``host:pid:random``)."""
    return int(worker_name.rsplit(":", 2)[1])


async def each(items: Iterable[T], job: Callable[[T], Awaitable[None]]) -> None:
    """``await job(item)`` for every item, ``IN_FLIGHT`` at a time."""
    limiter = anyio.CapacityLimiter(IN_FLIGHT)

    async def one(item: T) -> None:
        async with limiter:
            await job(item)

    async with anyio.create_task_group() as tg:
        for item in items:
            tg.start_soon(one, item)


async def done_runs(db: Any, run_ids: Iterable[str]) -> set[str]:
    """Which of ``run_ids`` the store has as done."""
    rows = await db.fetch(
        "SELECT run_id FROM toolnexus.runs WHERE run_id = ANY($1) AND status = 'done'",
        list(run_ids),
    )
    return {row[0] for row in rows}


async def all_done(db: Any, run_ids: Iterable[str]) -> None:
    wanted = set(run_ids)

    async def check() -> bool | None:
        return True if await done_runs(db, wanted) == wanted else None

    await eventually(f"{len(wanted)} runs done in the store", check)


async def effects(db: Any) -> list[tuple[str, str, str, int, float]]:
    """The effects table: (what, idempotency key, run id, pid, time), in commit order."""
    rows = await db.fetch("SELECT what, key, run_id, pid, at FROM public.effects ORDER BY seq")
    return [tuple(row) for row in rows]


async def finished(dsn: str) -> dict[str, tuple[str, str | None]]:
    """Every run in the store, as (status, text), read through a store of the test's own;
    no request is outstanding."""
    async with PostgresRunStore(dsn) as store:
        assert await store.requests() == []
        return {run.run_id: (run.status, run.text) for run in await store.runs(limit=10 * RUNS)}


async def test_three_workers_300_runs_one_killed_half_way_lose_nothing_and_redo_nothing(
    pg_dsn: str, tmp_path: Path
):
    """300 runs started round-robin on 3 workers, every request answered through a worker
    chosen at random; once 150 answers are taken and their runs done, one worker is killed
    (``kill -9``). Its runs still waiting are answered through the 2 others (200 each: the
    answer is kept): some at once, some the moment its lease ran out (as the others take
    its runs over), a few after the others took the runs over and parked them again. All
    300 runs finish; each request was asked once and each payment made once; the dead
    worker's runs answered after the kill were paid by the others, after its lease ran
    out."""
    seed = random.randrange(1 << 32)
    print(f"random seed {seed}")
    rng = random.Random(seed)
    with anyio.fail_after(LIMIT):
        async with (
            database(pg_dsn) as db,
            workers(pg_dsn, tmp_path, 3) as three,
        ):
            pid = {w.name: w.process.pid for w in three}
            starter: dict[str, Server] = {}
            amount: dict[str, int] = {}

            async def start(i: int) -> None:
                served = three[i % 3]
                run_id = await served.start_run(f"pay {i}")
                starter[run_id], amount[run_id] = served, i

            await each(range(RUNS), start)
            assert len(starter) == RUNS

            async def every_run_asks() -> dict[str, dict[str, Any]] | None:
                listed = await rng.choice(three).requests()  # any worker lists them all
                by_run = {r["run_id"]: r for r in listed}
                assert len(by_run) == len(listed), "a run asks twice at once"
                return by_run if set(by_run) == set(starter) else None

            request = await eventually(f"{RUNS} requests listed", every_run_asks)
            for run_id, asked in request.items():
                assert (asked["kind"], asked["prompt"]) == (
                    "approval",
                    f"Pay {amount[run_id]} EUR?",
                )

            def answer_through(choose: Callable[[], Server]) -> Callable[[str], Awaitable[None]]:
                async def answer(run_id: str) -> None:
                    request_id = request[run_id]["id"]
                    served = choose()
                    reply = await served.answer(request_id, {"ok": True})
                    assert reply == (200, {"id": request_id, "ok": True}), (served.name, reply)

                return answer

            order = list(starter)
            rng.shuffle(order)
            before, after = order[: RUNS // 2], order[RUNS // 2 :]
            await each(before, answer_through(lambda: rng.choice(three)))
            # The moment to kill: every answer sent so far has been acted on (its runs
            # are done, so no tool executes anywhere) and every other run is parked, hot.
            await all_done(db, before)
            victim = rng.choice(three)
            live = [w for w in three if w is not victim]
            waiting = [r for r in after if starter[r] is victim]
            assert waiting, "the victim holds no run whose answer is not sent yet"
            held = await db.fetch(
                "SELECT DISTINCT status, owner FROM toolnexus.runs WHERE run_id = ANY($1)",
                waiting,
            )
            assert len(held) == 1 and held[0]["status"] == "running", held
            victim_worker = held[0]["owner"]
            assert pid_of(victim_worker) == pid[victim.name]
            assert not await done_runs(db, after)
            await victim.kill()
            print(f"killed {victim.name}, which held {len(waiting)} runs not answered yet")

            # Answered through the live workers: accepted and kept, though the runs' holder
            # is dead. Some of its runs are answered at once (its lease may still run)...
            late = set(waiting[:5])  # ... these once its runs were taken over
            expired = set(waiting[5 : 5 + len(waiting) // 2])  # ... these once it ran out
            soon = [r for r in after if r not in late | expired]
            await each(soon, answer_through(lambda: rng.choice(live)))

            # Answered the moment the lease ran out: racing the others' sweeps, which take
            # the dead worker's runs over.
            async def lease_ran_out() -> bool | None:
                (until,) = await db.fetchrow(
                    "SELECT alive_until FROM toolnexus.workers WHERE name = $1", victim_worker
                )
                return True if until < time.time() else None

            await eventually("the dead worker's lease to run out", lease_ran_out)
            await each(sorted(expired), answer_through(lambda: rng.choice(live)))

            # The others take the dead worker's runs over once its lease ran out; the runs
            # still waiting park on them again, with the same request.
            async def taken_over() -> bool | None:
                rows = await db.fetch(
                    "SELECT owner FROM toolnexus.runs WHERE run_id = ANY($1)", list(late)
                )
                owners = [row[0] for row in rows]
                live_pids = {pid[w.name] for w in live}
                return True if all(o and pid_of(o) in live_pids for o in owners) else None

            await eventually("the dead worker's runs taken over", taken_over)
            still = {r["run_id"]: r["id"] for r in await rng.choice(live).requests()}
            assert still.keys() >= late
            assert {r: still[r] for r in late} == {r: request[r]["id"] for r in late}
            await each(sorted(late), answer_through(lambda: rng.choice(live)))
            await all_done(db, order)

            runs = await finished(pg_dsn)
            assert runs == {r: ("done", f"pay=paid {amount[r]}") for r in order}
            for served in live:
                assert await served.requests() == []
            (alive_until,) = await db.fetchrow(
                "SELECT alive_until FROM toolnexus.workers WHERE name = $1", victim_worker
            )
            lines = await effects(db)

    # Each request was asked once, by the worker the run was started on.
    asks = [(run_id, p, key) for what, key, run_id, p, _ in lines if what == "asked"]
    assert Counter(run_id for run_id, _, _ in asks) == Counter(order)
    assert {run_id: p for run_id, p, _ in asks} == {r: pid[starter[r].name] for r in order}
    # Each payment was made once, with the key of the call that asked.
    paid = {run_id: (p, at, key) for what, key, run_id, p, at in lines if what == "paid"}
    assert sum(what == "paid" for what, *_ in lines) == len(paid) == RUNS
    assert {r: key for r, (_, _, key) in paid.items()} == {r: key for r, _, key in asks}
    # The run's holder paid: answers taken by another worker were handed over to it...
    moved = set(waiting)
    assert {r: paid[r][0] for r in order if r not in moved} == {
        r: pid[starter[r].name] for r in order if r not in moved
    }
    # ... except for the dead worker's runs answered after its death: the others paid
    # those, once its lease had run out.
    assert {paid[r][0] for r in moved} <= {pid[w.name] for w in live}
    assert all(paid[r][1] > alive_until for r in moved)
    # No run was driven by two hosts at once (the one that lost the run would log it).
    for log in tmp_path.glob("worker*.log"):
        assert "LeaseLostError" not in log.read_text(), log.read_text()
    assert_no_leaks()


async def test_conflicting_answers_through_three_workers_one_is_taken(pg_dsn: str, tmp_path: Path):
    """6 runs, 2 parked on each of 3 workers; for each, 12 answers at once, approvals and
    refusals, 4 to each worker (so to the worker parking it and to the two others). Of each
    12 exactly one is taken (200), 11 are 409; the run follows the one taken: paid if it
    was an approval, declined (and not paid) if a refusal."""
    with anyio.fail_after(SHORT_LIMIT):
        async with (
            database(pg_dsn) as db,
            workers(pg_dsn, tmp_path, 3) as three,
        ):
            run_ids = [await three[i % 3].start_run(f"pay {i}") for i in range(6)]

            async def listed() -> dict[str, str] | None:
                found = {r["run_id"]: r["id"] for r in await three[1].requests()}
                return found if set(found) == set(run_ids) else None

            request = await eventually("6 requests listed", listed)
            replies: dict[str, list[tuple[str, bool, int, Any]]] = {r: [] for r in run_ids}

            async def send(run: int, i: int) -> None:
                # Half the runs see an approval sent first, half a refusal.
                served, ok = three[i % 3], (i % 2 == 0) == (run % 2 == 0)
                run_id = run_ids[run]
                status, body = await served.answer(request[run_id], {"ok": ok})
                replies[run_id].append((served.name, ok, status, body))

            async with anyio.create_task_group() as tg:
                for i in range(12):
                    for run in range(6):
                        tg.start_soon(send, run, i)

            approved: dict[str, bool] = {}
            for run_id, got in replies.items():
                taken = [reply for reply in got if reply[2] == 200]
                assert len(taken) == 1, got
                ((_, ok, _, body),) = taken
                assert body == {"id": request[run_id], "ok": ok}
                refused = [reply for reply in got if reply[2] != 200]
                assert len(refused) == 11
                assert all(s == 409 and "answered already" in b["error"] for *_, s, b in refused)
                approved[run_id] = ok
            print(f"approvals taken: {sum(approved.values())} of 6")

            await all_done(db, run_ids)
            for run_id in run_ids:
                status, body = await three[0].answer(request[run_id], {"ok": True})
                assert status == 409, body
            lines = await effects(db)
    runs = await finished(pg_dsn)
    amount = {run_id: i for i, run_id in enumerate(run_ids)}
    assert runs == {
        r: (
            "done",
            f"pay=paid {amount[r]}" if ok else f"pay=declined/expired: Pay {amount[r]} EUR?",
        )
        for r, ok in approved.items()
    }
    assert Counter((what, run_id) for what, _, run_id, _, _ in lines) == Counter(
        [("asked", r) for r in run_ids] + [("paid", r) for r, ok in approved.items() if ok]
    )
    assert_no_leaks()


async def test_a_request_asked_on_one_worker_shows_on_anothers_event_stream(
    pg_dsn: str, tmp_path: Path
):
    """A run parks on worker A; worker B's ``GET /events`` shows its request as
    ``pending``, and as ``answered`` once it is answered through worker C; A's run goes on
    and is paid once."""
    with anyio.fail_after(SHORT_LIMIT):
        async with (
            database(pg_dsn) as db,
            workers(pg_dsn, tmp_path, 3) as (a, b, c),
            b.session.get("/events") as response,
        ):
            stream = Events(response)
            run_id = await a.start_run("pay 5")
            with anyio.fail_after(WAIT):
                pending = await stream.until("pending", run_id=run_id)
            request = pending["request"]
            assert (request["kind"], request["prompt"]) == ("approval", "Pay 5 EUR?")
            assert [r["id"] for r in await c.requests()] == [request["id"]]
            reply = await c.answer(request["id"], {"ok": True})
            assert reply == (200, {"id": request["id"], "ok": True})
            with anyio.fail_after(WAIT):
                answered = await stream.until("answered", request_id=request["id"])
            assert {"request_id": request["id"], "ok": True}.items() <= answered.items()

            async def paid() -> dict[str, Any] | None:
                run = await a.run(run_id)
                return run if run["status"] == "done" else None

            assert (await eventually("the run to end", paid))["text"] == "pay=paid 5"
            assert [name for name, data in stream.seen if name == "pending"] == ["pending"]
            lines = await effects(db)
    assert [(what, r, p) for what, _, r, p, _ in lines] == [
        ("asked", run_id, a.process.pid),
        ("paid", run_id, a.process.pid),
    ]
    assert_no_leaks()
