"""The file tools use regular files only: FIFOs, devices and sockets are refused or skipped.

Reading a FIFO nobody writes to used to block a worker thread forever. Each call here runs
under a watchdog: should a tool block on the FIFO again, the watchdog opens the other end
after a few seconds, so the test fails (``freed``) instead of hanging the suite.
"""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from toolnexus_async import ToolResult
from toolnexus_async.tools.builtin import (
    ApplyPatchTool,
    EditTool,
    GlobTool,
    GrepTool,
    ReadTool,
    SpecialFileError,
    Workspace,
    WriteTool,
    search,
)
from toolnexus_async.tools.builtin._regular import open_regular
from toolnexus_async.tools.builtin._walk import _files

WATCHDOG_S = 5


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A workspace with a FIFO, a unix socket, a link to /dev/null and one text file."""
    root = tmp_path / "ws"
    root.mkdir()
    os.mkfifo(root / "fifo")
    (root / "null").symlink_to("/dev/null")
    (root / "text.txt").write_text("needle\n")
    monkeypatch.chdir(root)  # a relative socket path stays under the 108-byte limit
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind("sock")
    try:
        yield root
    finally:
        server.close()


def tools(root: Path) -> dict[str, Any]:
    # Unconfined, so that the link to /dev/null is followed rather than refused as an escape.
    ws = Workspace(root, confine=False)
    return {
        "read": ReadTool(ws),
        "write": WriteTool(ws, approve="allow-all"),
        "edit": EditTool(ws, approve="allow-all"),
        "apply_patch": ApplyPatchTool(ws, approve="allow-all"),
        "grep": GrepTool(ws),
        "glob": GlobTool(ws),
    }


def _free(fifo: Path) -> None:
    """Open the other end of ``fifo``, so that a tool blocked opening it goes on."""
    for flags in (os.O_WRONLY | os.O_NONBLOCK, os.O_RDONLY | os.O_NONBLOCK):
        try:
            os.close(os.open(fifo, flags))
        except OSError:
            pass


@asynccontextmanager
async def watchdog(fifo: Path) -> AsyncIterator[list[bool]]:
    """For the block: after WATCHDOG_S, free whatever blocks on ``fifo`` and say so."""
    freed: list[bool] = []

    async def watch() -> None:
        await anyio.sleep(WATCHDOG_S)
        freed.append(True)
        _free(fifo)

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        yield freed
        tg.cancel_scope.cancel()


async def call(root: Path, tool: str, args: dict[str, Any]) -> ToolResult:
    """Run ``tool`` under the watchdog; it must not have needed it."""
    async with watchdog(root / "fifo") as freed:
        result: ToolResult = await tools(root)[tool].execute(args)
    assert freed == [], f"{tool} blocked on the FIFO"
    return result


def patch(*lines: str) -> str:
    return "\n".join(["*** Begin Patch", *lines, "*** End Patch"])


SPECIAL = {
    "fifo": "is a FIFO (named pipe), not a regular file",
    "null": "is a character device, not a regular file",
    "sock": "is a socket, not a regular file",
}


def calls(name: str) -> list[tuple[str, dict[str, Any]]]:
    return [
        ("read", {"path": name}),
        ("write", {"path": name, "content": "x"}),
        ("edit", {"path": name, "oldString": "a", "newString": "b"}),
        ("apply_patch", {"patchText": patch(f"*** Update File: {name}", "@@", "-a", "+b")}),
        ("apply_patch", {"patchText": patch(f"*** Delete File: {name}")}),
        ("apply_patch", {"patchText": patch(f"*** Add File: {name}", "+x")}),
        ("grep", {"pattern": "x", "path": name}),
    ]


@pytest.mark.parametrize("name", list(SPECIAL))
@pytest.mark.parametrize("index", range(len(calls("x"))))
async def test_each_file_tool_refuses_special_files(root: Path, name: str, index: int) -> None:
    """read, write, edit, apply_patch (update, delete, add) and grep refuse, saying what it
    is; nothing is written, and the special file is still there."""
    tool, args = calls(name)[index]
    result = await call(root, tool, args)
    assert result.is_error, (tool, result.output)
    assert f"{name} {SPECIAL[name]}" in result.output, (tool, result.output)
    assert not (root / name).is_file()
    assert (root / name).exists()


async def test_grep_and_glob_skip_special_files_when_walking(root: Path) -> None:
    """A directory walk lists and searches only the regular file."""
    (root / "sub").mkdir()
    os.mkfifo(root / "sub" / "needle-fifo")
    found = await call(root, "grep", {"pattern": "needle"})
    assert found.output == "text.txt:1:needle"
    listed = await call(root, "glob", {"pattern": "*"})
    assert listed.output == "text.txt"


async def test_grep_skips_a_file_swapped_for_a_fifo_after_the_walk(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The open refuses too: a FIFO that replaced a file the walk saw is skipped."""
    (root / "later.txt").write_text("needle\n")
    walked = await anyio.to_thread.run_sync(lambda: list(_files(Workspace(root), root)))
    assert root / "later.txt" in walked
    (root / "later.txt").unlink()
    os.mkfifo(root / "later.txt")
    monkeypatch.setattr(search, "_files", lambda workspace, base: iter(walked))
    try:
        found = await call(root, "grep", {"pattern": "needle"})
    finally:
        _free(root / "later.txt")
    assert found.output == "text.txt:1:needle"


def test_open_regular_checks_the_descriptor_not_only_the_path(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Even when the check before the open is fooled, the open (a FIFO without a reader,
    opened to write, fails at once) or fstat on the descriptor refuses."""
    real_stat = os.stat
    text_mode = real_stat(root / "text.txt").st_mode

    class Fooled:
        def __init__(self, path: Any) -> None:
            self.st_mode = text_mode if str(path).endswith("fifo") else real_stat(path).st_mode

    monkeypatch.setattr(os, "stat", Fooled)
    for write in (False, True):
        with pytest.raises(SpecialFileError, match="fifo is a FIFO"):
            open_regular(root / "fifo", "fifo", write=write)
