"""Real PostgreSQL for the tests: one throwaway cluster per session, a fresh database per test.

``pg_server`` (session) runs ``initdb`` into a temporary directory and starts the server on
a free port of 127.0.0.1 (and a Unix socket in the same directory), with trust auth for the
``postgres`` role; it is started only when a test asks for it, and stopped and deleted when
the session ends, failed tests or not. ``pg_dsn`` (per test) creates an empty database on
it and yields its DSN, ``postgresql://postgres@127.0.0.1:<port>/<db>``; the database is
dropped afterwards, with any connection the test left open.

``pg_cluster`` (per test) is for the tests that make the database fail: a cluster of the
test's own, which it may stop (``pg_ctl stop -m fast``), kill (``-m immediate``, a crash)
and start again on the same port, so that clients reconnect to the address they had;
``pg_server`` is shared by the whole session and must never be stopped. The cluster is
stopped and deleted after the test, whatever state the test left it in.
:func:`terminate_others` ends every other connection to a database, as an
administrator's ``pg_terminate_backend`` would.

Needs the server binaries (Debian's ``postgresql`` package). Without them a test that asks
for the fixture is skipped, or fails when the ``CI`` environment variable is set (CI
installs them), as the browser test does.
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

MISSING_REASON = (
    "PostgreSQL server binaries not found (initdb/pg_ctl): install Debian's postgresql package"
)
SERVER_TOOLS = ("initdb", "pg_ctl", "postgres")
START_TIMEOUT = 60  # seconds; pg_ctl -w waits at most this long for "ready to accept"
CONNECT_TIMEOUT = 30.0  # seconds, the deadline for reaching the maintenance database
MAINTENANCE_DB = "postgres"
SUPERUSER = "postgres"
# A free port is only free until someone else binds it; a lost race is retried on another.
START_ATTEMPTS = 3


def _has_tools(bindir: Path) -> bool:
    return all(os.access(bindir / tool, os.X_OK) for tool in SERVER_TOOLS)


def find_bindir() -> Path | None:
    """The directory holding initdb, pg_ctl and postgres, or None.

    Debian keeps the server in /usr/lib/postgresql/<version>/bin, off PATH, and its
    pg_config (from libpq-dev alone) may name a bindir with no server in it: every
    candidate is checked for the binaries themselves.
    """
    pg_config = shutil.which("pg_config")
    if pg_config is not None:
        try:
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out = ""
        if out and _has_tools(Path(out)):
            return Path(out)
    versioned = [p for p in Path("/usr/lib/postgresql").glob("*/bin") if _has_tools(p)]
    if versioned:
        # The newest major version, compared as a number ("9.6" < "15").
        return max(versioned, key=lambda p: _version_key(p.parent.name))
    initdb = shutil.which("initdb")
    if initdb is not None:
        # PATH may hold symlinks (/usr/local/bin/initdb -> /usr/lib/postgresql/15/bin);
        # pg_ctl finds postgres next to its own real path, so resolve before checking.
        bindir = Path(initdb).resolve().parent
        if _has_tools(bindir):
            return bindir
    return None


def _version_key(name: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in name.split("."))
    except ValueError:
        return (-1,)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass(frozen=True)
class PgServer:
    """A running throwaway cluster: where to reach it, and its maintenance database."""

    host: str
    port: int
    socket_dir: Path
    bindir: Path
    data_dir: Path
    log_file: Path
    user: str = SUPERUSER

    @property
    def dsn(self) -> str:
        """The maintenance database's DSN (no password: the cluster trusts local users)."""
        return self.dsn_for(MAINTENANCE_DB)

    def dsn_for(self, database: str) -> str:
        return f"postgresql://{self.user}@{self.host}:{self.port}/{database}"


