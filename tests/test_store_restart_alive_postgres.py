"""The PostgreSQL store's database restarted at the worst moments, its worker alive.

The worker is this test's process: a durable host over a :class:`PostgresRunStore` on a
cluster of the test's own (``pg_cluster``), driving a run whose model asks for ``pay``,
gated by ``require_approval``. The store's group commit is stopped (an awaited event; the
rest of the process goes on) once, at one of two points of the transaction of a chosen
write, by the hooks ``tests/test_turn_with_request_crash_postgres.py`` uses:

- ``commit``: every statement of the transaction ran, its ``COMMIT`` was not sent;
- ``after``: it committed, and no caller was told.

Stopped there, the cluster is stopped (``pg_ctl stop -m fast``: every session ended, open
transactions rolled back; or ``-m immediate``: killed, recovering from its WAL at the next
start) and started again on its port; then the commit goes on. The writes stopped at:

- the run's start (``begin``, ``serve``'s 202);
- the model's turn written with its gate's request, in one transaction (one run; eight
  runs in one batch; an outage longer than the lease);
- the answer to that request;
- the tool's result.

A third point, a ``COMMIT`` that committed with its reply cut off by the restart:
``tests/test_store_restart_unreplied_postgres.py``. The helpers: ``tests/restart_alive.py``.

What must hold, with no restart of the worker: nothing is acknowledged (the request
parked in the inbox, the answer's call returning) before it is committed; the run ends
as it would have without the restart, ``pay`` ran once, the model was asked once per
turn and exactly one request was ever written; an answer whose commit the restart undid
is refused with ``StoreUnavailableError`` (and may simply be sent again; one committed
with its reply cut off is refused when sent again, as answered already); a result
written again as it is stored is told once on the event feed; the pool serves again,
the LISTEN connection is opened again (an answer taken by another worker wakes the run
at once), nothing is left open once the store is closed, and no log line carries a
traceback, nor blames a fault on what the store did next with a dead connection.
"""

from __future__ import annotations

import logging
import time

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest

from tests.pg import PgCluster
from tests.restart_alive import (
    LIMIT,
    MODES,
    Pause,
    closed_clean,
    ended_once,
    restart,
    rows,
    turn_with_request,
    working,
    writes,
)
from tests.test_host import until
from tests.test_pg_faults import database
from toolnexus_async import (
    Answer,
    StoreUnavailableError,
)
from toolnexus_async.durable import BegunRun, PostgresRunStore
from toolnexus_async.durable.postgres._answer_ops import PgAnswerOps
from toolnexus_async.durable.postgres._errors import QUIET_FLOOR
from toolnexus_async.durable.postgres._run_ops import PgRunOps

POINTS = ("commit", "after")
RUNS = 8  # runs whose writes a restart meets at once
SHORT_LEASE = 1.5  # seconds: an outage of twice that outlives the lease

# A session listening for events (the last statement a LISTEN connection ran).
LISTENING = "SELECT pid FROM pg_stat_activity WHERE query LIKE 'LISTEN %'"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("point", POINTS)
async def test_database_restarted_at_the_turn_written_with_its_request(
    pg_cluster: PgCluster,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    point: str,
    mode: str,
) -> None:
    dsn = await database(pg_cluster)
    pause = Pause(monkeypatch, point, turn_with_request)
    with anyio.fail_after(LIMIT):
        async with working(dsn) as worker, anyio.create_task_group() as tg:
            pause.arm()
            tg.start_soon(worker.drive)
            await pause.paused.wait()
            await restart(pg_cluster, mode)
            pause.go()
            # Parked, so announced: only once the turn and its request are committed.
            (request,) = await worker.parked()
            asked = await rows(dsn, "SELECT request_id, status FROM toolnexus.requests")
            assert asked == [(request.id, "pending")]
            assert await rows(dsn, "SELECT turn FROM toolnexus.runs") == [(1,)]
            await worker.host.answer(Answer(request.id, True))
            await ended_once(dsn, worker)
    pause.check(point)
    await closed_clean(dsn, caplog)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("point", POINTS)
