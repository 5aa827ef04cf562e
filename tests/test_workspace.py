"""Workspace confinement: what resolves, what is refused and how; the argument helpers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from toolnexus_async import Tool, Toolkit
from toolnexus_async._core.errors import ToolnexusError
from toolnexus_async.tools.builtin._workspace import (
    ArgumentError,
    ConfinementError,
    Workspace,
    optional_bool,
    optional_int,
    optional_str,
    required_str,
)
from toolnexus_async.tools.builtin.apply_patch import ApplyPatchTool
from toolnexus_async.tools.builtin.bash import BashTool
from toolnexus_async.tools.builtin.files import EditTool, ReadTool, WriteTool
from toolnexus_async.tools.builtin.search import GlobTool, GrepTool
from toolnexus_async.tools.builtin.todowrite import TodoWriteTool


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A workspace root with a sibling directory outside it."""
    (tmp_path / "ws" / "sub").mkdir(parents=True)
    (tmp_path / "ws" / "sub" / "a.txt").write_text("a")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("secret")
    return tmp_path / "ws"


def refused(ws: Workspace, path: str) -> ConfinementError:
    with pytest.raises(ConfinementError) as info:
        ws.resolve(path)
    return info.value


def test_relative_paths_resolve_under_the_root(root: Path) -> None:
    """A relative path is taken relative to the root, and '..' inside the root is fine."""
    ws = Workspace(root, confine=True)
    assert ws.resolve("sub/a.txt") == root / "sub" / "a.txt"
    assert ws.resolve("sub/../sub/./a.txt") == root / "sub" / "a.txt"
    assert ws.resolve("new/file.txt") == root / "new" / "file.txt"
    assert ws.resolve(".") == root


def test_dotdot_escape_is_refused_naming_path_and_root(root: Path) -> None:
    """'..' out of the root raises ConfinementError whose message names both."""
    err = refused(Workspace(root, confine=True), "../outside/secret.txt")
    assert "../outside/secret.txt" in str(err)
    assert str(root) in str(err)
    assert "climbs out" in str(err)
    assert err.path == "../outside/secret.txt"
    assert err.root == root


def test_a_sibling_sharing_the_root_prefix_is_outside(root: Path) -> None:
    """'/x/ws2' is not inside '/x/ws': containment is by path component, not string prefix."""
    (root.parent / "ws2").mkdir()
    refused(Workspace(root, confine=True), "../ws2/f.txt")
    refused(Workspace(root, confine=True), str(root.parent / "ws2" / "f.txt"))


def test_absolute_paths_inside_are_accepted_outside_refused(root: Path) -> None:
    """An absolute path counts where it points: inside is fine, outside is refused."""
    ws = Workspace(root, confine=True)
    assert ws.resolve(str(root / "sub" / "a.txt")) == root / "sub" / "a.txt"
    err = refused(ws, "/etc/passwd")
    assert "absolute path outside" in str(err)


def test_a_symlinked_file_leading_out_is_refused(root: Path) -> None:
    """A symlink as the last component that points outside is refused."""
    (root / "link.txt").symlink_to(root.parent / "outside" / "secret.txt")
    err = refused(Workspace(root, confine=True), "link.txt")
    assert "symlink" in str(err)


def test_a_symlinked_directory_leading_out_is_refused_even_for_new_files(root: Path) -> None:
    """Existing and not-yet-existing files under a symlinked directory pointing out are refused."""
    (root / "door").symlink_to(root.parent / "outside", target_is_directory=True)
    ws = Workspace(root, confine=True)
    refused(ws, "door/secret.txt")
    refused(ws, "door/new/deeper.txt")
    refused(ws, "door")


def test_a_dangling_symlink_leading_out_is_refused(root: Path) -> None:
    """A link to a file that does not exist yet outside would let a write create it there."""
    (root / "trap").symlink_to(root.parent / "outside" / "not-yet.txt")
    refused(Workspace(root, confine=True), "trap")


def test_symlinks_that_stay_inside_are_followed(root: Path) -> None:
    """A symlink to somewhere inside the root resolves to its target."""
    (root / "alias").symlink_to(root / "sub", target_is_directory=True)
    assert Workspace(root, confine=True).resolve("alias/a.txt") == root / "sub" / "a.txt"


def test_unconfined_workspace_allows_escapes(root: Path) -> None:
    """With confine=False every path resolves, outside ones included."""
    ws = Workspace(root, confine=False)
    assert ws.resolve("../outside/secret.txt") == root.parent / "outside" / "secret.txt"


