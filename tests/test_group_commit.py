"""The SQLite store's group commit takes a bounded number of writes per transaction.

A burst bigger than the bound commits in several transactions, in the order its writes
were queued, and every caller is told its own outcome (a refusal in its caller alone); a
SIGKILL in the middle of such a burst loses no write that was acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import sys
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from tests.conftest import assert_no_leaks
from tests.shared import raw_sql
from toolnexus_async import StoreError, UsageError
from toolnexus_async._core.loop import RunLoop
from toolnexus_async.durable import SqliteRunStore
from toolnexus_async.durable.sqlite import _committer
from toolnexus_async.durable.sqlite._batch import apply as real_apply

NOW = 1_900_000_000.0
BOUND = 8  # a bound a test can reach (the store's own is thousands)


async def test_a_burst_commits_in_bounded_batches_in_queue_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes: list[int] = []

    def apply(conn: sqlite3.Connection, batch: list[Any], keep: int) -> list[Any]:
        sizes.append(len(batch))
        return real_apply(conn, batch, keep)

    monkeypatch.setattr(_committer, "apply", apply)
    path = tmp_path / "runs.sqlite"
    store = SqliteRunStore(path)
    store._commits.batch_max = BOUND
    runs = [f"run_{n:02}" for n in range(50)]
    refused: list[str] = []

    async def start(run_id: str) -> None:
        try:
            await store.start(RunLoop("go", run_id=run_id).snapshot(), "A", NOW + 30)
        except UsageError:
            refused.append(run_id)

    async with store:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                for run_id in runs:
                    tg.start_soon(start, run_id)
                    if run_id == "run_20":  # queued behind its first start: refused alone
                        tg.start_soon(start, "run_03")
        assert_no_leaks()

    assert max(sizes) <= BOUND and sum(sizes) == len(runs) + 1
    assert len(sizes) >= (len(runs) + 1) // BOUND  # unbounded, the burst was two batches
    assert refused == ["run_03"]
    stored = [row[0] for row in raw_sql(path, "SELECT run_id FROM runs ORDER BY seq")]
    assert stored == runs  # committed in the order the writes were queued


CHILD = """
import sys, time

import anyio

from toolnexus_async._core.loop import RunLoop
from toolnexus_async.durable import SqliteRunStore
from toolnexus_async.durable.sqlite import _committer

DB, RUNS, BOUND = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
real_apply = _committer.apply


def slow_apply(conn, batch, keep):
    time.sleep(0.01)  # widens the window the parent kills in; synchronises nothing
    return real_apply(conn, batch, keep)


_committer.apply = slow_apply


async def main():
    store = SqliteRunStore(DB)
    store._commits.batch_max = BOUND

    async def start(n):
        run_id = f"run_{n:04}"
        await store.start(RunLoop("go", run_id=run_id).snapshot(), "A", time.time() + 30)
        print(run_id, flush=True)  # acknowledged: its transaction committed

    async with store, anyio.create_task_group() as tg:
        for n in range(RUNS):
            tg.start_soon(start, n)


anyio.run(main)
"""


async def test_sigkill_mid_burst_loses_no_acknowledged_write(tmp_path: Path) -> None:
    """SIGKILL while a burst bigger than the bound is committing, right after the first
    writes were acknowledged: every acknowledged write is in the file, and what is there
    is a prefix of the queue (the batches committed in order, the one cut off not at all)."""
    script, db = tmp_path / "child.py", tmp_path / "runs.sqlite"
    script.write_text(CHILD)
    runs = 400
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    async with await anyio.open_process(
        [sys.executable, str(script), str(db), str(runs), str(BOUND)], env=env
    ) as child:
        assert child.stdout is not None
        lines = BufferedByteReceiveStream(child.stdout)
        with anyio.fail_after(30):
            first = await lines.receive_until(b"\n", 1 << 16)
            child.send_signal(signal.SIGKILL)  # the next batches are in flight
            assert await child.wait() == -signal.SIGKILL
            rest = b""
            with contextlib.suppress(anyio.EndOfStream, anyio.IncompleteRead):
                while True:
                    rest += await lines.receive()
    acknowledged = [first.decode(), *rest.decode().split()]
    stored = [row[0] for row in raw_sql(db, "SELECT run_id FROM runs ORDER BY seq")]
    assert set(acknowledged) <= set(stored)
    assert 0 < len(stored) < runs  # killed mid-burst
    assert stored == [f"run_{n:04}" for n in range(len(stored))]  # a prefix, in queue order


class HeldBurst:
    """A burst whose first batch is held in the store's worker thread (until ``release``)
    while three more writes queue behind it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.in_commit = threading.Event()
        self.release = threading.Event()

        def apply(conn: sqlite3.Connection, batch: list[Any], keep: int) -> list[Any]:
            if not self.in_commit.is_set():
                self.in_commit.set()
                self.release.wait(10)
            return real_apply(conn, batch, keep)

        monkeypatch.setattr(_committer, "apply", apply)

    async def start(
        self, store: SqliteRunStore
    ) -> tuple[asyncio.Task[None], list[asyncio.Task[None]]]:
        """The first writer (its batch in the thread) and the three queued behind it."""
        first = asyncio.create_task(start(store, "run_first"))
        await anyio.to_thread.run_sync(self.in_commit.wait)
        behind = [asyncio.create_task(start(store, f"run_{n}")) for n in range(3)]
        while len(store._commits._queue) < len(behind):
            await anyio.lowlevel.checkpoint()
        return first, behind


