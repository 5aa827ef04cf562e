"""The read, write and edit built-ins: results, every error path, confinement."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from toolnexus_async.tools.builtin._workspace import Workspace
from toolnexus_async.tools.builtin.files import (
    DEFAULT_READ_LIMIT,
    MAX_LINE_CHARS,
    EditTool,
    ReadTool,
    WriteTool,
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A workspace root, with a file outside it that must stay out of reach."""
    (tmp_path / "ws").mkdir()
    (tmp_path / "outside.txt").write_text("secret\n")
    return tmp_path / "ws"


@pytest.fixture
def ws(root: Path) -> Workspace:
    return Workspace(root, confine=True)


# --- read -------------------------------------------------------------------------------


async def test_read_numbers_the_lines(root: Path, ws: Workspace) -> None:
    """Each line comes as a six-wide right-aligned number, a tab and the text."""
    (root / "a.txt").write_text("first\nsecond\n\nfourth")
    result = await ReadTool(ws).execute({"path": "a.txt"})
    assert not result.is_error
    assert result.output == "     1\tfirst\n     2\tsecond\n     3\t\n     4\tfourth"


async def test_read_offset_and_limit_page_through(root: Path, ws: Workspace) -> None:
    """offset is 1-based, limit counts lines, and a cut read says how to go on."""
    (root / "a.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    result = await ReadTool(ws).execute({"path": "a.txt", "offset": 3, "limit": 2})
    lines = result.output.splitlines()
    assert lines[:2] == ["     3\tline 3", "     4\tline 4"]
    assert "offset=5" in result.output
    assert result.metadata is not None and result.metadata["truncated"] is True
    tail = await ReadTool(ws).execute({"path": "a.txt", "offset": 9})
    assert tail.output == "     9\tline 9\n    10\tline 10"


async def test_read_default_limit_truncates_with_a_note(root: Path, ws: Workspace) -> None:
    """Without a limit at most DEFAULT_READ_LIMIT lines come back, with a note."""
    (root / "big.txt").write_text("x\n" * (DEFAULT_READ_LIMIT + 5))
    result = await ReadTool(ws).execute({"path": "big.txt"})
    numbered = [line for line in result.output.splitlines() if "\t" in line]
    assert len(numbered) == DEFAULT_READ_LIMIT
    assert f"offset={DEFAULT_READ_LIMIT + 1}" in result.output


async def test_read_cuts_very_long_lines(root: Path, ws: Workspace) -> None:
    """A minified file's one huge line does not flood the model."""
    (root / "min.js").write_text("y" * (MAX_LINE_CHARS * 3))
    result = await ReadTool(ws).execute({"path": "min.js"})
    assert len(result.output) < MAX_LINE_CHARS + 100
    assert "line cut" in result.output


async def test_read_offset_past_the_end_is_an_error(root: Path, ws: Workspace) -> None:
    """Asking for line 50 of a 2-line file says how long the file is."""
    (root / "a.txt").write_text("1\n2\n")
    result = await ReadTool(ws).execute({"path": "a.txt", "offset": 50})
    assert result.is_error
    assert "past the end" in result.output and "2 lines" in result.output


async def test_read_empty_file(root: Path, ws: Workspace) -> None:
    """An empty file is not an error, and says it is empty."""
    (root / "e.txt").write_bytes(b"")
    result = await ReadTool(ws).execute({"path": "e.txt"})
    assert not result.is_error
    assert "empty" in result.output


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        (lambda r: None, "file not found: nope.txt"),
        (lambda r: (r / "nope.txt").mkdir(), "is a directory"),
        (lambda r: (r / "nope.txt").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0"), "binary"),
        (lambda r: (r / "nope.txt").write_bytes(b"caf\xe9\n"), "not UTF-8"),
    ],
    ids=["missing", "directory", "binary", "latin1"],
)
async def test_read_errors(root: Path, ws: Workspace, setup: object, expected: str) -> None:
    """A missing file, a directory and non-text content are clear error results."""
    assert callable(setup)
    setup(root)
    result = await ReadTool(ws).execute({"path": "nope.txt"})
    assert result.is_error
    assert expected in result.output


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ({}, "'path' is required"),
        ({"path": 5}, "'path' must be a string"),
        ({"path": "a", "offset": 0}, "'offset' must be at least 1"),
        ({"path": "a", "offset": "2"}, "'offset' must be an integer"),
        ({"path": "a", "limit": True}, "'limit' must be an integer"),
    ],
)
async def test_read_argument_errors_name_the_field(
    ws: Workspace, args: dict[str, object], field: str
) -> None:
    """Bad arguments are error results naming the field, never exceptions."""
    result = await ReadTool(ws).execute(args)
    assert result.is_error
    assert field in result.output


