"""Confinement holds while another thread swaps a path for a symlink leading out.

A racer thread keeps turning a file of the workspace (``swap.txt``) and a directory of it
(``swapdir``) into symlinks to a file and a directory outside, and back, as fast as it can.
Meanwhile the tools read and write those paths 10,000 times, most through the tools' own
worker functions (``_read``, ``_write``: the async wrapper only adds a thread hop), a part
through ``execute``; then ``apply_patch``, ``grep`` and ``glob`` go through the swapped
directory. Nothing outside may be read, listed or changed. When the tools checked a path
and then opened it by name, 21 to 104 of the 4,000 synchronous reads returned the outside
file and 107 to 194 of the 4,000 writes landed outside (three runs).
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from toolnexus_async import ToolResult
from toolnexus_async.tools.builtin import (
    ApplyPatchTool,
    ConfinementError,
    GlobTool,
    GrepTool,
    ReadTool,
    Workspace,
    WriteTool,
    _workspace,
)
from toolnexus_async.tools.builtin._beneath import open_beneath

MARKER = "OUTSIDE-MARKER"


def _exchanger() -> Callable[[bytes, bytes], None] | None:
    """``renameat2(RENAME_EXCHANGE)``: swaps two names in one step, a directory with a
    symlink included, so the swapped path is never missing (a write would create it)."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return None
    at_fdcwd, rename_exchange = -100, 2

    def exchange(a: bytes, b: bytes) -> None:
        if renameat2(at_fdcwd, a, at_fdcwd, b, rename_exchange):
            error = ctypes.get_errno()
            raise OSError(error, os.strerror(error), os.fsdecode(a))

    return exchange


EXCHANGE = _exchanger()
pytestmark = pytest.mark.skipif(
    os.open not in os.supports_dir_fd or EXCHANGE is None,
    reason="race-free confinement needs dir_fd; the racer needs renameat2",
)


class Racer:
    """Swaps ``swap.txt`` and ``swapdir`` between the real thing and a symlink leading out,
    in a thread, until the ``with`` block ends."""

    def __init__(self, root: Path, outside: Path) -> None:
        self.root = root
        self.stop = threading.Event()
        self.swaps = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        # The other half of each pair: a link to the outside, or (after a swap) the real one.
        os.symlink(outside / "secret.txt", root / ".file.other")
        os.symlink(outside / "dir", root / ".dir.other")

    def __enter__(self) -> Racer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    def _run(self) -> None:
        assert EXCHANGE is not None
        # Encoded once: the less Python the loop runs, the less it holds the GIL.
        pairs = [
            (os.fsencode(self.root / a), os.fsencode(self.root / b))
            for a, b in (("swap.txt", ".file.other"), ("swapdir", ".dir.other"))
        ]
        while not self.stop.is_set():
            for a, b in pairs:
                EXCHANGE(a, b)
            self.swaps += 1


def snapshot(top: Path) -> dict[str, str | None]:
    """Every path under ``top`` with its text (None for a directory or a link)."""
    return {
        str(p.relative_to(top)): None if p.is_dir() or p.is_symlink() else p.read_text()
        for p in sorted(top.rglob("*"))
    }


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory outside the workspace: a file and a folder holding the marker."""
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "secret.txt").write_text(f"{MARKER} file\n")
    (outside / "dir" / "f.txt").write_text(f"{MARKER} dir\n")
    return outside


@pytest.fixture
def root(tmp_path: Path, outside: Path) -> Iterator[Path]:
    root = tmp_path / "ws"
    (root / "swapdir").mkdir(parents=True)
    (root / "swapdir" / "f.txt").write_text("inside\n")
    (root / "swap.txt").write_text("inside\n")
    yield root


def leaked(output: str) -> bool:
    """The outside files' text is in ``output`` (the marker alone may be a quoted pattern)."""
    return f"{MARKER} file" in output or f"{MARKER} dir" in output


