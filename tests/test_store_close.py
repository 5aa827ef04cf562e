"""SqliteRunStore.aclose() racing the store's first use: the connection opened meanwhile is
closed too, not left open (Python 3.13 reports such a connection when it is collected), and
the writes queued before aclose() are committed before it closes.

The store's worker thread is held inside ``_connect`` by a subclass of its connection
(``RunFile``), so that ``aclose()`` runs while the connection is being opened;
``wait_all_tasks_blocked`` tells when ``aclose()`` has gone as far as it can before the
thread goes on.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path
from typing import Any, cast

import anyio
import pytest

from toolnexus_async import RunResult, UsageError
from toolnexus_async._core.loop import RunLoop
from toolnexus_async.durable import RunSummary, SqliteRunStore
from toolnexus_async.durable.sqlite._file import RunFile


class HeldFile(RunFile):
    """A store's connection whose first open waits, in its worker thread, until told to."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.opening = threading.Event()
        self.go_on = threading.Event()

    def _connect(self) -> sqlite3.Connection:
        self.opening.set()
        self.go_on.wait(30)
        return super()._connect()


class HeldOpen(SqliteRunStore):
    """A SQLite store whose first open waits until told to go on."""

    _file_class = HeldFile

    @property
    def opening(self) -> threading.Event:
        return cast(HeldFile, self._file).opening

    @property
    def go_on(self) -> threading.Event:
        return cast(HeldFile, self._file).go_on


def open_files(path: Path) -> list[str]:
    """The descriptors of this process open on ``path`` (the database file itself)."""
    fds = Path("/proc/self/fd")
    found = []
    for fd in fds.iterdir():
        try:
            if os.readlink(fd) == str(path):
                found.append(fd.name)
        except OSError:
            continue  # closed meanwhile (the iteration's own descriptor, say)
    return found


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd")
async def test_aclose_during_the_first_open_closes_the_connection(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    store = HeldOpen(path)
    listed: list[list[RunSummary]] = []

    async def first_use() -> None:
        listed.append(await store.runs())

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(first_use)
            await anyio.to_thread.run_sync(store.opening.wait)  # the thread is in _connect
            tg.start_soon(store.aclose)
            await anyio.wait_all_tasks_blocked()  # aclose() went as far as it goes meanwhile
            store.go_on.set()
    assert listed == [[]]  # the read that came first was served
    assert open_files(path) == []  # and the connection it opened is closed
    with pytest.raises(UsageError, match="closed"):
        await store.runs()


def fresh_state(run_id: str) -> RunResult:
    return RunLoop("go", run_id=run_id, style="in-process").snapshot()


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd")
async def test_aclose_commits_the_writes_queued_before_it_and_refuses_later_ones(
    tmp_path: Path,
) -> None:
    """The first write holds the worker thread (opening the file); a second one waits in
    the queue behind it when ``aclose()`` is called. Both are committed; what comes after
    ``aclose()`` is refused."""
    path = tmp_path / "runs.db"
    store = HeldOpen(path)
    started: list[str] = []

    async def start(run_id: str) -> None:
        await store.start(fresh_state(run_id), "A", 2_000_000_000.0)
        started.append(run_id)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(start, "run_first")
            await anyio.to_thread.run_sync(store.opening.wait)  # the committer is in _connect
            tg.start_soon(start, "run_queued")
            await anyio.wait_all_tasks_blocked()  # queued behind the first
            tg.start_soon(store.aclose)
            await anyio.wait_all_tasks_blocked()  # aclose() waits for the queue
            with pytest.raises(UsageError, match="closed"):
                await store.start(fresh_state("run_late"), "A", 2_000_000_000.0)
            store.go_on.set()
    assert sorted(started) == ["run_first", "run_queued"]
    with pytest.raises(UsageError, match="closed"):
        await store.runs()
    async with SqliteRunStore(path) as again:
        assert sorted(r.run_id for r in await again.runs()) == ["run_first", "run_queued"]
    assert open_files(path) == []