async def test_read_refuses_escapes(root: Path, ws: Workspace) -> None:
    """'..', absolute and symlinked paths leading out are refused; nothing leaks."""
    (root / "link").symlink_to(root.parent / "outside.txt")
    for path in ("../outside.txt", str(root.parent / "outside.txt"), "link"):
        result = await ReadTool(ws).execute({"path": path})
        assert result.is_error, path
        assert "secret" not in result.output
        assert "workspace root" in result.output


# --- write ------------------------------------------------------------------------------


async def test_write_creates_parents_and_reports_bytes(root: Path, ws: Workspace) -> None:
    """Missing folders are created; the count is of UTF-8 bytes, not characters."""
    result = await WriteTool(ws, approve="allow-all").execute(
        {"path": "a/b/c.txt", "content": "héllo\n"}
    )
    assert not result.is_error
    assert (root / "a" / "b" / "c.txt").read_bytes() == "héllo\n".encode()
    assert "wrote 7 bytes to a/b/c.txt" in result.output
    assert "created" in result.output


async def test_write_overwrites_and_may_write_nothing(root: Path, ws: Workspace) -> None:
    """An existing file is replaced; empty content is allowed."""
    (root / "f.txt").write_text("old content")
    result = await WriteTool(ws, approve="allow-all").execute({"path": "f.txt", "content": ""})
    assert not result.is_error
    assert "wrote 0 bytes" in result.output and "overwrote" in result.output
    assert (root / "f.txt").read_bytes() == b""


async def test_write_errors(root: Path, ws: Workspace) -> None:
    """A directory target, a missing or non-string content are error results."""
    (root / "d").mkdir()
    on_dir = await WriteTool(ws, approve="allow-all").execute({"path": "d", "content": "x"})
    assert on_dir.is_error and "is a directory" in on_dir.output
    missing = await WriteTool(ws, approve="allow-all").execute({"path": "f.txt"})
    assert missing.is_error and "'content' is required" in missing.output
    wrong = await WriteTool(ws, approve="allow-all").execute({"path": "f.txt", "content": ["x"]})
    assert wrong.is_error and "'content' must be a string" in wrong.output
    assert not (root / "f.txt").exists()


async def test_write_refuses_escapes_and_creates_nothing_outside(root: Path, ws: Workspace) -> None:
    """Writes through '..', an absolute path or a symlinked folder never land outside."""
    outside = root.parent
    (root / "door").symlink_to(outside, target_is_directory=True)
    before = sorted(p.name for p in outside.iterdir())
    for path in ("../new.txt", str(outside / "new.txt"), "door/new.txt", "door/sub/new.txt"):
        result = await WriteTool(ws, approve="allow-all").execute({"path": path, "content": "x"})
        assert result.is_error, path
        assert "workspace root" in result.output
    assert sorted(p.name for p in outside.iterdir()) == before
    assert (outside / "outside.txt").read_text() == "secret\n"


# --- edit -------------------------------------------------------------------------------


async def test_edit_replaces_a_unique_string(root: Path, ws: Workspace) -> None:
    """A single occurrence is replaced and the count reported."""
    (root / "f.py").write_text("a = 1\nb = 2\n")
    result = await EditTool(ws, approve="allow-all").execute(
        {"path": "f.py", "oldString": "b = 2", "newString": "b = 3"}
    )
    assert not result.is_error
    assert "replaced 1 occurrence in f.py" in result.output
    assert (root / "f.py").read_text() == "a = 1\nb = 3\n"