class Escapes:
    """Counts what reached the outside: reads that returned the marker, writes that changed
    the outside directory (put back each time, so that the next one counts too)."""

    def __init__(self, outside: Path) -> None:
        self.outside = outside
        self.pristine = snapshot(outside)
        self.reads = 0
        self.writes = 0

    def read(self, result: ToolResult) -> None:
        if leaked(result.output):
            self.reads += 1

    def wrote(self) -> None:
        # A few system calls, not a walk: this runs after every write.
        texts = [(self.outside / name).read_text() for name in ("secret.txt", "dir/f.txt")]
        names = os.listdir(self.outside / "dir")
        if texts == [f"{MARKER} file\n", f"{MARKER} dir\n"] and names == ["f.txt"]:
            return
        now = snapshot(self.outside)
        self.writes += 1
        for name in now:
            if name not in self.pristine:
                (self.outside / name).unlink()
        for name, text in self.pristine.items():
            if text is not None:
                (self.outside / name).write_text(text)


PATHS = ("swap.txt", "swapdir/f.txt")


def test_sync_reads_and_writes_never_escape(root: Path, outside: Path) -> None:
    """8,000 calls of the tools' worker functions under the racer: nothing outside."""
    ws = Workspace(root)
    reader = ReadTool(ws)
    writer = WriteTool(ws, approve="allow-all")
    decision = writer.approval.decide("write", {}, None)
    assert not isinstance(decision, ToolResult)
    escapes = Escapes(outside)
    with Racer(root, outside) as racer:
        for i in range(4000):
            path = PATHS[i % 2]
            escapes.read(reader._read(path, 1, 10))
            args = {"path": path, "content": "written\n"}
            writer._write(args, path, "written\n", decision)
            escapes.wrote()
    assert racer.swaps > 100, "the racer barely ran; the test proves nothing"
    assert (escapes.reads, escapes.writes) == (0, 0), (
        f"{escapes.reads} of 4000 reads returned the outside file, "
        f"{escapes.writes} of 4000 writes landed outside ({racer.swaps} swaps)"
    )
    assert snapshot(outside) == escapes.pristine


async def test_tool_api_reads_and_writes_never_escape(root: Path, outside: Path) -> None:
    """2,000 calls through ``execute`` under the racer: nothing outside."""
    ws = Workspace(root)
    reader = ReadTool(ws)
    writer = WriteTool(ws, approve="allow-all")
    escapes = Escapes(outside)
    with Racer(root, outside) as racer:
        for i in range(1000):
            path = PATHS[i % 2]
            escapes.read(await reader.execute({"path": path}))
            await writer.execute({"path": path, "content": "written\n"})
            escapes.wrote()
    assert racer.swaps > 10, "the racer barely ran; the test proves nothing"
    assert (escapes.reads, escapes.writes) == (0, 0), (
        f"{escapes.reads} of 1000 reads returned the outside file, "
        f"{escapes.writes} of 1000 writes landed outside ({racer.swaps} swaps)"
    )
    assert snapshot(outside) == escapes.pristine


def patch(*lines: str) -> str:
    return "\n".join(["*** Begin Patch", *lines, "*** End Patch"]) + "\n"


async def test_patch_grep_and_glob_never_escape(root: Path, outside: Path) -> None:
    """apply_patch adds, moves and deletes under the swapped directory, grep searches it and
    glob lists it: nothing outside is created, deleted, found or listed."""
    ws = Workspace(root)
    patcher = ApplyPatchTool(ws, approve="allow-all")
    grep = GrepTool(ws)
    glob = GlobTool(ws)
    escapes = Escapes(outside)
    seen: list[str] = []
    (root / "swapdir" / "f.txt").unlink()
    with Racer(root, outside) as racer:
        for _ in range(150):
            await patcher.execute({"patchText": patch("*** Add File: swapdir/new.txt", "+new")})
            escapes.wrote()
            await patcher.execute(
                {
                    "patchText": patch(
                        "*** Update File: swapdir/new.txt",
                        "*** Move to: swapdir/moved.txt",
                        "-new",
                        "+moved",
                    )
                }
            )
            escapes.wrote()
            for name in ("new.txt", "moved.txt", "f.txt"):
                await patcher.execute({"patchText": patch(f"*** Delete File: swapdir/{name}")})
                escapes.wrote()
            found = await grep.execute({"pattern": MARKER})
            listed = await glob.execute({"pattern": "**/*"})
            seen += [r.output for r in (found, listed) if leaked(r.output)]
            # There is no swapdir/f.txt inside any more, only the outside one.
            if "swapdir/f.txt" in listed.output:
                seen.append(listed.output)
    assert racer.swaps > 10, "the racer barely ran; the test proves nothing"
    assert (escapes.writes, seen) == (0, [])
    assert snapshot(outside) == escapes.pristine


