"""The ``grep`` and ``glob`` built-ins: find files by content and by name.

Rules of this module:

- Both walk the tree in a worker thread, in a fixed (name-sorted) order, and check for
  cancellation at every entry, so a call cancelled through an anyio cancel scope stops
  promptly instead of finishing the walk.
- The walk never follows a symlinked directory (no loops, no escapes) and skips version
  control directories (``.git``, ``.hg``, ``.svn``). Under confinement a symlinked file that
  leads out of the root is skipped as if absent.
- Only regular files are searched and listed: FIFOs, devices and sockets met on the walk are
  skipped, and ``grep`` opens every file through :mod:`._regular`, so one swapped in after
  the walk saw it is skipped too. ``grep`` given such a path itself says so.
- Paths are shown relative to the workspace root, with ``/`` separators.
- Glob patterns: ``*`` and ``?`` stay within one path segment, ``**`` crosses segments
  (``**/`` may match none), ``[abc]``/``[!abc]`` are classes and ``{a,b}`` alternatives. A
  pattern without ``/`` matches a file's name at any depth, as in ripgrep and .gitignore.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread

from ..._types import ToolContext, ToolResult
from ._regular import BINARY_PROBE, SpecialFileError, is_binary, open_regular
from ._workspace import (
    ArgumentError,
    Workspace,
    WorkspaceTool,
    optional_int,
    optional_str,
    required_str,
)

__all__ = ("DEFAULT_SEARCH_LIMIT", "GlobMatcher", "GlobTool", "GrepTool")

DEFAULT_SEARCH_LIMIT = 100
MAX_MATCH_CHARS = 500
_SKIP_DIRS = frozenset({".git", ".hg", ".svn"})


def _closing_brace(pattern: str, start: int) -> int:
    depth = 0
    for i in range(start, len(pattern)):
        if pattern[i] == "{":
            depth += 1
        elif pattern[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return -1


def _split_alternatives(body: str) -> list[str]:
    parts: list[str] = []
    depth = 0
    current = ""
    for char in body:
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        depth += {"{": 1, "}": -1}.get(char, 0)
        current += char
    parts.append(current)
    return parts


def _translate(pattern: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:[^/]*/)*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif char == "*":
            out.append("[^/]*")
            i += 1
        elif char == "?":
            out.append("[^/]")
            i += 1
        elif char == "[":
            end = i + 1
            if end < len(pattern) and pattern[end] in "!^":
                end += 1
            if end < len(pattern) and pattern[end] == "]":
                end += 1  # a ']' first in a class is a member, not the end
            end = pattern.find("]", end)
            if end < 0:
                out.append(re.escape(char))
                i += 1
                continue
            body = pattern[i + 1 : end].replace("\\", "\\\\")
            if body[0] in "!^":
                body = "^" + body[1:]
            out.append(f"[{body}]")
            i = end + 1
        elif char == "{" and (end := _closing_brace(pattern, i)) > 0:
            alternatives = _split_alternatives(pattern[i + 1 : end])
            out.append("(?:" + "|".join(_translate(a) for a in alternatives) + ")")
            i = end + 1
        else:
            out.append(re.escape(char))
            i += 1
    return "".join(out)


class GlobMatcher:
    """Matches ``/``-separated relative paths against one glob pattern (see module rules)."""

    def __init__(self, pattern: str) -> None:
        pattern = pattern.removeprefix("./")
        self.pattern = pattern
        self._whole_path = "/" in pattern
        self._regex = re.compile(_translate(pattern) + r"\Z", re.DOTALL)

    def match(self, relative: str) -> bool:
        subject = relative if self._whole_path else relative.rpartition("/")[2]
        return self._regex.match(subject) is not None


def _check_pattern(pattern: str, field: str) -> None:
    if pattern.startswith("/") or ".." in pattern.split("/"):
        raise ArgumentError(
            f"'{field}' must be relative and must not contain '..' (got {pattern!r}); "
            "choose the directory with 'path'"
        )


def _files(workspace: Workspace, base: Path) -> Iterator[Path]:
    """Every regular file under ``base`` (``base`` itself when it is a file), in walk order."""
    if not base.is_dir():
        yield base
        return
    stack = [base]
    while stack:
        anyio.from_thread.check_cancelled()
        directory = stack.pop()
        try:
            with os.scandir(directory) as scan:
                entries = sorted(scan, key=lambda entry: entry.name)
        except OSError:
            continue  # unreadable or vanished: a search shows what it can reach
        subdirs: list[Path] = []
        for entry in entries:
            anyio.from_thread.check_cancelled()
            try:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name not in _SKIP_DIRS:
                        subdirs.append(Path(entry.path))
                    continue
                if not entry.is_file():
                    continue  # sockets, FIFOs, devices, dangling links
                if entry.is_symlink() and workspace.confine:
                    workspace.resolve(entry.path)  # ConfinementError: it leads out
            except (OSError, ValueError):
                continue
            yield Path(entry.path)
        stack.extend(reversed(subdirs))


def _base(workspace: Workspace, path: str | None) -> Path:
    base = workspace.resolve(path) if path else workspace.root
    if not base.exists():
        raise ValueError(f"path {path!r} does not exist")
    return base


_GREP_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "pattern": {"type": "string", "description": "A Python regular expression."},
        "path": {
            "type": "string",
            "description": "File or directory to search (default: the workspace root).",
        },
        "include": {
            "type": "string",
            "description": "Only search files matching this glob, e.g. '*.py' or 'src/**/*.ts'.",
        },
        "limit": {
            "type": "integer",
            "minimum": 1,
            "description": f"At most this many matching lines (default {DEFAULT_SEARCH_LIMIT}).",
        },
    },
    "required": ["pattern"],
}


class GrepTool(WorkspaceTool):
    """Search file contents for a regular expression."""

    name = "grep"
    description = (
        "Search text files for lines matching a regular expression (Python syntax). Prints "
        "'file:line:text' per match, paths relative to the workspace root. Binary files and "
        ".git are skipped. Narrow with 'path' and 'include' (a glob such as '*.py')."
    )
    input_schema = _GREP_SCHEMA

    async def execute(self, args: dict[str, Any], ctx: ToolContext | None = None) -> ToolResult:
        try:
            pattern = required_str(args, "pattern")
            path = optional_str(args, "path")
            include = optional_str(args, "include")
            limit = optional_int(args, "limit", DEFAULT_SEARCH_LIMIT)
            if include is not None:
                _check_pattern(include, "include")
        except ArgumentError as exc:
            return ToolResult.error(f"grep: {exc}")
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            return ToolResult.error(f"grep: invalid regular expression {pattern!r}: {exc}")
        matcher = GlobMatcher(include) if include is not None else None
        return await anyio.to_thread.run_sync(self._grep, regex, path, matcher, limit)

    def _grep(
        self, regex: re.Pattern[str], path: str | None, include: GlobMatcher | None, limit: int
    ) -> ToolResult:
        try:
            base = _base(self.workspace, path)
        except ValueError as exc:
            return ToolResult.error(f"grep: {exc}")
        found: list[str] = []
        for file in _files(self.workspace, base):
            if include is not None and base != file:
                if not include.match(file.relative_to(base).as_posix()):
                    continue
            shown = self.workspace.display(file)
            try:
                with open_regular(file, shown) as stream:
                    if is_binary(stream.read(BINARY_PROBE)):
                        continue
                    stream.seek(0)
                    for number, raw in enumerate(stream, 1):
                        line = raw.decode("utf-8", "replace").rstrip("\r\n")
                        if regex.search(line):
                            found.append(f"{shown}:{number}:{line[:MAX_MATCH_CHARS]}")
                            if len(found) > limit:
                                break
            except SpecialFileError as exc:
                if file == base:
                    return ToolResult.error(f"grep: {exc}")
                continue  # swapped in after the walk looked: skipped like the others
            except OSError:
                continue  # unreadable: skipped like a binary file
            if len(found) > limit:
                break
        if not found:
            return ToolResult.ok(f"no matches for {regex.pattern!r}", {"matches": 0})
        more = len(found) > limit
        text = "\n".join(found[:limit])
        if more:
            text += f"\n\n(stopped after {limit} matches; narrow the search or raise 'limit')"
        return ToolResult.ok(text, {"matches": min(len(found), limit), "truncated": more})


_GLOB_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "pattern": {
            "type": "string",
            "description": "A glob such as '**/*.py' or 'src/*.{ts,tsx}'.",
        },
        "path": {
            "type": "string",
            "description": "Directory to search in (default: the workspace root).",
        },
        "limit": {
            "type": "integer",
            "minimum": 1,
            "description": f"At most this many paths (default {DEFAULT_SEARCH_LIMIT}).",
        },
    },
    "required": ["pattern"],
}


class GlobTool(WorkspaceTool):
    """List files whose path matches a glob pattern."""

    name = "glob"
    description = (
        "List files matching a glob pattern ('**/*.py', 'src/*.{ts,tsx}'), sorted, relative "
        "to the workspace root. A pattern without '/' matches file names at any depth. The "
        "pattern is matched relative to 'path' (default: the workspace root)."
    )
    input_schema = _GLOB_SCHEMA

    async def execute(self, args: dict[str, Any], ctx: ToolContext | None = None) -> ToolResult:
        try:
            pattern = required_str(args, "pattern")
            path = optional_str(args, "path")
            limit = optional_int(args, "limit", DEFAULT_SEARCH_LIMIT)
            _check_pattern(pattern, "pattern")
        except ArgumentError as exc:
            return ToolResult.error(f"glob: {exc}")
        return await anyio.to_thread.run_sync(self._glob, GlobMatcher(pattern), path, limit)

    def _glob(self, matcher: GlobMatcher, path: str | None, limit: int) -> ToolResult:
        try:
            base = _base(self.workspace, path)
        except ValueError as exc:
            return ToolResult.error(f"glob: {exc}")
        if not base.is_dir():
            return ToolResult.error(f"glob: path {path!r} is not a directory")
        found = sorted(
            self.workspace.display(file)
            for file in _files(self.workspace, base)
            if matcher.match(file.relative_to(base).as_posix())
        )
        if not found:
            return ToolResult.ok(f"no files match {matcher.pattern!r}", {"count": 0})
        text = "\n".join(found[:limit])
        if len(found) > limit:
            text += f"\n\n({len(found) - limit} more not shown; narrow the pattern)"
        return ToolResult.ok(text, {"count": len(found), "truncated": len(found) > limit})