def test_root_is_stored_absolute_and_resolved(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative or symlinked root is stored as its real absolute path."""
    (root.parent / "root-link").symlink_to(root, target_is_directory=True)
    assert Workspace(root.parent / "root-link").root == root
    monkeypatch.chdir(root.parent)
    assert Workspace("ws").root == root
    # Reached through the link, a path inside is still inside.
    ws = Workspace(root.parent / "root-link", confine=True)
    assert ws.resolve(str(root.parent / "root-link" / "sub")) == root / "sub"


def test_default_workspace_is_the_confined_cwd(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Workspace() is the current directory, confined, as Toolkit.create's default is."""
    monkeypatch.chdir(root)
    ws = Workspace()
    assert ws.root == root
    assert ws.confine is True
    assert Workspace(root).confine is True
    refused(ws, "../outside/secret.txt")


def test_confinement_error_is_a_value_error_of_the_package() -> None:
    """Callers may catch it as ValueError or as the package's base error."""
    assert issubclass(ConfinementError, ValueError)
    assert issubclass(ConfinementError, ToolnexusError)


def test_empty_and_nul_paths_are_value_errors(root: Path) -> None:
    """An empty path or one with a NUL byte is refused before touching the disk."""
    ws = Workspace(root, confine=True)
    with pytest.raises(ValueError, match="empty"):
        ws.resolve("")
    with pytest.raises(ValueError, match="NUL"):
        ws.resolve("a\0b")


def test_resolve_dir(root: Path) -> None:
    """resolve_dir: None is the root; missing, file and escaping directories are refused."""
    ws = Workspace(root, confine=True)
    assert ws.resolve_dir(None) == root
    assert ws.resolve_dir("") == root
    assert ws.resolve_dir("sub") == root / "sub"
    with pytest.raises(ValueError, match="does not exist"):
        ws.resolve_dir("nope")
    with pytest.raises(ValueError, match="not a directory"):
        ws.resolve_dir("sub/a.txt")
    with pytest.raises(ConfinementError):
        ws.resolve_dir("..")


def test_display_is_relative_inside_and_absolute_outside(root: Path) -> None:
    """The model sees short relative paths for files in the workspace."""
    ws = Workspace(root)
    assert ws.display(root / "sub" / "a.txt") == "sub/a.txt"
    assert ws.display(root) == "."
    assert ws.display(Path("/etc/hosts")) == "/etc/hosts"


def test_argument_helpers_name_the_field() -> None:
    """Every helper's error names the offending field and what was wrong."""
    with pytest.raises(ArgumentError, match="'path' is required"):
        required_str({}, "path")
    with pytest.raises(ArgumentError, match="'path' must be a string, got int"):
        required_str({"path": 3}, "path")
    with pytest.raises(ArgumentError, match="'path' must not be empty"):
        required_str({"path": ""}, "path")
    assert required_str({"c": ""}, "c", allow_empty=True) == ""
    with pytest.raises(ArgumentError, match="JSON object"):
        required_str(["path"], "path")
    assert optional_str({}, "w") is None
    assert optional_str({"w": ""}, "w") is None
    with pytest.raises(ArgumentError, match="'w' must be a string"):
        optional_str({"w": 1}, "w")
    assert optional_int({}, "n", 7) == 7
    assert optional_int({"n": 3.0}, "n", 7) == 3
    with pytest.raises(ArgumentError, match="'n' must be an integer, got bool"):
        optional_int({"n": True}, "n", 7)
    with pytest.raises(ArgumentError, match="'n' must be an integer, got str"):
        optional_int({"n": "3"}, "n", 7)
    with pytest.raises(ArgumentError, match="'n' must be at least 1, got 0"):
        optional_int({"n": 0}, "n", 7)
    assert optional_bool({}, "b", False) is False
    with pytest.raises(ArgumentError, match="'b' must be true or false"):
        optional_bool({"b": "yes"}, "b", False)


def test_every_tool_of_the_set_is_a_builtin_tool(tmp_path: Path) -> None:
    """Each class fits the Tool protocol, registers in a Toolkit and has a sound schema."""
    ws = Workspace(tmp_path, confine=True)
    tools: list[Tool] = [
        BashTool(ws),
        ReadTool(ws),
        WriteTool(ws),
        EditTool(ws),
        GrepTool(ws),
        GlobTool(ws),
        ApplyPatchTool(ws),
        TodoWriteTool(),
    ]
    toolkit = Toolkit(tools)
    expected = ["bash", "read", "write", "edit", "grep", "glob", "apply_patch", "todowrite"]
    assert [t.name for t in toolkit.tools()] == expected
    for tool in tools:
        assert isinstance(tool, Tool)
        assert tool.source == "builtin"
        schema = tool.input_schema
        assert schema["type"] == "object"
        assert set(schema["required"]) <= set(schema["properties"])


async def test_tools_with_a_workspace_default_to_the_cwd(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file tool built without a workspace works in the current directory, confined."""
    monkeypatch.chdir(root)
    tool = ReadTool()
    assert tool.workspace.root == root
    result = await tool.execute({"path": "sub/a.txt"})
    assert result.output == "     1\ta"
    outside = await tool.execute({"path": os.path.join("..", "outside", "secret.txt")})
    assert outside.is_error and "climbs out of the workspace root" in outside.output
    assert "secret" not in outside.output.replace("secret.txt", "")
    unconfined = ReadTool(Workspace(confine=False))
    escaped = await unconfined.execute({"path": os.path.join("..", "outside", "secret.txt")})
    assert escaped.output == "     1\tsecret"