class _Cluster:
    """initdb, start and stop, as the ``postgres`` OS user when the tests run as root."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="toolnexus-pg-"))
        self.data_dir = self.root / "data"
        self.log_file = self.root / "server.log"
        self._run_as: dict[str, Any] = {}
        if os.geteuid() == 0:
            # The server refuses to run as root. subprocess switches user itself, so this
            # needs neither runuser nor setpriv nor su, whichever the image happens to have.
            try:
                account = pwd.getpwnam(SUPERUSER)
            except KeyError:
                self.remove()
                raise RuntimeError(
                    "the tests run as root and PostgreSQL refuses to; there is no "
                    f"{SUPERUSER!r} OS user to run it as (Debian's postgresql package adds it)"
                ) from None
            self._run_as = {
                "user": account.pw_uid,
                "group": account.pw_gid,
                "extra_groups": [],
            }
            os.chown(self.root, account.pw_uid, account.pw_gid)
        # Inherited PG* variables (PGDATA, PGPORT, PGOPTIONS...) would steer the tools
        # elsewhere; cwd is the temp dir because the postgres user may not enter ours.
        self._env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        self._env["LC_ALL"] = "C"  # English messages in the log tail of an error

    def _run(self, args: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bindir / args[0]), *args[1:]],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.root,
            env=self._env,
            check=False,
            **self._run_as,
        )

    def initdb(self) -> None:
        args = [
            "initdb",
            "-D",
            str(self.data_dir),
            "-A",
            "trust",
            "-U",
            SUPERUSER,
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",  # a throwaway cluster need not survive a power cut
        ]
        done = self._run(args, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed ({done.returncode}):\n{done.stdout}{done.stderr}")

    def start(self, *, fsync: bool = False, port: int | None = None) -> PgServer:
        """Start the server; ``fsync=True`` keeps PostgreSQL's real durability (the
        benchmarks' committed figures), the default trades it for speed. ``port`` starts it
        on that port (a restart, where clients must find it where it was), else on a free
        one."""
        failure = ""
        fixed = port
        for _ in range(START_ATTEMPTS):
            log_start = self._log_size()
            if port is None:
                port = _free_port()
            options = " ".join(
                [
                    f"-p {port}",
                    f"-k {shlex.quote(str(self.root))}",
                    "-c listen_addresses=127.0.0.1",
                    # off for speed: a crash loses nothing worth keeping
                    f"-c fsync={'on' if fsync else 'off'}",
                    "-c max_connections=200",  # pool tests open many; the default is 100
                ]
            )
            args = [
                "pg_ctl",
                "start",
                "-w",
                "-t",
                str(START_TIMEOUT),
                "-D",
                str(self.data_dir),
                "-l",
                str(self.log_file),
                "-o",
                options,
            ]
            try:
                done = self._run(args, timeout=START_TIMEOUT + 30)
            except subprocess.TimeoutExpired:
                done = None
            if done is not None and done.returncode == 0:
                return PgServer(
                    host="127.0.0.1",
                    port=port,
                    socket_dir=self.root,
                    bindir=self.bindir,
                    data_dir=self.data_dir,
                    log_file=self.log_file,
                )
            output = "pg_ctl timed out" if done is None else f"{done.stdout}{done.stderr}"
            failure = f"pg_ctl start failed on port {port}:\n{output}\n{self.log_tail()}"
            self.stop()  # a server that came up too late must not outlive the attempt
            if "Address already in use" not in self._log_since(log_start):
                break
            if fixed is None:
                port = None  # another free one; a fixed port is tried again as it is
        raise RuntimeError(failure)

    def _log_size(self) -> int:
        try:
            return self.log_file.stat().st_size
        except FileNotFoundError:
            return 0

    def _log_since(self, offset: int) -> str:
        try:
            with self.log_file.open("rb") as log:
                log.seek(offset)
                return log.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError as exc:
            return f"(no server log: {exc})"
        return "server log tail:\n" + "\n".join(text.splitlines()[-lines:])

    def running(self) -> bool:
        if not (self.data_dir / "postmaster.pid").exists():
            return False
        # pg_ctl status exits 3 when no server runs, 4 when the data dir is unusable.
        return self._run(["pg_ctl", "status", "-D", str(self.data_dir)], timeout=30).returncode == 0

    def stop(self) -> None:
        if not self.running():
            return
        self._run(["pg_ctl", "stop", "-D", str(self.data_dir), "-m", "fast", "-w"], timeout=60)
        if not self.running():
            return
        self._run(["pg_ctl", "stop", "-D", str(self.data_dir), "-m", "immediate", "-w"], 60)
        if self.running():
            # Last resort: backends exit by themselves once their postmaster is gone.
            pid = int((self.data_dir / "postmaster.pid").read_text().split()[0])
            os.kill(pid, signal.SIGKILL)

    def crash(self) -> None:
        """``pg_ctl stop -m immediate``: every backend is killed at once, nothing is shut
        down cleanly, and the next start recovers from the WAL, as after a crash."""
        self.stop_as("immediate")

    def stop_as(self, mode: str) -> None:
        """``pg_ctl stop -m <mode>`` (``smart``, ``fast`` or ``immediate``), waited for."""
        if mode not in ("smart", "fast", "immediate"):
            raise ValueError(f"no such pg_ctl stop mode: {mode!r}")
        done = self._run(["pg_ctl", "stop", "-D", str(self.data_dir), "-m", mode, "-w"], 60)
        if done.returncode != 0:
            raise RuntimeError(f"pg_ctl stop -m {mode} failed:\n{done.stdout}{done.stderr}")

    def remove(self) -> None:
        shutil.rmtree(self.root)


def require_server_binaries() -> Path:
    """The server binaries' directory; the calling test is skipped without them, or failed
    when ``CI`` is set (CI never skips)."""
    bindir = find_bindir()
    if bindir is None:
        if os.environ.get("CI"):
            pytest.fail(MISSING_REASON, pytrace=False)
        pytest.skip(MISSING_REASON)
    return bindir


def _new_cluster(what: str) -> _Cluster:
    """A cluster's directory and tools, not started (see :func:`require_server_binaries`)."""
    bindir = require_server_binaries()
    try:
        return _Cluster(bindir)
    except (RuntimeError, OSError) as exc:
        pytest.fail(f"{what} was not set up: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """A throwaway PostgreSQL cluster for the session; see the module docstring."""
    cluster = _new_cluster("the throwaway PostgreSQL cluster")
    try:
        server = _started(cluster)
        yield server
    finally:
        try:
            cluster.stop()
        finally:
            cluster.remove()


def _started(cluster: _Cluster) -> PgServer:
    try:
        cluster.initdb()
        return cluster.start()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        failure = f"the throwaway PostgreSQL cluster did not start: {exc}"
    # Failed outside the except block: the message is shown once, not once per context.
    pytest.fail(failure, pytrace=False)


class PgCluster:
    """A test's own cluster (``pg_cluster``), which the test may crash and start again.

    ``server`` is where it listens; :meth:`start` after :meth:`crash` brings it back on the
    same port, so every DSN made from ``server`` stays valid.
    """

    def __init__(self, cluster: _Cluster, server: PgServer) -> None:
        self._cluster = cluster
        self.server = server

    def crash(self) -> None:
        """Kill the server as a crash would (``pg_ctl stop -m immediate``)."""
        self._cluster.crash()

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m <mode>``: ``fast`` rolls back every open transaction and ends
        every session cleanly (a restart's first half), ``immediate`` is :meth:`crash`."""
        self._cluster.stop_as(mode)

    def start(self) -> None:
        """Start the server again on its port; returns once it accepts connections."""
        self._cluster.start(port=self.server.port)

    def running(self) -> bool:
        return self._cluster.running()

    def log_tail(self, lines: int = 30) -> str:
        return self._cluster.log_tail(lines)


@pytest.fixture
def pg_cluster() -> Iterator[PgCluster]:
    """A throwaway cluster of the test's own; see the module docstring."""
    cluster = _new_cluster("the test's PostgreSQL cluster")
    try:
        yield PgCluster(cluster, _started(cluster))
    finally:
        try:
            cluster.stop()
        finally:
            cluster.remove()


async def terminate_others(dsn: str) -> int:
    """End every other connection to the database of ``dsn`` (``pg_terminate_backend``);
    returns how many were ended. Its own connection is closed before it returns."""
    conn = await _connect(dsn)
    try:
        # The others are chosen first (OFFSET 0 keeps the subquery apart): in one WHERE
        # clause the planner may call pg_terminate_backend before it checks the pid, and
        # end this connection too.
        ended = await conn.fetch(
            "SELECT pg_terminate_backend(pid) FROM (SELECT pid FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid() OFFSET 0) AS o"
        )
        return sum(1 for row in ended if row[0])
    finally:
        await conn.close()


async def _connect(dsn: str) -> Any:
    """An asyncpg connection, retried until a deadline while the server is not ready yet.

    pg_ctl -w returns once the server accepts connections, so a retry is rare; it covers a
    server that is still busy with recovery or a connection slot not yet freed.
    """
    # Imported here, not at the top: conftest loads this module for every test run, and a
    # run without asyncpg installed should lose only the tests that use a database.
    import asyncpg

    deadline = time.monotonic() + CONNECT_TIMEOUT
    while True:
        remaining = deadline - time.monotonic()
        try:
            return await asyncpg.connect(dsn, timeout=max(remaining, 1.0))
        except (OSError, asyncpg.CannotConnectNowError, asyncpg.TooManyConnectionsError):
            if time.monotonic() >= deadline:
                raise
        # A pause between attempts keeps the retry from spinning; the deadline bounds it.
        await anyio.sleep(0.05)


async def next_xid(dsn: str) -> int:
    """The transaction id the cluster will assign next (reading it assigns none): the ids
    assigned between two readings count the transactions that wrote a row or notified."""
    conn = await _connect(dsn)
    try:
        return int(await conn.fetchval("SELECT pg_snapshot_xmax(pg_current_snapshot())::text"))
    finally:
        await conn.close()


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@pytest.fixture
async def pg_dsn(pg_server: PgServer) -> AsyncIterator[str]:
    """The DSN of a new, empty database on ``pg_server``, dropped after the test."""
    name = f"test_{uuid.uuid4().hex[:16]}"
    admin = await _connect(pg_server.dsn)
    try:
        # template0 because nothing ever connects to it: CREATE DATABASE from a template
        # that has a connection fails, and template1 is anyone's to connect to.
        await admin.execute(f"CREATE DATABASE {_quote_ident(name)} TEMPLATE template0")
    finally:
        await admin.close()
    try:
        yield pg_server.dsn_for(name)
    finally:
        admin = await _connect(pg_server.dsn)
        try:
            # FORCE: a pool or connection the test left open must not keep the database.
            await admin.execute(f"DROP DATABASE IF EXISTS {_quote_ident(name)} WITH (FORCE)")
        finally:
            await admin.close()
