"""When a SQLite store's file goes away for a while, nothing is lost and nothing runs twice.

Real faults on real files, no stand-in for ``sqlite3``: a tmpfs filled to its last byte (a
full disk), a tmpfs remounted read-only, and a child process holding ``BEGIN EXCLUSIVE``
past the store's timeout. Each raises :class:`StoreUnavailableError` naming the file and
the cause; each write it failed is known not to be committed (it goes through when made
again, where a second ``start`` of one run would be refused); once the fault is gone the
same store object works again, with what it committed before intact.

Mounting needs root and a kernel that lets this process mount. Where a mechanism is
impossible here the test skips, saying why; under CI (``CI`` set) it fails instead: CI
never skips.
"""

from __future__ import annotations

import errno
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
import pytest

from tests.conftest import assert_no_leaks
from tests.test_store import LEASE, NOW, fresh_state
from toolnexus_async import (
    LlmClient,
    Message,
    RunResult,
    SqliteConversationStore,
    StoreError,
    StoreUnavailableError,
    Toolkit,
    ToolResult,
    ToolReturn,
    UserMessage,
    define_tool,
)
from toolnexus_async.durable import DurableHost, MemoryRunStore, SqliteRunStore
from toolnexus_async.testing import reply, tool_call


def impossible_here(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"CI never skips: {reason}", pytrace=False)
    pytest.skip(reason)


def _mount(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True, check=False)


