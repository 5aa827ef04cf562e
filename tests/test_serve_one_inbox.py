"""Many workers are one inbox: every worker shows every run as the store has it (issue 34).

Three ``serve`` workers (child processes, :mod:`tests.serve_worker`) on one real
PostgreSQL database (tests/pg.py). Runs are started on each worker and answered through
another; a worker started after some runs began must show them, and must show the end of a
run that another worker finished. Every worker's ``GET /runs``, ``GET /runs/{id}`` and
event stream must agree with the store (read here with asyncpg), and a stream that
reconnects to another worker with ``Last-Event-ID`` must miss nothing and repeat nothing.

Nothing sleeps to synchronise: the tests read event streams, or poll the API
(``eventually``) under time limits.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import asyncpg

from tests.test_serve_api import Events
from tests.test_serve_crash import TOKEN, WAIT, Server, eventually, server
from tests.test_serve_workers import database

LEASE = "5"
LIMIT = 60

# The order of a run's events on every stream.
ORDER = ("run_started", "tool_call", "pending", "answered", "tool_result", "done")


@asynccontextmanager
async def stream_of(worker: Server, last_id: int | None = None) -> AsyncIterator[Events]:
    headers = {} if last_id is None else {"Last-Event-ID": str(last_id)}
    async with worker.session.get("/events", headers=headers) as response:
        assert response.status == 200
        yield Events(response)


async def two_workers(stack: AsyncExitStack, dsn: str, tmp_path: Path) -> tuple[Server, Server]:
    """Workers ``a`` and ``b`` on ``dsn`` (the effects table their tool writes made first),
    stopped with ``stack``."""
    await stack.enter_async_context(database(dsn))
    a = await stack.enter_async_context(start(dsn, tmp_path, "a"))
    return a, await stack.enter_async_context(start(dsn, tmp_path, "b"))


def start(dsn: str, tmp_path: Path, name: str) -> Any:
    command = [sys.executable, "-m", "tests.serve_worker", dsn, TOKEN, LEASE]
    return server(command, tmp_path / f"{name}.log")


async def store_runs(dsn: str) -> dict[str, tuple[str, str | None]]:
    """The runs as the database has them: id -> (status, outcome)."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT run_id, status, outcome FROM toolnexus.runs")
    finally:
        await conn.close()
    return {row[0]: (row[1], row[2]) for row in rows}


async def collect(stream: Events, runs: set[str], until: str) -> None:
    """Read ``stream`` until every run of ``runs`` had its ``until`` event (read before,
    or now)."""
    seen = {data.get("run_id") for name, data in stream.seen if name == until}
    with anyio.fail_after(WAIT):
        while not runs <= seen:
            name, data = await stream.next()
            if name == until:
                seen.add(data["run_id"])


def per_run(stream: Events, run_id: str) -> list[str]:
    """The events of ``run_id`` on ``stream``, in the order they came."""
    names = []
    for name, data in stream.seen:
        if data.get("run_id") == run_id:
            names.append(name)
    return names


