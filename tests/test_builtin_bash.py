"""The bash built-in: output, exit codes, workdir confinement, caps, and no process left behind.

"Left behind" is checked by scanning /proc for live (non-zombie) members of the command's
process group, and for the processes it started that left the group (``setsid``, a
double fork), whose pids the command reports through a FIFO. ``os.killpg(pgid, 0)`` is not
enough on its own: an orphan that init has not reaped yet is a zombie, dead but still a
member (in some containers init never reaps).

These tests are about what bash does once it may run, so the tool allows every call; the
approval is tested in test_builtin_approval.py.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from tests.conftest import assert_no_leaks
from toolnexus_async import ToolResult
from toolnexus_async.tools.builtin._workspace import Workspace
from toolnexus_async.tools.builtin.bash import MAX_OUTPUT, BashTool

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")


def live_members(pgid: int) -> list[int]:
    """Pids of the processes of group ``pgid`` that are still running."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            found.append(int(entry))
    return found


def running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "ws" / "sub").mkdir(parents=True)
    return tmp_path / "ws"


@pytest.fixture
def tool(root: Path) -> BashTool:
    return BashTool(Workspace(root, confine=True), approve="allow-all")


async def test_stdout_and_stderr_are_combined_in_order(tool: BashTool) -> None:
    """Both streams arrive as one text, in the order they were written."""
    result = await tool.execute({"command": "echo out; echo err >&2; echo out2"})
    assert not result.is_error
    assert result.output == "out\nerr\nout2\n"
    assert result.metadata == {"exit_code": 0, "truncated": False}


async def test_a_silent_success_says_so(tool: BashTool) -> None:
    """No output is reported explicitly rather than as an empty string."""
    result = await tool.execute({"command": "true", "description": "does nothing"})
    assert not result.is_error and result.output == "(no output)"


async def test_nonzero_exit_is_an_error_with_the_code(tool: BashTool) -> None:
    """A failing command is an error result carrying its exit code and its output."""
    result = await tool.execute({"command": "echo oops; exit 3"})
    assert result.is_error
    assert "exit code 3" in result.output and "oops" in result.output
    assert result.metadata is not None and result.metadata["exit_code"] == 3


async def test_death_by_signal_is_named(tool: BashTool) -> None:
    """A shell killed by a signal is reported by the signal's name."""
    result = await tool.execute({"command": "kill -TERM $$"})
    assert result.is_error and "killed by SIGTERM" in result.output


async def test_stdin_is_empty(tool: BashTool) -> None:
    """Commands read /dev/null, so one waiting for input cannot hang the call."""
    result = await tool.execute({"command": "readlink /proc/$$/fd/0; cat", "timeout": 5000})
    assert result.output == "/dev/null\n"


async def test_undecodable_output_is_replaced_not_fatal(tool: BashTool) -> None:
    """Bytes that are not UTF-8 become U+FFFD instead of failing the call."""
    result = await tool.execute({"command": r"printf 'a\377b'"})
    assert result.output == "a\ufffdb"


async def test_workdir_defaults_to_the_root_and_may_be_a_subfolder(
    root: Path, tool: BashTool
) -> None:
    """The command runs in the workspace root, or in 'workdir' below it."""
    assert (await tool.execute({"command": "pwd"})).output == f"{root}\n"
    assert (await tool.execute({"command": "pwd", "workdir": "sub"})).output == f"{root}/sub\n"


async def test_workdir_escapes_are_refused_before_running(root: Path, tool: BashTool) -> None:
    """A workdir out of the root ('..', absolute, symlink) is refused; the command never runs."""
    (root / "door").symlink_to(root.parent, target_is_directory=True)
    for workdir in ("..", "/", str(root.parent), "door"):
        result = await tool.execute({"command": "touch ran", "workdir": workdir})
        assert result.is_error, workdir
        assert "workspace root" in result.output
    assert not (root.parent / "ran").exists()
    assert "ran" not in os.listdir("/")


