"""When a SQLite store's file goes away under ``serve``, nothing is lost and nothing runs
twice (issue 32, end to end).

Rules of this module:

- The promise and the harness are those of :mod:`tests.test_pg_faults` (its
  :func:`~tests.test_pg_faults.drive` and :func:`~tests.test_pg_faults.judge`): the same
  load (runs parked, answers on their way, payments executing, runs being started as the
  fault begins), the same figures, the same assertions. A run that got a 202 ends paid, an
  answer that got a 200 is applied, each call executes once (one ledger line per
  idempotency key), the worker serves again by itself, no client call waits past the store
  timeout plus :data:`~tests.test_pg_faults.MARGIN`, and the only 5xx is 503.
- One worker, :mod:`tests.fault_worker` ``--sqlite PATH`` in a child process: a SQLite
  file is one process's store, opened as ``serve --store PATH`` opens it
  (``SqliteRunStore(path, timeout=store_timeout)``).
- The faults are real, made as :mod:`tests.test_sqlite_faults` makes them: the file on a
  small tmpfs that another file fills to its last byte, and freed again; another process
  holding ``BEGIN EXCLUSIVE`` on the file past the store timeout. While each lasts the
  worker is asked ``POST /runs`` over and over: the fault must be felt (a probe told
  other than 202), or the test proved nothing.
- The store is read by the test on a connection of its own, only to look: SQLite lets a
  reader in beside a writer's lock (WAL), and a reader needs no room on the disk.
- Mounting needs root and a kernel that lets this process mount; where it cannot, the
  test skips saying why, and fails under CI (``CI`` set), as CI never skips. Mounts, child
  processes and files go however a test ends: the worker is killed and waited for before
  the tmpfs is unmounted, a locking process is killed if it was not let go.
- ``TOOLNEXUS_FAULTS_REPORT=<file>``: the figures are appended to the file and nothing is
  asserted of them, as in :mod:`tests.test_pg_faults`.
"""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, closing
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from tests.test_pg_faults import (
    LEASE,
    LIMIT,
    LOCK_HOLD,
    STORE_TIMEOUT,
    WORK,
    Load,
    drive,
    final_text,
    judge,
    probe_starts,
)
from tests.test_serve_crash import TOKEN, Server, server
from tests.test_sqlite_faults import LOCKER, fill, tmpfs

# The disk: room for the store's file and its WAL under this load with some to spare, so
# that the load before the fault runs as it would, and little enough to fill at once.
DISK = "16m"
FULL_FOR = 5.0  # seconds the disk stays full: longer than the worker's lease (LEASE)