async def test_database_restarted_at_the_runs_start(
    pg_cluster: PgCluster,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    point: str,
    mode: str,
) -> None:
    """``begin`` (``serve``'s 202): a start the restart undid is refused and nothing of it
    is kept or left to let go; one it did not undo is acknowledged and runs."""
    dsn = await database(pg_cluster)
    pause = Pause(monkeypatch, point, lambda batch: writes(batch, PgRunOps.start))
    refused: list[BaseException] = []

    async def begin() -> None:
        try:
            await worker.drive()
        except StoreUnavailableError as exc:
            refused.append(exc)

    with anyio.fail_after(LIMIT):
        async with working(dsn) as worker, anyio.create_task_group() as tg:
            pause.arm()
            tg.start_soon(begin)
            await pause.paused.wait()
            await restart(pg_cluster, mode)
            pause.go()
            if point == "commit":
                await until(lambda: bool(refused))
                assert await rows(dsn, "SELECT run_id FROM toolnexus.runs") == []
                tg.start_soon(worker.drive)  # begun again: a new run
            (request,) = await worker.parked()
            await worker.host.answer(Answer(request.id, True))
            await ended_once(dsn, worker)
    assert len(refused) == (1 if point == "commit" else 0)
    pause.check(point)
    # The start refused was never kept: letting it go found nothing, and said nothing.
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
    await closed_clean(dsn, caplog)


@pytest.mark.parametrize("mode", MODES)
async def test_many_runs_in_the_batch_the_restart_undid(
    pg_cluster: PgCluster,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    mode: str,
) -> None:
    """Several runs' turns and requests in the batch stopped before its COMMIT: the
    restart fails them all, and each run retries its own write until it commits."""
    dsn = await database(pg_cluster)
    pause = Pause(monkeypatch, "commit", turn_with_request)
    with anyio.fail_after(LIMIT):
        async with working(dsn) as worker, anyio.create_task_group() as tg:
            begun = [await worker.host.begin("pay the invoice") for _ in range(RUNS)]
            pause.arm()

            async def drive(run: BegunRun[str]) -> None:
                worker.results.append(await run.run())

            for run in begun:
                tg.start_soon(drive, run)
            await pause.paused.wait()
            await restart(pg_cluster, mode)
            pause.go()
            requests = await worker.parked(RUNS)
            asked = await rows(dsn, "SELECT request_id FROM toolnexus.requests ORDER BY 1")
            assert asked == sorted((r.id,) for r in requests)
            for request in requests:
                await worker.host.answer(Answer(request.id, True))
            await ended_once(dsn, worker, RUNS)
    pause.check("commit")
    assert pause.stopped is not None and len(pause.stopped) > 1  # several runs' writes
    await closed_clean(dsn, caplog)


@pytest.mark.parametrize("mode", MODES)
async def test_database_down_longer_than_the_lease_at_the_turns_commit(
    pg_cluster: PgCluster,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    mode: str,
) -> None:
    """The lease lapses while the database is down (and the turn with its request is
    not committed): once it is back the worker renews it, finds the run still its own,
    writes the turn and its request, and goes on; nobody else took the run."""
    dsn = await database(pg_cluster)
    pause = Pause(monkeypatch, "commit", turn_with_request)
    with anyio.fail_after(LIMIT):
        async with working(dsn, lease=SHORT_LEASE) as worker, anyio.create_task_group() as tg:
            pause.arm()
            tg.start_soon(worker.drive)
            await pause.paused.wait()
            await anyio.to_thread.run_sync(pg_cluster.stop, mode)
            pause.go()
            # The outage itself: it lasts twice the lease (what is waited out here).
            await anyio.sleep(2 * SHORT_LEASE)
            await anyio.to_thread.run_sync(pg_cluster.start)
            (request,) = await worker.parked()
            await worker.host.answer(Answer(request.id, True))
            await ended_once(dsn, worker)
    pause.check("commit")
    await closed_clean(dsn, caplog)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("point", POINTS)