async def test_workdir_must_be_an_existing_directory(root: Path, tool: BashTool) -> None:
    """A missing folder or a file as workdir is an error result."""
    (root / "f.txt").write_text("")
    missing = await tool.execute({"command": "true", "workdir": "nope"})
    assert missing.is_error and "does not exist" in missing.output
    a_file = await tool.execute({"command": "true", "workdir": "f.txt"})
    assert a_file.is_error and "not a directory" in a_file.output


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({}, "'command' is required"),
        ({"command": ["ls"]}, "'command' must be a string"),
        ({"command": ""}, "'command' must not be empty"),
        ({"command": "true", "timeout": 0}, "'timeout' must be more than 0"),
        ({"command": "true", "timeout": "1000"}, "'timeout' must be a number"),
        ({"command": "true", "timeout": True}, "'timeout' must be a number"),
        ({"command": "true", "workdir": 5}, "'workdir' must be a string"),
        ({"command": "true", "description": 5}, "'description' must be a string"),
        ({"command": "echo a\0b"}, "could not start"),
    ],
)
async def test_argument_errors(tool: BashTool, args: dict[str, object], expected: str) -> None:
    """Bad arguments are error results naming the field, never exceptions."""
    result = await tool.execute(args)
    assert result.is_error
    assert expected in result.output


async def test_output_is_capped_keeping_head_and_tail(root: Path) -> None:
    """Long output keeps its beginning and end, and says how much was cut."""
    small = BashTool(Workspace(root), max_output=1000, approve="allow-all")
    result = await small.execute({"command": "seq 1 100000"})
    assert not result.is_error
    assert len(result.output) < 1300
    assert result.output.startswith("1\n2\n3\n")
    assert result.output.endswith("99999\n100000\n")
    assert "output truncated" in result.output
    assert result.metadata is not None and result.metadata["truncated"] is True
    big = await BashTool(Workspace(root), approve="allow-all").execute(
        {"command": "head -c 200000 /dev/zero | tr '\\0' a"}
    )
    assert MAX_OUTPUT < len(big.output) < MAX_OUTPUT + 200


async def test_timeout_kills_the_whole_process_group(tool: BashTool) -> None:
    """On timeout the shell and its background child are all dead when execute returns."""
    started = time.monotonic()
    result = await tool.execute(
        {"command": "echo $$; sleep 30 & echo $!; sleep 30", "timeout": 200}
    )
    elapsed = time.monotonic() - started
    assert result.is_error
    assert "timed out after 200 ms" in result.output
    assert result.metadata is not None and result.metadata["timed_out"] is True
    pgid, background = map(int, result.output.splitlines()[1:3])
    assert live_members(pgid) == []
    assert not running(background)
    assert elapsed < 5
    assert_no_leaks()


async def test_cancellation_kills_the_whole_process_group(tool: BashTool, tmp_path: Path) -> None:
    """Cancelling the awaiting task kills the group too, and the cancellation propagates."""
    fifo = tmp_path / "started"
    os.mkfifo(fifo)
    command = f"sleep 30 & echo $$ $! > {shlex.quote(str(fifo))}; sleep 30"
    returned = []

    async def call() -> None:
        returned.append(await tool.execute({"command": command}))

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        with anyio.fail_after(10):
            # Opening a fifo blocks until the command opens it to write: proof it is running.
            ids = await anyio.to_thread.run_sync(fifo.read_text, abandon_on_cancel=True)
        pgid, background = map(int, ids.split())
        assert live_members(pgid) != []
        tg.cancel_scope.cancel()
    assert returned == []
    assert live_members(pgid) == []
    assert not running(background)
    assert_no_leaks()


async def test_background_children_holding_the_output_are_killed(tool: BashTool) -> None:
    """'cmd &' does not stall the call until its timeout; the stray child is killed."""
    started = time.monotonic()
    result = await tool.execute({"command": "echo $$; sleep 30 &", "timeout": 20_000})
    assert time.monotonic() - started < 5
    assert not result.is_error
    assert result.metadata is not None and result.metadata["killed_background"] is True
    assert "background processes" in result.output
    assert live_members(int(result.output.splitlines()[0])) == []