async def start(store: SqliteRunStore, run_id: str) -> None:
    await store.start(RunLoop("go", run_id=run_id).snapshot(), "A", NOW + 30)


async def test_a_writer_cancelled_by_asyncio_strands_no_other_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``asyncio.timeout``/``wait_for`` cancel a task natively, where an anyio shield does
    not reach: the first writer of a burst cancelled that way while its batch commits must
    not leave the writes queued behind it waiting for ever, nor fail them."""
    held = HeldBurst(monkeypatch)
    path = tmp_path / "runs.sqlite"
    async with SqliteRunStore(path) as store:
        with anyio.fail_after(10):
            first, behind = await held.start(store)
            first.cancel()
            held.release.set()
            with contextlib.suppress(asyncio.CancelledError):
                await first
            await asyncio.gather(*behind)  # each told its write committed
        assert_no_leaks()
    stored = {row[0] for row in raw_sql(path, "SELECT run_id FROM runs")}
    assert stored == {"run_first", "run_0", "run_1", "run_2"}


async def test_a_cancelled_committer_tells_every_writer_it_may_not_be_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The committer task itself cancelled (as when the event loop closes): its batch in
    the thread and the writes queued behind it each get a StoreError saying the write may
    or may not be committed, none waits for ever, and the next write commits."""
    held = HeldBurst(monkeypatch)
    path = tmp_path / "runs.sqlite"
    async with SqliteRunStore(path) as store:
        with anyio.fail_after(10):
            first, behind = await held.start(store)
            committer = store._commits._committer
            assert committer is not None
            committer.cancel()
            held.release.set()
            outcomes = await asyncio.gather(first, *behind, return_exceptions=True)
            assert all(isinstance(o, StoreError) for o in outcomes), outcomes
            assert all("may or may not be committed" in str(o) for o in outcomes)
            assert store._commits._queue == []
            await start(store, "run_after")
        assert_no_leaks()
    stored = {row[0] for row in raw_sql(path, "SELECT run_id FROM runs")}
    assert "run_after" in stored and not stored & {"run_0", "run_1", "run_2"}


async def test_a_job_left_running_by_a_native_cancel_has_the_connection_to_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A native cancellation lets go of the thread limiter while the job it cancelled goes
    on in its thread. The next job, and ``aclose``'s close, must still wait for that job to
    end: two threads on one SQLite connection, or a close under a running statement, can
    crash the process (it did, in CI, in the test above)."""
    window = 0.5  # how long the held job gives a wrongly started job to show up

    inside = threading.Event()  # the first batch's job is in its thread
    seen: list[bool] = []  # per later job: was the first job still inside when it began?

    def apply(conn: sqlite3.Connection, batch: list[Any], keep: int) -> list[Any]:
        if not seen and not inside.is_set():
            inside.set()
            # Held, not for synchronisation but as a window: a job that ran now, beside
            # this one, would record True. The correct order makes this wait run out.
            threading.Event().wait(window)
            try:
                return real_apply(conn, batch, keep)
            finally:
                inside.clear()
        return real_apply(conn, batch, keep)

    monkeypatch.setattr(_committer, "apply", apply)
    path = tmp_path / "runs.sqlite"
    async with SqliteRunStore(path) as store:
        with anyio.fail_after(10):
            first = asyncio.create_task(start(store, "run_first"))
            await anyio.to_thread.run_sync(inside.wait)
            committer = store._commits._committer
            assert committer is not None
            committer.cancel()  # natively, as asyncio does to every task as a loop closes
            with contextlib.suppress(StoreError):
                await first

            def probe(conn: sqlite3.Connection) -> None:
                seen.append(inside.is_set())

            await store._run(probe)
    assert seen == [False]
    stored = {row[0] for row in raw_sql(path, "SELECT run_id FROM runs")}
    assert stored == {"run_first"}  # the held batch committed, after all