async def test_database_restarted_at_the_answers_commit(
    pg_cluster: PgCluster,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    point: str,
    mode: str,
) -> None:
    dsn = await database(pg_cluster)
    pause = Pause(monkeypatch, point, lambda batch: writes(batch, PgAnswerOps.accept))
    with anyio.fail_after(LIMIT):
        async with working(dsn) as worker, anyio.create_task_group() as tg:
            tg.start_soon(worker.drive)
            (request,) = await worker.parked()
            pause.arm()
            async with anyio.create_task_group() as answering:
                answering.start_soon(worker.answer, request)
                await pause.paused.wait()
                await restart(pg_cluster, mode)
                pause.go()
            if point == "commit":
                # Not committed, so not acknowledged: refused, and nothing of it kept.
                (exc,) = worker.refused
                assert "the database is unavailable now" in str(exc)
                assert await rows(dsn, "SELECT status FROM toolnexus.requests") == [("pending",)]
                assert await rows(dsn, "SELECT request_id FROM toolnexus.answers") == []
                assert worker.paid == [] and len(worker.inbox) == 1
                await worker.host.answer(Answer(request.id, True))  # sent again, taken
            else:
                assert worker.refused == []  # committed before the restart: acknowledged
            await ended_once(dsn, worker)
    pause.check(point)
    await closed_clean(dsn, caplog)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("point", POINTS)
async def test_database_restarted_at_the_tool_results_commit(
    pg_cluster: PgCluster,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    point: str,
    mode: str,
) -> None:
    dsn = await database(pg_cluster)
    pause = Pause(monkeypatch, point, lambda batch: writes(batch, PgRunOps.record))
    with anyio.fail_after(LIMIT):
        async with working(dsn) as worker, anyio.create_task_group() as tg:
            tg.start_soon(worker.drive)
            (request,) = await worker.parked()
            pause.arm()
            await worker.host.answer(Answer(request.id, True))
            await pause.paused.wait()
            assert worker.paid == ["paid"]  # executed; its result being committed
            await restart(pg_cluster, mode)
            pause.go()
            await ended_once(dsn, worker)
    pause.check(point)
    await closed_clean(dsn, caplog)


@pytest.mark.parametrize("mode", MODES)
async def test_after_a_restart_an_answer_taken_by_another_worker_wakes_the_run_at_once(
    pg_cluster: PgCluster, caplog: pytest.LogCaptureFixture, mode: str
) -> None:
    """The LISTEN connection the restart ended is opened again: the run parked here is
    woken by the other worker's event, not by a look at the store (``poll`` is an hour)."""
    dsn = await database(pg_cluster)
    with anyio.fail_after(LIMIT):
        async with working(dsn, poll=3600) as worker, anyio.create_task_group() as tg:
            tg.start_soon(worker.drive)
            (request,) = await worker.parked()
            await restart(pg_cluster, mode)
            # The worker's store reads again (its pool opens new connections), and once
            # a read succeeded it listens again, on its own channel, where the answers
            # other workers take for its runs are told.
            assert [r.id for r in await worker.host.requests()] == [request.id]
            assert len(await rows(dsn, LISTENING)) == 1
            async with PostgresRunStore(dsn) as elsewhere:
                await elsewhere.accept(Answer(request.id, True), time.time(), by="another worker")
            await ended_once(dsn, worker)
    await closed_clean(dsn, caplog)


async def test_the_floor_retries_of_a_pool_not_the_stores_are_left_as_they_are() -> None:
    """Only the store's pools are quietened: asyncpg's record from any other task (and
    from no event loop at all) goes out as it was."""
    record = logging.LogRecord(
        "asyncpg.pool",
        logging.WARNING,
        __file__,
        1,
        "Failed to restore the pool connection floor; retrying",
        None,
        None,
    )
    assert QUIET_FLOOR.filter(record)
    assert await anyio.to_thread.run_sync(QUIET_FLOOR.filter, record)
