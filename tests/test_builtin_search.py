"""The grep and glob built-ins: output shape, filters, limits, skips and confinement."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolnexus_async.tools.builtin._workspace import Workspace
from toolnexus_async.tools.builtin.search import GlobMatcher, GlobTool, GrepTool


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A small project: sources, docs, a binary, a .git folder and a secret outside."""
    root = tmp_path / "ws"
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "docs").mkdir()
    (root / ".git").mkdir()
    (root / "src" / "main.py").write_text("import os\n\ndef main():\n    return TODO\n")
    (root / "src" / "pkg" / "util.py").write_text("# TODO: tidy\nx = 1\n")
    (root / "src" / "pkg" / "data.json").write_text('{"TODO": true}\n')
    (root / "docs" / "README.md").write_text("TODO write docs\n")
    (root / "README.md").write_text("top\n")
    (root / "image.bin").write_bytes(b"TODO\0\0\0binary")
    (root / ".git" / "config").write_text("TODO in git\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.py").write_text("TODO secret\n")
    return root


@pytest.fixture
def ws(root: Path) -> Workspace:
    return Workspace(root, confine=True)


# --- grep -------------------------------------------------------------------------------


async def test_grep_gives_file_line_text(ws: Workspace) -> None:
    """Each match is 'path:line:text', relative to the root; binary files and .git are skipped."""
    result = await GrepTool(ws).execute({"pattern": r"TODO"})
    assert not result.is_error
    assert result.output.splitlines() == [
        "docs/README.md:1:TODO write docs",
        "src/main.py:4:    return TODO",
        'src/pkg/data.json:1:{"TODO": true}',
        "src/pkg/util.py:1:# TODO: tidy",
    ]
    assert result.metadata == {"matches": 4, "truncated": False}


async def test_grep_regex_path_and_include(ws: Workspace) -> None:
    """'path' narrows to a folder or one file; 'include' filters by name or by path glob."""
    in_pkg = await GrepTool(ws).execute({"pattern": "TODO", "path": "src/pkg"})
    assert [line.split(":")[0] for line in in_pkg.output.splitlines()] == [
        "src/pkg/data.json",
        "src/pkg/util.py",
    ]
    one_file = await GrepTool(ws).execute({"pattern": r"^def \w+\(", "path": "src/main.py"})
    assert one_file.output == "src/main.py:3:def main():"
    by_name = await GrepTool(ws).execute({"pattern": "TODO", "include": "*.py"})
    assert [line.split(":")[0] for line in by_name.output.splitlines()] == [
        "src/main.py",
        "src/pkg/util.py",
    ]
    by_path = await GrepTool(ws).execute({"pattern": "TODO", "include": "src/*/*.{json,py}"})
    assert [line.split(":")[0] for line in by_path.output.splitlines()] == [
        "src/pkg/data.json",
        "src/pkg/util.py",
    ]


async def test_grep_limit(root: Path, ws: Workspace) -> None:
    """At most 'limit' matches (default 100) come back, and the cut is announced."""
    (root / "many.txt").write_text("hit\n" * 150)
    default = await GrepTool(ws).execute({"pattern": "hit"})
    assert sum(1 for line in default.output.splitlines() if ":hit" in line) == 100
    assert "stopped after 100 matches" in default.output
    two = await GrepTool(ws).execute({"pattern": "hit", "limit": 2})
    assert two.output.splitlines()[:2] == ["many.txt:1:hit", "many.txt:2:hit"]
    assert two.metadata is not None and two.metadata["truncated"] is True


async def test_grep_no_match_is_not_an_error(ws: Workspace) -> None:
    """Finding nothing is an answer, not a failure."""
    result = await GrepTool(ws).execute({"pattern": "absent-word"})
    assert not result.is_error
    assert "no matches" in result.output


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({"pattern": "("}, "invalid regular expression"),
        ({}, "'pattern' is required"),
        ({"pattern": "x", "limit": 0}, "'limit' must be at least 1"),
        ({"pattern": "x", "include": 3}, "'include' must be a string"),
        ({"pattern": "x", "include": "../*.py"}, "'include' must be relative"),
        ({"pattern": "x", "path": "nowhere"}, "does not exist"),
    ],
)
async def test_grep_errors(ws: Workspace, args: dict[str, object], expected: str) -> None:
    """Bad arguments, an invalid regex and a missing path are error results."""
    result = await GrepTool(ws).execute(args)
    assert result.is_error
    assert expected in result.output


async def test_grep_confinement(root: Path, ws: Workspace) -> None:
    """A path outside is refused; a symlink out inside the tree is skipped, not read."""
    for path in ("..", "../outside", str(root.parent / "outside")):
        result = await GrepTool(ws).execute({"pattern": "TODO", "path": path})
        assert result.is_error and "workspace root" in result.output, path
    (root / "leak.py").symlink_to(root.parent / "outside" / "secret.py")
    (root / "door").symlink_to(root.parent / "outside", target_is_directory=True)
    result = await GrepTool(ws).execute({"pattern": "TODO s"})
    assert "leak.py" not in result.output and "door" not in result.output
    assert "no matches" in result.output


