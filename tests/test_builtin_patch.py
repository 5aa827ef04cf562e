"""The apply_patch built-in: the grammar, the all-or-nothing rule, and confinement."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolnexus_async.tools.builtin import apply_patch
from toolnexus_async.tools.builtin._regular import write_regular
from toolnexus_async.tools.builtin._workspace import Workspace
from toolnexus_async.tools.builtin.apply_patch import ApplyPatchTool, PatchError, parse_patch


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A workspace root holding two source files, with a file outside it."""
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text(
        "import os\n\ndef main():\n    print('hi')\n    return 0\n"
    )
    (root / "notes.txt").write_text("alpha\nbeta\ngamma\n")
    (tmp_path / "outside.txt").write_text("outside\n")
    return root


@pytest.fixture
def tool(root: Path) -> ApplyPatchTool:
    return ApplyPatchTool(Workspace(root, confine=True), approve="allow-all")


def snapshot(top: Path) -> dict[str, bytes | None]:
    """Every path under ``top`` (the workspace's parent) with its bytes; None for folders."""
    return {
        str(p.relative_to(top)): (None if p.is_dir() else p.read_bytes())
        for p in sorted(top.rglob("*"))
        if not p.is_symlink()
    }


async def refused(root: Path, tool: ApplyPatchTool, text: str) -> str:
    """Apply ``text``, which must fail and leave every file as it was; the error's text."""
    before = snapshot(root.parent)
    result = await tool.execute({"patchText": text})
    assert result.is_error
    assert snapshot(root.parent) == before
    return result.output


def patch(*lines: str) -> str:
    return "\n".join(["*** Begin Patch", *lines, "*** End Patch"]) + "\n"


async def test_add_update_delete_in_one_patch(root: Path, tool: ApplyPatchTool) -> None:
    """One patch adds, changes and deletes; the report lists A/M/D per file."""
    result = await tool.execute(
        {
            "patchText": patch(
                "*** Add File: docs/new.md",
                "+# New",
                "+",
                "+text",
                "*** Update File: src/app.py",
                "@@ def main():",
                "-    print('hi')",
                "+    print('hello')",
                "     return 0",
                "*** Delete File: notes.txt",
            )
        }
    )
    assert not result.is_error, result.output
    assert result.output.splitlines() == [
        "Applied the patch:",
        "A docs/new.md",
        "M src/app.py",
        "D notes.txt",
    ]
    assert (root / "docs" / "new.md").read_text() == "# New\n\ntext\n"
    assert (root / "src" / "app.py").read_text() == (
        "import os\n\ndef main():\n    print('hello')\n    return 0\n"
    )
    assert not (root / "notes.txt").exists()


async def test_move_to_renames_and_changes(root: Path, tool: ApplyPatchTool) -> None:
    """'*** Move to:' writes the new content at the new path and removes the old one."""
    result = await tool.execute(
        {
            "patchText": patch(
                "*** Update File: notes.txt",
                "*** Move to: archive/notes.md",
                "@@",
                " alpha",
                "-beta",
                "+BETA",
            )
        }
    )
    assert not result.is_error, result.output
    assert "M archive/notes.md (moved from notes.txt)" in result.output
    assert not (root / "notes.txt").exists()
    assert (root / "archive" / "notes.md").read_text() == "alpha\nBETA\ngamma\n"


async def test_a_failing_hunk_writes_nothing(root: Path, tool: ApplyPatchTool) -> None:
    """If any hunk does not match, no file changes, not even the ones before it."""
    output = await refused(
        root,
        tool,
        patch(
            "*** Add File: created.txt",
            "+should not appear",
            "*** Update File: src/app.py",
            "@@",
            "-import os",
            "+import sys",
            "*** Delete File: notes.txt",
            "*** Update File: src/app.py",
            "@@",
            " def main():",
            "-    print('nope')",
            "+    print('x')",
        ),
    )
    assert "hunk 1 of src/app.py does not match" in output
    assert "print('nope')" in output
    assert "No file was changed" in output


async def test_the_error_names_the_hunk_and_its_anchor(root: Path, tool: ApplyPatchTool) -> None:
    """The second hunk failing is reported as hunk 2, with its '@@' line."""
    output = await refused(
        root,
        tool,
        patch(
            "*** Update File: notes.txt", "@@", "-alpha", "+ALPHA", "@@ gamma", "-delta", "+DELTA"
        ),
    )
    assert "hunk 2 of notes.txt (@@ gamma) does not match" in output


async def test_hunks_must_match_in_order(root: Path, tool: ApplyPatchTool) -> None:
    """A later hunk is searched after the earlier one, never before it."""
    output = await refused(
        root,
        tool,
        patch("*** Update File: notes.txt", "@@", "-gamma", "+GAMMA", "@@", "-alpha", "+ALPHA"),
    )
    assert "hunk 2 of notes.txt does not match" in output
    assert "after the previous hunk" in output


