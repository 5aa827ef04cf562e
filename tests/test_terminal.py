"""Asking at the terminal lets Ctrl-C stop the program at once: README.md's first example and
``toolnexus-async demo`` in real child processes, each stopped by one SIGINT while it waits
for a line that never comes; and ``terminal_input`` on a real pipe, where a cancelled call
leaves its line to the next.
"""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import sys
from pathlib import Path

import anyio
import anyio.abc
import pytest

from tests.test_docs import RUN, fenced_blocks
from tests.test_readme import README
from toolnexus_async import terminal_input

# Seconds the child gets to end after one SIGINT: a hang (the old input() thread) fails.
PROMPTLY = 10


# The number of the read system call, whose first argument is the descriptor.
READ = {"x86_64": 0, "aarch64": 63}[platform.machine()]


def reading_stdin(pid: int) -> bool:
    """Whether a thread of process ``pid`` waits in a read of its standard input (Linux)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that just ended
            number, fd, *_ = [*(task / "syscall").read_text().split(), "", ""]
            if number == str(READ) and fd == "0x0":
                return True
    return False


async def interrupted_while_asking(command: list[str], prompt: bytes) -> tuple[int, str, str]:
    """Start ``command`` with a standard input that stays open and empty, wait for ``prompt``
    on its output and for it to wait in a read of that input, send one SIGINT; its exit
    status, output and error output."""
    async with await anyio.open_process(command) as process:
        assert process.stdout is not None and process.stderr is not None
        try:
            out = b""
            with anyio.fail_after(60):
                while prompt not in out:
                    out += await process.stdout.receive()
                # A SIGINT before it reads proves nothing. Another process's state: no
                # event to wait on, so it is polled.
                while not reading_stdin(process.pid):  # noqa: ASYNC110
                    await anyio.sleep(0.01)
            process.send_signal(signal.SIGINT)
            with anyio.fail_after(PROMPTLY):
                out += b"".join([chunk async for chunk in process.stdout])
                err = b"".join([chunk async for chunk in process.stderr])
                code = await process.wait()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    return code, out.decode(), err.decode()


async def test_readme_first_example_stops_on_one_ctrl_c(tmp_path: Path) -> None:
    body = next(body for lang, _, body in fenced_blocks(README) if lang == RUN)
    script = tmp_path / "example.py"
    script.write_text(body, encoding="utf-8")
    code, out, err = await interrupted_while_asking([sys.executable, str(script)], b"approve?")
    assert (code, err) == (0, "")
    assert out.endswith("approve? [y/N] \ninterrupted\n")


async def test_demo_stops_on_one_ctrl_c() -> None:
    command = [sys.executable, "-m", "toolnexus_async", "demo"]
    code, out, err = await interrupted_while_asking(command, b"party_size [2]: ")
    assert (code, err) == (130, "\ninterrupted\n")
    assert "status:" not in out


async def test_terminal_input_leaves_the_line_of_a_cancelled_call_to_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Read from a pipe's descriptor, as from a terminal: the call cancelled while nothing
    was typed takes nothing, the next ones get the lines in order, then EOFError."""
    read_end, write_end = os.pipe()
    with os.fdopen(read_end, encoding="utf-8") as stdin:
        monkeypatch.setattr("sys.stdin", stdin)
        with anyio.move_on_after(0) as waited:
            await terminal_input()
        assert waited.cancelled_caught
        os.write(write_end, b"first\r\nsecond line\nno newline")
        os.close(write_end)
        with anyio.fail_after(PROMPTLY):
            assert await terminal_input() == "first"
            assert await terminal_input("> ") == "second line"
            assert await terminal_input() == "no newline"
            with pytest.raises(EOFError):
                await terminal_input()