async def test_edit_replace_all(root: Path, ws: Workspace) -> None:
    """With replaceAll every occurrence changes and the count says how many."""
    (root / "f.txt").write_text("x x x")
    args = {"path": "f.txt", "oldString": "x", "newString": "yy", "replaceAll": True}
    result = await EditTool(ws, approve="allow-all").execute(args)
    assert "replaced 3 occurrences" in result.output
    assert (root / "f.txt").read_text() == "yy yy yy"


async def test_edit_failures_leave_the_file_unchanged(root: Path, ws: Workspace) -> None:
    """Absent, non-unique and identical strings are errors and the bytes stay the same."""
    original = b"one\ntwo\ntwo\n"
    (root / "f.txt").write_bytes(original)
    cases = [
        ({"oldString": "three", "newString": "3"}, "not found"),
        ({"oldString": "two", "newString": "2"}, "occurs 2 times"),
        ({"oldString": "two", "newString": "two"}, "the same"),
        ({"oldString": "", "newString": "x"}, "'oldString' must not be empty"),
        ({"oldString": "one"}, "'newString' is required"),
        ({"oldString": "one", "newString": "1", "replaceAll": "yes"}, "'replaceAll' must be"),
    ]
    for extra, expected in cases:
        result = await EditTool(ws, approve="allow-all").execute({"path": "f.txt", **extra})
        assert result.is_error, extra
        assert expected in result.output, (extra, result.output)
        assert (root / "f.txt").read_bytes() == original


async def test_edit_missing_and_binary_files(root: Path, ws: Workspace) -> None:
    """A missing file and a binary file are error results; the binary stays intact."""
    missing = await EditTool(ws, approve="allow-all").execute(
        {"path": "no.txt", "oldString": "a", "newString": "b"}
    )
    assert missing.is_error and "file not found: no.txt" in missing.output
    blob = b"a\0b\0a"
    (root / "blob.bin").write_bytes(blob)
    binary = await EditTool(ws, approve="allow-all").execute(
        {"path": "blob.bin", "oldString": "a", "newString": "b"}
    )
    assert binary.is_error and "binary" in binary.output
    assert (root / "blob.bin").read_bytes() == blob


async def test_edit_keeps_windows_line_endings(root: Path, ws: Workspace) -> None:
    """A model's '\\n' matches a CRLF file, and the file keeps its CRLF endings."""
    (root / "w.txt").write_bytes(b"one\r\ntwo\r\nthree\r\n")
    args = {"path": "w.txt", "oldString": "one\ntwo", "newString": "1\n2"}
    result = await EditTool(ws, approve="allow-all").execute(args)
    assert not result.is_error
    assert (root / "w.txt").read_bytes() == b"1\r\n2\r\nthree\r\n"


async def test_edit_refuses_a_symlink_leading_out(root: Path, ws: Workspace) -> None:
    """Editing through a link to an outside file is refused and the outside file untouched."""
    (root / "link").symlink_to(root.parent / "outside.txt")
    result = await EditTool(ws, approve="allow-all").execute(
        {"path": "link", "oldString": "secret", "newString": "x"}
    )
    assert result.is_error and "symlink" in result.output
    assert (root.parent / "outside.txt").read_text() == "secret\n"


async def test_concurrent_edits_of_one_file_all_land(root: Path, ws: Workspace) -> None:
    """Edits of one turn run concurrently; none of them may overwrite another's change."""
    count = 40
    (root / "f.txt").write_text("".join(f"<{i}>\n" for i in range(count)))
    tool = EditTool(ws, approve="allow-all")

    async def edit(i: int) -> None:
        result = await tool.execute({"path": "f.txt", "oldString": f"<{i}>", "newString": "ok"})
        assert not result.is_error

    async with anyio.create_task_group() as tg:
        for i in range(count):
            tg.start_soon(edit, i)
    assert (root / "f.txt").read_text() == "ok\n" * count