async def test_several_hunks_and_an_anchor(root: Path, tool: ApplyPatchTool) -> None:
    """Hunks apply top to bottom; an '@@ text' anchor seeks its line first."""
    (root / "f.txt").write_text("x\na\nx\nb\nx\n")
    result = await tool.execute(
        {"patchText": patch("*** Update File: f.txt", "@@ b", "-x", "+third", "@@", "-x")}
    )
    # The anchor picks the x after b; the second hunk, searched after it, finds none left.
    assert result.is_error and "hunk 2" in result.output
    ok = await tool.execute(
        {"patchText": patch("*** Update File: f.txt", "@@", "-x", "+first", "@@ b", "-x", "+3")}
    )
    assert not ok.is_error, ok.output
    assert (root / "f.txt").read_text() == "first\na\nx\nb\n3\n"


async def test_missing_anchor_is_a_mismatch(root: Path, tool: ApplyPatchTool) -> None:
    """An '@@' anchor line that is not in the file fails the hunk."""
    result = await tool.execute(
        {"patchText": patch("*** Update File: notes.txt", "@@ class Missing:", "-beta", "+b")}
    )
    assert result.is_error and "anchor line was not found" in result.output
    assert (root / "notes.txt").read_text() == "alpha\nbeta\ngamma\n"


async def test_unified_diff_ranges_are_ignored(root: Path, tool: ApplyPatchTool) -> None:
    """'@@ -1,3 +1,3 @@' headers a model copied from git do not count as an anchor."""
    result = await tool.execute(
        {"patchText": patch("*** Update File: notes.txt", "@@ -1,3 +1,3 @@", "-beta", "+B")}
    )
    assert not result.is_error, result.output
    assert (root / "notes.txt").read_text() == "alpha\nB\ngamma\n"


async def test_whitespace_tolerant_matching(root: Path, tool: ApplyPatchTool) -> None:
    """Trailing whitespace and a lost leading space on blank context lines still match."""
    (root / "f.py").write_text("def f():   \n\n    return 1\n")
    result = await tool.execute(
        {
            "patchText": patch(
                "*** Update File: f.py", " def f():", "", "-    return 1", "+    return 2"
            )
        }
    )
    assert not result.is_error, result.output
    assert (root / "f.py").read_text() == "def f():   \n\n    return 2\n"


async def test_end_of_file_and_pure_additions(root: Path, tool: ApplyPatchTool) -> None:
    """'*** End of File' anchors a hunk at the end; a hunk of only '+' lines appends."""
    (root / "f.txt").write_text("x\ny\nx\n")
    result = await tool.execute(
        {"patchText": patch("*** Update File: f.txt", "@@", "-x", "+last", "*** End of File")}
    )
    assert not result.is_error, result.output
    assert (root / "f.txt").read_text() == "x\ny\nlast\n"
    appended = await tool.execute({"patchText": patch("*** Update File: f.txt", "@@", "+tail")})
    assert not appended.is_error
    assert (root / "f.txt").read_text() == "x\ny\nlast\ntail\n"


async def test_line_endings_and_final_newline_are_kept(root: Path, tool: ApplyPatchTool) -> None:
    """A CRLF file stays CRLF; a file without a final newline does not gain one."""
    (root / "w.txt").write_bytes(b"one\r\ntwo\r\n")
    (root / "n.txt").write_bytes(b"one\ntwo")
    result = await tool.execute(
        {
            "patchText": patch(
                "*** Update File: w.txt",
                "-two",
                "+2",
                "*** Update File: n.txt",
                "-two",
                "+2",
            )
        }
    )
    assert not result.is_error, result.output
    assert (root / "w.txt").read_bytes() == b"one\r\n2\r\n"
    assert (root / "n.txt").read_bytes() == b"one\n2"


async def test_blank_lines_between_sections_are_gaps(root: Path, tool: ApplyPatchTool) -> None:
    """Empty lines separating file sections are not taken as content or context."""
    (root / "f.txt").write_text("a\nb\n")
    result = await tool.execute(
        {
            "patchText": patch(
                "*** Add File: new.txt",
                "+x",
                "",
                "*** Update File: f.txt",
                "-a",
                "+A",
                "",
                "",
                "*** Update File: notes.txt",
                "-gamma",
                "+G",
                "*** End of File",
                "",
            )
        }
    )
    assert not result.is_error, result.output
    assert (root / "new.txt").read_text() == "x\n"
    assert (root / "f.txt").read_text() == "A\nb\n"
    assert (root / "notes.txt").read_text() == "alpha\nbeta\nG\n"