async def test_background_children_with_redirected_output_survive(tool: BashTool) -> None:
    """A daemon started with its output redirected is left running, as in a terminal."""
    result = await tool.execute({"command": "sleep 30 >/dev/null 2>&1 & echo $!"})
    pid = int(result.output)
    try:
        assert not result.is_error
        assert result.metadata is not None and "killed_background" not in result.metadata
        assert running(pid)
    finally:
        os.kill(pid, signal.SIGKILL)


class Reports:
    """A FIFO that processes of a command write their pid to, read without blocking a thread.

    The read end is opened first and non-blocking, so a writer never waits for it and a test
    that gives up leaves no thread stuck in open().
    """

    def __init__(self, path: Path) -> None:
        os.mkfifo(path)
        self.path = shlex.quote(str(path))
        self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self._buffer = b""
        self.pids: list[int] = []

    async def read(self, count: int) -> list[int]:
        """Wait (at most 10 s) until ``count`` pids were reported; all reported so far."""
        loop = asyncio.get_running_loop()
        with anyio.fail_after(10):
            while len(self.pids) < count:
                ready = anyio.Event()
                loop.add_reader(self._fd, ready.set)
                try:
                    await ready.wait()
                finally:
                    loop.remove_reader(self._fd)
                try:
                    self._buffer += os.read(self._fd, 4096)
                except BlockingIOError:
                    continue  # woken by a writer opening the FIFO, before it wrote
                *lines, self._buffer = self._buffer.split(b"\n")
                self.pids += [int(line) for line in lines if line]
        return self.pids

    def close(self) -> None:
        os.close(self._fd)
        for pid in self.pids:  # only if a test failed: never leave a sleeper behind
            if running(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def reports(tmp_path: Path) -> Iterator[Reports]:
    channel = Reports(tmp_path / "pids")
    try:
        yield channel
    finally:
        channel.close()


def escapee(reports: Reports, redirect: str = "") -> str:
    """A command that starts a process in a session of its own, which reports its pid."""
    return f"setsid sh -c 'echo $$ > {reports.path}; exec sleep 600' {redirect}"


def escapees(reports: Reports) -> str:
    """A setsid child holding the output, and a double-forked daemon that does not."""
    daemon = escapee(reports, ">/dev/null 2>&1 &")
    return f"{escapee(reports)} & ( {daemon} ) ; sleep 60"


async def test_timeout_kills_setsid_children_and_double_forked_daemons(
    tool: BashTool, reports: Reports
) -> None:
    """Processes that left the command's session are killed on timeout too: the tree is."""
    returned: list[ToolResult] = []

    async def call() -> None:
        # Generous: the two daemons must have started (and reported) before it passes.
        returned.append(await tool.execute({"command": escapees(reports), "timeout": 2000}))

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        pids = await reports.read(2)
    [result] = returned
    assert result.metadata is not None and result.metadata["timed_out"] is True
    assert "its process tree was killed" in result.output
    assert [pid for pid in pids if running(pid)] == []
    assert_no_leaks()


async def test_cancellation_kills_setsid_children_and_double_forked_daemons(
    tool: BashTool, reports: Reports
) -> None:
    """Cancelling the call kills the whole tree, then the cancellation propagates."""
    returned: list[ToolResult] = []

    async def call() -> None:
        returned.append(await tool.execute({"command": escapees(reports)}))

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        pids = await reports.read(2)
        assert all(running(pid) for pid in pids)
        tg.cancel_scope.cancel()
    assert returned == []
    assert [pid for pid in pids if running(pid)] == []
    assert_no_leaks()


async def test_a_setsid_child_holding_the_output_is_killed_when_the_shell_ends(
    tool: BashTool, reports: Reports
) -> None:
    """A stray background process that holds the output is killed even out of the group."""
    result = await tool.execute({"command": f"{escapee(reports)} &", "timeout": 20_000})
    [pid] = await reports.read(1)
    assert not result.is_error
    assert result.metadata is not None and result.metadata["killed_background"] is True
    assert not running(pid)