async def test_grep_follows_inside_symlinked_files_when_confined(root: Path, ws: Workspace) -> None:
    """A symlinked file that stays inside the root is searched like any file."""
    (root / "alias.py").symlink_to(root / "src" / "main.py")
    result = await GrepTool(ws).execute({"pattern": "import os"})
    assert result.output.splitlines() == ["alias.py:1:import os", "src/main.py:1:import os"]


# --- glob -------------------------------------------------------------------------------


async def test_glob_lists_sorted_relative_paths(ws: Workspace) -> None:
    """'**/*.py' matches at every depth; results are sorted and relative to the root."""
    result = await GlobTool(ws).execute({"pattern": "**/*.py"})
    assert result.output.splitlines() == ["src/main.py", "src/pkg/util.py"]


async def test_glob_name_patterns_match_at_any_depth(ws: Workspace) -> None:
    """A pattern without '/' matches the file name anywhere; .git is never listed."""
    result = await GlobTool(ws).execute({"pattern": "*.md"})
    assert result.output.splitlines() == ["README.md", "docs/README.md"]
    config = await GlobTool(ws).execute({"pattern": "config"})
    assert "no files match" in config.output


async def test_glob_path_patterns_are_anchored(ws: Workspace) -> None:
    """A pattern with '/' matches the whole path: 'src/*.py' does not reach src/pkg."""
    result = await GlobTool(ws).execute({"pattern": "src/*.py"})
    assert result.output == "src/main.py"


async def test_glob_relative_to_path_but_shown_from_root(ws: Workspace) -> None:
    """The pattern applies below 'path'; the output stays relative to the root."""
    result = await GlobTool(ws).execute({"pattern": "*.{py,json}", "path": "src/pkg"})
    assert result.output.splitlines() == ["src/pkg/data.json", "src/pkg/util.py"]


async def test_glob_limit(root: Path, ws: Workspace) -> None:
    """At most 'limit' paths (default 100), the first in sorted order, and a note."""
    (root / "many").mkdir()
    for i in range(120):
        (root / "many" / f"f{i:03}.txt").write_text("")
    default = await GlobTool(ws).execute({"pattern": "many/*.txt"})
    listed = [line for line in default.output.splitlines() if line.startswith("many/")]
    assert listed == [f"many/f{i:03}.txt" for i in range(100)]
    assert "20 more not shown" in default.output
    three = await GlobTool(ws).execute({"pattern": "many/*.txt", "limit": 3})
    assert three.output.splitlines()[:3] == ["many/f000.txt", "many/f001.txt", "many/f002.txt"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({}, "'pattern' is required"),
        ({"pattern": "/etc/*"}, "'pattern' must be relative"),
        ({"pattern": "../*"}, "'pattern' must be relative"),
        ({"pattern": "*", "limit": -1}, "'limit' must be at least 1"),
        ({"pattern": "*", "path": "README.md"}, "is not a directory"),
        ({"pattern": "*", "path": "nowhere"}, "does not exist"),
        ({"pattern": "*", "path": ".."}, "workspace root"),
        ({"pattern": "*", "path": "/"}, "workspace root"),
    ],
)
async def test_glob_errors(ws: Workspace, args: dict[str, object], expected: str) -> None:
    """Bad patterns, paths outside the root and non-directories are error results."""
    result = await GlobTool(ws).execute(args)
    assert result.is_error
    assert expected in result.output


async def test_glob_does_not_enter_a_symlinked_directory(root: Path, ws: Workspace) -> None:
    """A symlinked folder leading out is not walked, so nothing outside is listed."""
    (root / "door").symlink_to(root.parent / "outside", target_is_directory=True)
    result = await GlobTool(ws).execute({"pattern": "**/secret.py"})
    assert "no files match" in result.output


@pytest.mark.parametrize(
    ("pattern", "yes", "no"),
    [
        ("*.py", ["a.py", "x/y/a.py"], ["a.pyc", "a.py/b"]),
        ("**/*.py", ["a.py", "x/a.py", "x/y/a.py"], ["a.txt"]),
        ("src/**", ["src/a", "src/x/y"], ["a/src/b"]),
        ("a/**/b.txt", ["a/b.txt", "a/x/b.txt", "a/x/y/b.txt"], ["b.txt", "ab.txt"]),
        ("?.md", ["a.md"], ["ab.md"]),
        ("[ab].txt", ["a.txt", "b.txt"], ["c.txt"]),
        ("[!ab].txt", ["c.txt"], ["a.txt"]),
        ("*.{ts,tsx}", ["a.ts", "a.tsx"], ["a.t", "a.js"]),
        ("{src,lib}/*.c", ["src/a.c", "lib/b.c"], ["doc/a.c"]),
        ("a+b(1).txt", ["a+b(1).txt"], ["aab1.txt"]),
        ("[x", ["[x"], ["x"]),
        ("[[]x", ["[x"], ["x"]),  # Python's re warned of a nested set here
    ],
)
def test_glob_matcher(pattern: str, yes: list[str], no: list[str]) -> None:
    """The glob dialect: segments, '**', classes, braces, literal regex characters."""
    matcher = GlobMatcher(pattern)
    for path in yes:
        assert matcher.match(path), (pattern, path)
    for path in no:
        assert not matcher.match(path), (pattern, path)