# --- the walk itself, without a race ----------------------------------------------------


def test_the_walk_follows_links_that_stay_inside(root: Path, outside: Path) -> None:
    """Relative links with '..' and absolute ones through another name of the root are
    followed by hand; what they lead to is opened."""
    (root / "swapdir" / "up").symlink_to("../swap.txt")
    (root.parent / "root-link").symlink_to(root, target_is_directory=True)
    (root / "abs").symlink_to(root.parent / "root-link" / "swapdir")
    for relative in ("swapdir/up", "abs/f.txt", "abs/up"):
        fd = open_beneath(root, Path(relative), os.O_RDONLY, relative)
        with os.fdopen(fd, "rb") as stream:
            assert stream.read() == b"inside\n", relative


def test_the_walk_refuses_links_leading_out_and_loops(root: Path, outside: Path) -> None:
    """'..' past the root through a link, an absolute link elsewhere, or a loop: refused,
    and a write through them creates nothing."""
    (root / "climb").symlink_to("../../outside/secret.txt")
    (root / "door").symlink_to(outside / "dir")
    (root / "loop").symlink_to("loop")
    for relative in ("climb", "door/f.txt", "door/new.txt"):
        with pytest.raises(ConfinementError, match="follows a symlink out of"):
            open_beneath(root, Path(relative), os.O_WRONLY | os.O_CREAT, relative)
    with pytest.raises(OSError) as info:
        open_beneath(root, Path("loop"), os.O_RDONLY, "loop")
    assert info.value.errno == errno.ELOOP
    assert snapshot(outside) == {
        "dir": None,
        "dir/f.txt": f"{MARKER} dir\n",
        "secret.txt": f"{MARKER} file\n",
    }


def test_unlink_removes_a_link_not_what_it_points_to(root: Path, outside: Path) -> None:
    """A file swapped for a link before the deletion: the link goes, the target stays."""
    ws = Workspace(root)
    path = ws.resolve("swap.txt")
    (root / "swap.txt").unlink()
    (root / "swap.txt").symlink_to(outside / "secret.txt")
    ws.unlink(path)
    assert not (root / "swap.txt").is_symlink()
    assert (outside / "secret.txt").read_text() == f"{MARKER} file\n"


async def test_without_dir_fd_the_tools_still_work_and_refuse_escapes(
    root: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the platform cannot walk beneath a descriptor, paths are used as checked: the
    tools work and every escape they can see is still refused."""
    monkeypatch.setattr(_workspace, "SUPPORTED", False)
    ws = Workspace(root)
    assert ws.within is None
    (root / "door").symlink_to(outside / "dir")
    assert (await ReadTool(ws).execute({"path": "swapdir/f.txt"})).output == "     1\tinside"
    writer = WriteTool(ws, approve="allow-all")
    assert not (await writer.execute({"path": "new/deep.txt", "content": "x"})).is_error
    assert (root / "new" / "deep.txt").read_text() == "x"
    refused = await writer.execute({"path": "door/x.txt", "content": "x"})
    assert refused.is_error and "follows a symlink out of" in refused.output
    listed = await GlobTool(ws).execute({"pattern": "**/*.txt"})
    assert listed.output == "new/deep.txt\nswap.txt\nswapdir/f.txt"
