"""A throwaway PostgreSQL cluster for the benchmarks: the tests' own (``tests/pg.py``).

Not a benchmark itself. ``park.py --store postgres`` and ``workers.py`` start one with
:func:`throwaway_cluster`: ``initdb`` into a temporary directory, the server on a free port
of 127.0.0.1 (as the ``postgres`` OS user when run as root), stopped and deleted when the
``with`` ends, whatever ended it (an error, Ctrl-C, or SIGTERM, which is turned into
``SystemExit`` meanwhile). Unlike the tests' cluster, ``fsync`` is on unless asked
otherwise, so that a committed figure means committed to disk.

The repository's root is put on ``sys.path`` so that ``tests.pg`` imports (the benchmarks
are run as scripts, which puts only their own directory there); it needs pytest, which the
``dev`` extra (and so ``nox -s bench``) installs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import signal
import sys
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.pg import PgServer, _Cluster, _connect, _quote_ident, find_bindir, next_xid  # noqa: E402

__all__ = (
    "PgServer",
    "ServerCpu",
    "committed",
    "create_database",
    "describe",
    "next_xid",
    "run_blocking",
    "throwaway_cluster",
)

T = TypeVar("T")


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


@contextmanager
def throwaway_cluster(*, fsync: bool = True) -> Iterator[PgServer]:
    """A new cluster, started; stopped and removed at the end of the ``with``."""
    bindir = find_bindir()
    if bindir is None:
        raise SystemExit(
            "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found: install "
            "Debian's postgresql package (they live in /usr/lib/postgresql/<version>/bin)"
        )
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    cluster = _Cluster(bindir)
    try:
        cluster.initdb()
        yield cluster.start(fsync=fsync)
    finally:
        # A second Ctrl-C must not leave the server running or its directory behind.
        interrupt = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            cluster.stop()
        finally:
            cluster.remove()
            signal.signal(signal.SIGINT, interrupt)
            signal.signal(signal.SIGTERM, previous)


def run_blocking(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to its end on an event loop of its own, in a thread of its own: from
    sync code, or from inside a running loop (the benchmarks' untimed checks)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


async def create_database(server: PgServer, name: str) -> str:
    """A new empty database on ``server``; its DSN."""
    admin = await _connect(server.dsn)
    try:
        await admin.execute(f"CREATE DATABASE {_quote_ident(name)} TEMPLATE template0")
    finally:
        await admin.close()
    return server.dsn_for(name)


async def describe(dsn: str) -> str:
    """The server's version and the settings a commit's cost depends on."""
    conn = await _connect(dsn)
    try:
        shown = {
            name: await conn.fetchval(f"SHOW {name}")
            for name in (
                "server_version",
                "fsync",
                "synchronous_commit",
                "wal_sync_method",
                "shared_buffers",
            )
        }
    finally:
        await conn.close()
    version = shown.pop("server_version")
    return f"PostgreSQL {version} (" + ", ".join(f"{k}={v}" for k, v in shown.items()) + ")"


async def committed(dsn: str, schema: str = "toolnexus") -> dict[str, dict[str, int]]:
    """Requests and runs by status, as a connection of its own sees them: what was
    committed. (The table layout is internal; the benchmarks read it only to check.)"""
    conn = await _connect(dsn)
    try:
        found: dict[str, dict[str, int]] = {}
        for table in ("requests", "runs"):
            rows = await conn.fetch(f"SELECT status, count(*) FROM {schema}.{table} GROUP BY 1")
            found[table] = {row[0]: row[1] for row in rows}
        return found
    finally:
        await conn.close()


class ServerCpu:
    """CPU seconds the database server used: the postmaster and every backend, the live
    ones from ``/proc/<pid>/stat``, the ended ones as the postmaster's reaped children."""

    def __init__(self, server: PgServer) -> None:
        pid_file = server.data_dir / "postmaster.pid"
        self.pid = int(pid_file.read_text().split()[0])
        self._tick = os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _fields(pid: int | str) -> list[str] | None:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                text = stat.read()
        except OSError:  # gone meanwhile
            return None
        # The command name is in parentheses and may hold spaces: split after it.
        return text[text.rindex(")") + 2 :].split()

    def seconds(self) -> float:
        ticks = 0
        own = self._fields(self.pid)
        if own is not None:  # utime stime cutime cstime are fields 14-17 (11-14 here)
            ticks += sum(int(x) for x in own[11:15])
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            fields = self._fields(entry)
            if fields is not None and int(fields[1]) == self.pid:
                ticks += int(fields[11]) + int(fields[12])
        return ticks / self._tick
