"""The SQLite store's group commit takes a bounded number of writes per transaction.

A burst bigger than the bound commits in several transactions, in the order its writes
were queued, and every caller is told its own outcome (a refusal in its caller alone).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.conftest import assert_no_leaks
from tests.shared import raw_sql
from toolnexus_async import UsageError
from toolnexus_async._loop import RunLoop
from toolnexus_async.durable import SqliteRunStore, _sqlite
from toolnexus_async.durable._batch import apply as real_apply

NOW = 1_900_000_000.0
BOUND = 8  # a bound a test can reach (the store's own is thousands)


async def test_a_burst_commits_in_bounded_batches_in_queue_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes: list[int] = []

    def apply(conn: sqlite3.Connection, batch: list[Any], keep: int) -> list[Any]:
        sizes.append(len(batch))
        return real_apply(conn, batch, keep)

    monkeypatch.setattr(_sqlite, "apply", apply)
    path = tmp_path / "runs.sqlite"
    store = SqliteRunStore(path)
    store._batch_max = BOUND
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