async def test_three_workers_show_every_run_as_the_store_has_it(pg_dsn: str, tmp_path: Path):
    with anyio.fail_after(LIMIT):
        async with AsyncExitStack() as stack:
            a, b = await two_workers(stack, pg_dsn, tmp_path)
            on_a = await stack.enter_async_context(stream_of(a))
            on_b = await stack.enter_async_context(stream_of(b))

            # A run begun before worker C starts, parked on A.
            early = await a.start_run("pay 1")
            await collect(on_b, {early}, "pending")
            c = await stack.enter_async_context(start(pg_dsn, tmp_path, "c"))
            on_c = await stack.enter_async_context(stream_of(c))
            assert (await c.run(early))["status"] == "pending"

            # Runs started on each worker after every worker started.
            late = {w.name: await w.start_run(f"pay {n}") for n, w in enumerate((a, b, c), 2)}
            runs = {early, *late.values()}
            for stream in (on_a, on_b, on_c):
                await collect(stream, set(late.values()), "pending")

            # Every worker lists every request, and every run as the store has it.
            for worker in (a, b, c):
                assert {r["run_id"] for r in await worker.requests()} == runs
                listed = await worker.runs()
                assert {r: listed[r]["status"] for r in runs} == dict.fromkeys(runs, "pending")

            # Each answered through another worker than the one that started it: early (on
            # A) through C, A's through B, B's through C, C's through A.
            through = {early: c, late["a"]: b, late["b"]: c, late["c"]: a}
            asked = {r["run_id"]: r["id"] for r in await a.requests()}
            for run_id, worker in through.items():
                assert (await worker.answer(asked[run_id], {"ok": True}))[0] == 200
            for stream in (on_a, on_b, on_c):
                await collect(stream, runs, "done")

            # The store says done for all; so does every worker, in its list and one by one,
            # with the same history: the call, its request, and the answer's worker.
            assert {r: s for r, s in (await store_runs(pg_dsn)).items() if r in runs} == (
                dict.fromkeys(runs, ("done", "done"))
            )
            pids = {w.name: w.process.pid for w in (a, b, c)}
            shown: dict[str, list[dict[str, Any]]] = {}
            for worker in (a, b, c):
                listed = await worker.runs()
                assert {r: listed[r]["status"] for r in runs} == dict.fromkeys(runs, "done")
                for run_id in runs:
                    run = await worker.run(run_id)
                    assert run["text"].startswith("pay=paid")
                    [step] = run["steps"]
                    assert step["name"] == "pay" and step["request"]["id"] == asked[run_id]
                    assert step["answer"]["ok"] is True
                    by = through[run_id].name
                    assert f":{pids[by]}:" in step["answer"]["worker"], (by, step)
                    shown.setdefault(run_id, []).append(run)
            assert all(views[0] == view for views in shown.values() for view in views)

            # Every stream carried every run's events once each, in order per run, with
            # increasing ids; A's and B's saw the same events (C started later).
            for stream in (on_a, on_b, on_c):
                ids = [i for i in stream.ids if i is not None]
                assert ids == sorted(set(ids)) and len(ids) == len(stream.seen)
                for run_id in late.values():
                    assert per_run(stream, run_id) == list(ORDER), run_id
            assert per_run(on_a, early) == per_run(on_b, early) == list(ORDER)
            assert per_run(on_c, early) == list(ORDER[3:])  # C came after it parked
            assert on_a.ids == on_b.ids


async def test_a_stream_resumed_on_another_worker_misses_nothing(pg_dsn: str, tmp_path: Path):
    with anyio.fail_after(LIMIT):
        async with AsyncExitStack() as stack:
            a, b = await two_workers(stack, pg_dsn, tmp_path)
            whole = await stack.enter_async_context(stream_of(a))
            first = await a.start_run("pay 1")
            async with stream_of(b) as cut:
                await collect(cut, {first}, "pending")
                last = cut.ids[-1]
                assert last is not None
            # While no stream is open: another run starts and the first is answered.
            second = await b.start_run("pay 2")
            request_id = (await a.requests())[0]["id"]
            assert (await b.answer(request_id, {"ok": True}))[0] == 200
            await collect(whole, {first}, "done")
            await collect(whole, {second}, "pending")
            # Resumed on A (not the worker it left), from its last id.
            async with stream_of(a, last) as resumed:
                with anyio.fail_after(WAIT):
                    while len(resumed.seen) < len(missed := after(whole, last)):
                        await resumed.next()
                assert list(zip(resumed.ids, resumed.seen, strict=True)) == missed
            # An id the store never gave: told to fetch everything again, then live.
            async with stream_of(b, 10**9) as lost:
                name, data = await lost.next()
                assert name == "snapshot" and lost.ids[0] == data["id"]
                assert (await b.answer((await b.requests())[0]["id"], {"ok": True}))[0] == 200
                await collect(lost, {second}, "done")


def after(stream: Events, last: int) -> list[tuple[int | None, tuple[str, dict[str, Any]]]]:
    return [
        (i, e) for i, e in zip(stream.ids, stream.seen, strict=True) if i is not None and i > last
    ]


async def test_a_run_that_ended_elsewhere_is_never_shown_running(pg_dsn: str, tmp_path: Path):
    """The old bug: a worker that found a run at its start kept showing it ``running``
    after another worker finished it."""
    with anyio.fail_after(LIMIT):
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(database(pg_dsn))  # the workers' effects table
            a = await stack.enter_async_context(start(pg_dsn, tmp_path, "a"))
            on_a = await stack.enter_async_context(stream_of(a))
            run_id = await a.start_run("pay 7")
            await collect(on_a, {run_id}, "pending")
            b = await stack.enter_async_context(start(pg_dsn, tmp_path, "b"))
            assert (await b.run(run_id))["status"] == "pending"
            request_id = (await b.requests())[0]["id"]
            assert (await b.answer(request_id, {"ok": True}))[0] == 200
            await collect(on_a, {run_id}, "done")

            async def done_on_b() -> dict[str, Any] | None:
                run = await b.run(run_id)
                return run if run["status"] == "done" else None

            run = await eventually("the run done on B", done_on_b)
            assert run == await a.run(run_id)
            assert (await store_runs(pg_dsn))[run_id] == ("done", "done")