class SqliteStore:
    """:class:`~tests.test_pg_faults.StoreView` of the SQLite file at ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    async def _rows(self, query: str) -> list[tuple[Any, ...]] | None:
        def read() -> list[tuple[Any, ...]]:
            # Only reads: WAL lets them in beside a writer's lock, and they need no room.
            with closing(sqlite3.connect(self.path, timeout=STORE_TIMEOUT)) as db:
                return [tuple(row) for row in db.execute(query).fetchall()]

        try:
            return await anyio.to_thread.run_sync(read)
        except sqlite3.Error:
            return None

    async def ended(self, run_ids: list[str]) -> dict[str, tuple[str, str]] | None:
        rows = await self._rows(
            "SELECT run_id, status, final FROM runs WHERE status IN ('done', 'failed')"
        )
        if rows is None:
            return None
        wanted = set(run_ids)
        return {row[0]: (row[1], final_text(row[2])) for row in rows if row[0] in wanted}

    async def runs(self) -> list[tuple[Any, ...]] | None:
        return await self._rows("SELECT run_id, status, owner, error, prompt FROM runs")

    async def asked(self) -> list[tuple[str, int]] | None:
        rows = await self._rows("SELECT run_id, count(*) FROM requests GROUP BY run_id")
        return None if rows is None else [(row[0], row[1]) for row in rows]


@asynccontextmanager
async def one_worker(path: Path, tmp_path: Path, ledger: Path) -> AsyncIterator[list[Server]]:
    command = [sys.executable, "-m", "tests.fault_worker", "--sqlite", str(path)]
    command += ["--token", TOKEN, "--lease", str(LEASE), "--ledger", str(ledger)]
    command += ["--store-timeout", str(STORE_TIMEOUT), "--work", str(WORK)]
    async with server(command, tmp_path / "worker.log") as worker:
        yield [worker]


def sizes(disk: Path) -> dict[str, int]:
    """The bytes of each file on ``disk``: how far the store had grown."""
    return {file.name: file.stat().st_size for file in sorted(disk.iterdir())}


def disk_full(disk: Path) -> Callable[[Load], Awaitable[dict[str, Any]]]:
    """The fault: ``disk`` filled to its last byte by another file, for :data:`FULL_FOR`
    seconds of probes, then that file removed."""

    async def fault(load: Load) -> dict[str, Any]:
        before = sizes(disk)
        filler = disk / "filler"
        try:
            await anyio.to_thread.run_sync(fill, filler)
            probes = await probe_starts(load, FULL_FOR)
        finally:
            filler.unlink(missing_ok=True)
        return {"files when filled": before, "probes while full": probes}

    return fault


@asynccontextmanager
async def exclusive(path: Path) -> AsyncIterator[None]:
    """Another process holds ``BEGIN EXCLUSIVE`` on ``path`` for the body; it commits and
    ends after, or is killed if the body failed."""
    async with await anyio.open_process([sys.executable, "-c", LOCKER, str(path)]) as child:
        try:
            assert child.stdout is not None and child.stdin is not None
            said = b""
            while not said.endswith(b"\n"):
                said += await child.stdout.receive()
            assert said == b"locked\n", said
            yield
            await child.stdin.send(b"go\n")
            assert await child.wait() == 0
        finally:
            if child.returncode is None:
                child.kill()
            with anyio.CancelScope(shield=True):
                await child.wait()


def locked(path: Path) -> Callable[[Load], Awaitable[dict[str, Any]]]:
    """The fault: the file locked by another process for :data:`LOCK_HOLD` seconds of
    probes (three store timeouts)."""

    async def fault(load: Load) -> dict[str, Any]:
        async with exclusive(path):
            probes = await probe_starts(load, LOCK_HOLD)
        return {"probes while locked": probes}

    return fault


def felt(probes: dict[str, int]) -> bool:
    """Whether some probe was told other than 202: the fault reached the store."""
    return any(answer != "202" for answer in probes)


async def test_the_disk_fills_up_and_is_freed(tmp_path: Path) -> None:
    """The store's file on a tmpfs that another file fills; freed after
    :data:`FULL_FOR` seconds."""
    ledger = tmp_path / "ledger.txt"
    with tmpfs(DISK) as disk:
        path = disk / "runs.db"
        with anyio.fail_after(LIMIT):
            figures = await drive(
                one_worker(path, tmp_path, ledger),
                SqliteStore(path),
                ledger,
                f"disk full {FULL_FOR:g}s",
                disk_full(disk),
            )
    assert felt(figures["probes while full"]), f"the full disk refused nothing: {figures}"
    judge(figures)


async def test_the_file_locked_past_the_store_timeout(tmp_path: Path) -> None:
    """Another process holds ``BEGIN EXCLUSIVE`` for three store timeouts: meanwhile the
    worker answers 503 in time; then it recovers."""
    ledger = tmp_path / "ledger.txt"
    path = tmp_path / "runs.db"
    with anyio.fail_after(LIMIT):
        figures = await drive(
            one_worker(path, tmp_path, ledger), SqliteStore(path), ledger, "lock", locked(path)
        )
    assert felt(figures["probes while locked"]), f"the lock refused nothing: {figures}"
    judge(figures)