@contextmanager
def tmpfs(size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted on a new directory, unmounted however the test ends."""
    if shutil.which("mount") is None or os.geteuid() != 0:
        impossible_here("mounting a tmpfs needs root and mount(8)")
    root = Path(tempfile.mkdtemp(prefix="toolnexus-tmpfs-"))
    try:
        mounted = _mount("-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(root))
        if mounted.returncode != 0:
            impossible_here(f"this sandbox cannot mount a tmpfs: {mounted.stderr.strip()}")
        try:
            yield root
        finally:
            # Lazily if a file is still open on it (a test that failed half-way): the
            # mount then goes once the file is closed, and is gone from the tree now.
            if subprocess.run(["umount", str(root)], capture_output=True, check=False).returncode:
                subprocess.run(["umount", "-l", str(root)], check=True)
    finally:
        root.rmdir()


def remount(root: Path, mode: str) -> None:
    done = _mount("-o", f"remount,{mode}", str(root))
    assert done.returncode == 0, f"remount,{mode} {root}: {done.stderr.strip()}"


def fill(path: Path, leave: int = 0) -> None:
    """Write ``path`` until its file system has not a byte left; given ``leave``, until it
    has from ``leave`` bytes to ``leave`` and a chunk (64 KiB) left."""
    chunk = b"\0" * 65536
    with path.open("wb", buffering=0) as filler:
        if leave:
            while _free(path) - len(chunk) > leave:
                filler.write(chunk)
            return
        try:
            while True:
                filler.write(chunk)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
        # The last chunk may have gone in part; what is left is less than a chunk.
        try:
            while True:
                filler.write(b"\0")
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc


def _free(path: Path) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def intact(path: Path) -> None:
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]


async def test_a_full_disk_fails_the_writes_it_stops_and_the_store_writes_again():
    with tmpfs("2m") as disk:
        path = disk / "runs.db"
        store = SqliteRunStore(path)
        try:
            for n in range(3):
                await store.start(fresh_state(f"kept-{n}"), "w1", NOW + LEASE)
            big = "x" * 20_000  # a run's state of some size: the disk cannot take many
            # Most of the disk taken first: the runs written before the filler below has
            # filled the rest (a race) then add at most 320 KiB to the write-ahead log
            # (about 70 KiB a run), which is not given back, so freeing the disk leaves
            # room for every refused run. Filled from empty, up to 8 went in before it was
            # full, and the log left too little room for the refused ones (7 in 15 failed).
            fill(disk / "ballast", leave=256 * 1024)
            written: list[str] = []
            refused: dict[str, StoreUnavailableError] = {}

            async def start(run_id: str) -> None:
                try:
                    await store.start(fresh_state(run_id, big), "w1", NOW + LEASE)
                except StoreUnavailableError as exc:
                    refused[run_id] = exc
                else:
                    written.append(run_id)

            filled = anyio.Event()

            async def filler() -> None:
                await anyio.to_thread.run_sync(fill, disk / "filler")
                filled.set()

            # Runs written four at a time (so a batch holds several) while another file
            # fills the disk, until it is full and the disk refuses them.
            async with anyio.create_task_group() as tg:
                tg.start_soon(filler)
                for n in range(200):
                    async with anyio.create_task_group() as batch:
                        for k in range(4):
                            batch.start_soon(start, f"run-{n}-{k}")
                    if refused:
                        # The first batch with a refusal ends the writing, once the disk is
                        # full: batches refused while the filler finished added runs to
                        # write again (up to 44), more than freeing the disk made room for.
                        await filled.wait()
                        break
            assert refused, "the full disk never refused a write"
            for exc in refused.values():
                message = str(exc)
                assert str(path) in message and "disk full" in message, message
                assert "this write was not committed" in message, message

            (disk / "filler").unlink()
            (disk / "ballast").unlink()
            # The same store object, its committer and connection: each refused write goes
            # in now (a second start of a committed run would be refused), once.
            for run_id in refused:
                await store.start(fresh_state(run_id, big), "w1", NOW + LEASE)
            for run_id in [*(f"kept-{n}" for n in range(3)), *written, *refused]:
                assert (await store.load(run_id)).status == "running"
            assert len(await store.runs()) == 3 + len(written) + len(refused)
        finally:
            await store.aclose()
        intact(path)
    assert_no_leaks()


async def test_a_read_only_file_is_unavailable_until_it_is_writable_again():
    with tmpfs("8m") as disk:
        path = disk / "runs.db"
        async with SqliteRunStore(path) as first:
            await first.start(fresh_state("kept"), "w1", NOW + LEASE)
        # Remounted read-only with no file open on it (the kernel refuses while one is
        # open for writing): the store meets a read-only file when it opens it.
        store = SqliteRunStore(path, timeout=1)
        try:
            remount(disk, "ro")
            try:
                with pytest.raises(StoreUnavailableError) as pinged:
                    await store.ping()
                with pytest.raises(StoreUnavailableError) as started:
                    await store.start(fresh_state("late"), "w1", NOW + LEASE)
            finally:
                remount(disk, "rw")
            for caught in (pinged, started):
                assert str(path) in str(caught.value) and "read-only" in str(caught.value)
            assert "no write of this call was committed" in str(started.value)
            await store.start(fresh_state("late"), "w1", NOW + LEASE)
            assert (await store.load("kept")).status == "running"
            assert (await store.load("late")).status == "running"
        finally:
            await store.aclose()
        intact(path)
    assert_no_leaks()


def _leave_wal_behind(path: Path) -> None:
    """Read the file in a process that then dies without closing it: its WAL and shared
    memory files stay, as after a crash, and a reader needs no write to open them."""
    reader = (
        "import os, sqlite3, sys\n"
        "sqlite3.connect(sys.argv[1]).execute('PRAGMA user_version').fetchall()\n"
        "os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", reader, str(path)], check=True, timeout=60)
    assert Path(f"{path}-wal").exists() and Path(f"{path}-shm").exists()


async def test_a_connection_opened_read_only_is_opened_afresh_once_the_file_is_writable():
    """SQLite opens a file it may not write read-only, and it stays so; the store reads
    through it meanwhile, and opens the file again once it may write."""
    with tmpfs("8m") as disk:
        path = disk / "runs.db"
        async with SqliteRunStore(path) as first:
            await first.start(fresh_state("kept"), "w1", NOW + LEASE)
        _leave_wal_behind(path)
        store = SqliteRunStore(path, timeout=1)
        try:
            remount(disk, "ro")
            try:
                await store.ping()  # the WAL is there: reading needs no write
                assert (await store.load("kept")).status == "running"
                with pytest.raises(StoreUnavailableError, match="read-only") as caught:
                    await store.start(fresh_state("late"), "w1", NOW + LEASE)
                await store.ping()
            finally:
                remount(disk, "rw")
            assert "this write was not committed" in str(caught.value)
            await store.start(fresh_state("late"), "w1", NOW + LEASE)  # the first write after
            assert [r.run_id for r in await store.runs()] == ["late", "kept"]
        finally:
            await store.aclose()
        intact(path)
    assert_no_leaks()


# Holds the write lock of the file named by its argument until a line comes on its stdin.
LOCKER = """\
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.readline()
db.execute("COMMIT")
"""


@contextmanager
def _no_hang() -> Iterator[None]:
    with anyio.fail_after(30):  # the guard of a test that would hang; each takes < 3 s
        yield


async def _lock(path: Path) -> anyio.abc.Process:
    """A child process holding ``BEGIN EXCLUSIVE`` on ``path``, once it says so."""
    child = await anyio.open_process([sys.executable, "-c", LOCKER, str(path)])
    assert child.stdout is not None
    said = b""
    while not said.endswith(b"\n"):
        said += await child.stdout.receive()
    assert said == b"locked\n"
    return child


async def _unlock(child: anyio.abc.Process) -> None:
    assert child.stdin is not None
    await child.stdin.send(b"go\n")
    assert await child.wait() == 0
    await child.aclose()


async def test_a_file_locked_by_another_process_past_the_timeout_is_unavailable(tmp_path):
    path = tmp_path / "runs.db"
    timeout = 0.5
    with _no_hang():
        async with SqliteRunStore(path, timeout=timeout) as store:
            await store.start(fresh_state("r1"), "w1", NOW + LEASE)
            child = await _lock(path)
            try:
                began = anyio.current_time()
                with pytest.raises(StoreUnavailableError) as caught:
                    await store.turn(fresh_state("r1"), 1, "w1")
                waited = anyio.current_time() - began
                # In WAL mode a reader needs no lock another writer holds: reads go on.
                await store.ping()
                assert (await store.load("r1")).turn == 0
            except BaseException:
                child.kill()
                await child.aclose()
                raise
            await _unlock(child)
            message = str(caught.value)
            assert str(path) in message and "locked by another process" in message, message
            assert "this write was not committed" in message
            assert timeout * 0.9 <= waited < timeout + 2.5, waited
            await store.turn(fresh_state("r1"), 1, "w1")
            assert (await store.load("r1")).turn == 1
    assert_no_leaks()


async def test_a_write_queued_behind_a_locked_batch_fails_within_its_own_timeout(tmp_path):
    """The file is locked; a write waits in the busy handler; a second write, made half-way
    through (the scenario, not a synchronisation), queues behind that batch. It fails
    within about its own timeout from its start (it took two timeouts before: the first
    batch's, then its own), and is known not to be committed."""
    path = tmp_path / "runs.db"
    timeout = 1.0
    took: list[float] = []
    with _no_hang():
        async with SqliteRunStore(path, timeout=timeout) as store:
            await store.start(fresh_state("r1"), "w1", NOW + LEASE)
            await store.start(fresh_state("r2"), "w1", NOW + LEASE)
            child = await _lock(path)

            async def write(run_id: str) -> None:
                began = anyio.current_time()
                with pytest.raises(StoreUnavailableError):
                    await store.turn(fresh_state(run_id), 1, "w1")
                took.append(anyio.current_time() - began)

            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(write, "r1")
                    await anyio.sleep(timeout / 2)
                    tg.start_soon(write, "r2")
            finally:
                await _unlock(child)
            assert (await store.load("r2")).turn == 0  # not committed
    # Loose: only "about one timeout, not two" is asserted, not a speed.
    assert len(took) == 2 and max(took) < timeout * 1.3, took
    assert_no_leaks()


async def test_the_conversation_store_tells_a_lock_the_same_way(tmp_path):
    path = tmp_path / "conversations.db"
    transcript = [UserMessage("hello")]
    with _no_hang():
        async with SqliteConversationStore(path, timeout=0.5) as store:
            await store.save("kept", transcript)
            child = await _lock(path)
            try:
                with pytest.raises(StoreUnavailableError) as caught:
                    await store.save("late", transcript)
                assert await store.get("kept") == transcript
            except BaseException:
                child.kill()
                await child.aclose()
                raise
            await _unlock(child)
            assert "locked by another process" in str(caught.value)
            assert str(path) in str(caught.value)
            await store.save("late", transcript)
            assert await store.get("late") == transcript
    assert_no_leaks()


async def test_the_conversation_store_tells_a_read_only_file_and_writes_again():
    with tmpfs("8m") as disk:
        path = disk / "conversations.db"
        transcript = [UserMessage("hello")]
        async with SqliteConversationStore(path) as first:
            await first.save("kept", transcript)
        store = SqliteConversationStore(path, timeout=1)
        try:
            remount(disk, "ro")
            try:
                with pytest.raises(StoreUnavailableError, match="read-only"):
                    await store.save("late", transcript)
            finally:
                remount(disk, "rw")
            await store.save("late", transcript)
            assert await store.get("kept") == transcript
        finally:
            await store.aclose()
    assert_no_leaks()


async def test_a_memory_store_keeps_its_database_through_a_fault():
    """Its connection is the database: a write refused for want of room is rolled back,
    and the store goes on with everything it had."""
    async with MemoryRunStore() as store:
        await store.start(fresh_state("kept"), "w1", NOW + LEASE)

        def cap(pages: int) -> Callable[[sqlite3.Connection], object]:
            return lambda conn: conn.execute(f"PRAGMA max_page_count = {pages}")

        # SQLite's own limit on the pages of a database, as a memory that is full.
        pages = await store._run(lambda conn: conn.execute("PRAGMA page_count").fetchone()[0])
        await store._run(cap(pages))
        with pytest.raises(StoreUnavailableError, match="out of memory") as caught:
            await store.start(fresh_state("big", "x" * 100_000), "w1", NOW + LEASE)
        assert "this write was not committed" in str(caught.value)
        await store._run(cap(1_073_741_823))  # SQLite's default
        await store.start(fresh_state("big", "x" * 100_000), "w1", NOW + LEASE)
        assert [r.run_id for r in await store.runs()] == ["big", "kept"]
    assert_no_leaks()


@pytest.mark.parametrize("store_class", [SqliteRunStore, SqliteConversationStore])
async def test_a_damaged_file_is_a_store_error_not_a_passing_fault(tmp_path, store_class):
    path = tmp_path / "damaged.db"
    path.write_bytes(b"definitely not sqlite " * 100)
    store = store_class(path)
    with pytest.raises(StoreError) as caught:
        async with store:
            pass
    await store.aclose()
    assert not isinstance(caught.value, StoreUnavailableError)
    assert "not a SQLite database" in str(caught.value)
    assert_no_leaks()


async def test_a_durable_run_waits_out_a_lock_and_its_tool_runs_once(tmp_path):
    """A DurableHost on a SQLite file: another process locks the file while a tool
    executes, past the store's timeout. The result's write is refused, retried, and goes
    through once the lock is gone; the run ends done, the tool ran once, and nothing was
    recorded as failed."""
    path = tmp_path / "runs.db"
    ran: list[str] = []
    locker: list[anyio.abc.Process] = []

    @define_tool
    async def work() -> ToolResult:
        """Does something that must happen once."""
        ran.append("work")
        locker.append(await _lock(path))  # the file is locked while the tool finishes
        return ToolResult.ok("worked")

    def once(messages: list[Message], tools: list[Any]) -> Any:
        if isinstance(messages[-1], ToolReturn):
            return f"result: {messages[-1].output}"
        return reply(tool_call("work", id="c1"))

    refused: list[str] = []
    retried, finished = anyio.Event(), anyio.Event()
    with _no_hang():
        async with (
            SqliteRunStore(path, timeout=0.2) as store,
            Toolkit.create(builtins=False, extra_tools=[work]) as toolkit,
            LlmClient.in_process(once) as client,
            DurableHost(client, toolkit, store, lease=3, sweep=0.05) as host,
            anyio.create_task_group() as tg,
        ):
            original = store.record

            async def record(*args: Any) -> None:
                try:
                    await original(*args)
                except StoreUnavailableError as exc:
                    refused.append(str(exc))
                    if len(refused) == 2:  # refused, and retried: the run waits
                        retried.set()
                    raise

            store.record = record  # type: ignore[method-assign,assignment]
            results: list[RunResult] = []

            async def run() -> None:
                results.append(await host.run("go"))
                finished.set()

            tg.start_soon(run)
            await retried.wait()
            assert not results
            await _unlock(locker[0])
            await finished.wait()
            (summary,) = await store.runs()
    assert results[0].text == "result: worked" and ran == ["work"]
    assert summary.status == "done"
    assert "locked by another process" in refused[0]
    assert_no_leaks()