async def test_delete_then_add_the_same_path(root: Path, tool: ApplyPatchTool) -> None:
    """Operations apply in order against the patch's own earlier results."""
    result = await tool.execute(
        {"patchText": patch("*** Delete File: notes.txt", "*** Add File: notes.txt", "+fresh")}
    )
    assert not result.is_error, result.output
    assert (root / "notes.txt").read_text() == "fresh\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("*** Add File: a\n+x\n*** End Patch", "must start with '*** Begin Patch'"),
        ("*** Begin Patch\n*** Add File: a\n+x\n", "must end with '*** End Patch'"),
        (patch("*** Add File: a", "no plus"), "must start with '+'"),
        (patch("*** Update File: notes.txt", "@@", "?weird"), "is not a hunk line"),
        (patch("*** Rename File: a"), "expected '*** Add File:'"),
        (patch("*** Update File: notes.txt"), "has no hunks"),
        (patch("*** Add File:   "), "needs a path"),
        (patch(), "changes no file"),
        (patch("*** Update File: notes.txt", "-beta", "*** End of File", "+x"), "must end"),
    ],
)
async def test_malformed_patches_write_nothing(
    root: Path, tool: ApplyPatchTool, text: str, expected: str
) -> None:
    """A patch that does not parse is an error naming the problem; no file changes."""
    assert expected in await refused(root, tool, text)


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (("*** Add File: notes.txt", "+x"), "Add File notes.txt: the file already exists"),
        (("*** Delete File: gone.txt",), "Delete File gone.txt: no such file"),
        (("*** Update File: gone.txt", "-a"), "Update File gone.txt: no such file"),
        (("*** Update File: src", "-a"), "src is a directory"),
        (
            ("*** Update File: notes.txt", "*** Move to: src/app.py", "-beta"),
            "Move to src/app.py: the file already exists",
        ),
    ],
)
async def test_file_state_errors_write_nothing(
    root: Path, tool: ApplyPatchTool, lines: tuple[str, ...], expected: str
) -> None:
    """Adding an existing file, touching a missing one, or moving onto one is refused."""
    assert expected in await refused(root, tool, patch("*** Add File: first.txt", "+1", *lines))


async def test_binary_files_are_not_patched(root: Path, tool: ApplyPatchTool) -> None:
    """An Update of a binary file is refused."""
    (root / "b.bin").write_bytes(b"a\0b\n")
    result = await tool.execute({"patchText": patch("*** Update File: b.bin", "-a", "+b")})
    assert result.is_error and "binary" in result.output
    assert (root / "b.bin").read_bytes() == b"a\0b\n"


async def test_confinement_refuses_every_escape(root: Path, tool: ApplyPatchTool) -> None:
    """'..', absolute, symlinked-folder and Move-to escapes are refused and nothing is written."""
    (root / "door").symlink_to(root.parent, target_is_directory=True)
    outside = str(root.parent / "outside.txt")
    for lines in [
        ("*** Update File: ../outside.txt", "-outside", "+pwned"),
        (f"*** Delete File: {outside}",),
        ("*** Add File: door/new.txt", "+pwned"),
        ("*** Update File: notes.txt", "*** Move to: ../moved.txt", "-beta", "+b"),
    ]:
        output = await refused(root, tool, patch("*** Add File: ok.txt", "+1", *lines))
        assert "workspace root" in output, lines


async def test_a_failed_write_restores_what_was_written(
    root: Path, tool: ApplyPatchTool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the disk fails mid-commit, files already written get their old bytes back."""
    before = snapshot(root.parent)
    real_write = write_regular
    calls: list[Path] = []

    def flaky_write(path: Path, data: bytes, shown: str, *, within: Path | None) -> None:
        calls.append(path)
        if path.name == "notes.txt" and len(calls) < 4:
            raise OSError(28, "No space left on device")
        real_write(path, data, shown, within=within)

    monkeypatch.setattr(apply_patch, "write_regular", flaky_write)
    result = await tool.execute(
        {
            "patchText": patch(
                "*** Add File: a-new.txt",
                "+new",
                "*** Update File: src/app.py",
                "-import os",
                "+import sys",
                "*** Update File: notes.txt",
                "-beta",
                "+b",
            )
        }
    )
    assert result.is_error
    assert "No space left on device" in result.output and "restored" in result.output
    assert len(calls) >= 3  # the two files before notes.txt were written, then restored
    assert snapshot(root.parent) == before


async def test_patch_text_is_required(tool: ApplyPatchTool) -> None:
    """A missing or non-string patchText is an error naming the field."""
    missing = await tool.execute({})
    assert missing.is_error and "'patchText' is required" in missing.output
    wrong = await tool.execute({"patchText": 1})
    assert wrong.is_error and "'patchText' must be a string" in wrong.output


def test_parse_patch_tolerates_surrounding_blank_lines_and_crlf() -> None:
    """Blank lines around the envelope and CRLF line ends parse the same."""
    ops = parse_patch("\n\n*** Begin Patch\r\n*** Delete File: a\r\n*** End Patch\r\n\n")
    assert len(ops) == 1
    with pytest.raises(PatchError):
        parse_patch("")
