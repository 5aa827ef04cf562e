"""The ``grep`` and ``glob`` built-ins: find files by content and by name.

Rules of this module:

- Both run in a worker thread over the walk of :mod:`._walk` (name-sorted, cancellable at
  every entry, no symlinked directories, no ``.git``/``.hg``/``.svn``, regular files only,
  confined beneath the workspace's root descriptor). Glob patterns (``glob``'s pattern and
  ``grep``'s ``include``) follow :mod:`._globbing` and must be relative, without ``..``;
  ``grep``'s regular expression and line matching follow :mod:`._lines`.
- ``grep`` opens every file through :mod:`._regular`, so a FIFO, device or socket swapped
  in after the walk saw it is skipped too. ``grep`` given such a path itself says so.
  Binary files are skipped; CRLF is searched as LF.
- Paths are shown relative to the workspace root, with ``/`` separators.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from ..._core.types import ToolContext, ToolResult
from ._globbing import GlobMatcher, _Compiled
from ._lines import _blocks, _grep_regex, _matching_lines, _valid_utf8
from ._regular import BINARY_PROBE, SpecialFileError, is_binary, open_regular
from ._walk import _base, _files
from ._workspace import (
    ArgumentError,
    ConfinementError,
    WorkspaceTool,
    optional_int,
    optional_str,
    required_str,
)

__all__ = ("DEFAULT_SEARCH_LIMIT", "GlobMatcher", "GlobTool", "GrepTool")

DEFAULT_SEARCH_LIMIT = 100
MAX_MATCH_CHARS = 500


def _check_pattern(pattern: str, field: str) -> None:
    if pattern.startswith("/") or ".." in pattern.split("/"):
        raise ArgumentError(
            f"'{field}' must be relative and must not contain '..' (got {pattern!r}); "
            "choose the directory with 'path'"
        )


_GREP_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "pattern": {
            "type": "string",
            "description": "A regular expression in RE2 syntax (Python's, less backreferences "
            "and lookaround).",
        },
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
        "Search text files for lines matching a regular expression (RE2 syntax: Python's "
        "without backreferences or lookaround; \\w, \\d, \\s and \\b are ASCII). Prints "
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
        # Compiling goes to the worker too: a large pattern is RE2's to build, not the loop's.
        return await anyio.to_thread.run_sync(self._grep, pattern, path, include, limit)

    def _grep(self, pattern: str, path: str | None, include: str | None, limit: int) -> ToolResult:
        regex = _grep_regex(pattern)
        if isinstance(regex, str):
            return ToolResult.error(f"grep: {regex}")
        try:
            matcher = GlobMatcher(include) if include is not None else None
            base = _base(self.workspace, path)
        except ValueError as exc:
            return ToolResult.error(f"grep: {exc}")
        found: list[str] = []
        for file in _files(self.workspace, base):
            if matcher is not None and base != file:
                if not matcher.match(file.relative_to(base).as_posix()):
                    continue
            shown = self.workspace.display(file)
            try:
                self._search(regex, file, shown, found, limit)
            except (SpecialFileError, ConfinementError) as exc:
                if file == base:
                    return ToolResult.error(f"grep: {exc}")
                continue  # swapped in after the walk looked: skipped like the others
            except OSError:
                continue  # unreadable: skipped like a binary file
            if len(found) > limit:
                break
        if not found:
            return ToolResult.ok(f"no matches for {pattern!r}", {"matches": 0})
        more = len(found) > limit
        text = "\n".join(found[:limit])
        if more:
            text += f"\n\n(stopped after {limit} matches; narrow the search or raise 'limit')"
        return ToolResult.ok(text, {"matches": min(len(found), limit), "truncated": more})

    def _search(
        self, regex: _Compiled, file: Path, shown: str, found: list[str], limit: int
    ) -> None:
        """Append ``file``'s matching lines to ``found`` until it holds ``limit + 1``."""
        with open_regular(file, shown, within=self.workspace.within) as stream:
            if is_binary(stream.read(BINARY_PROBE)):
                return
            stream.seek(0)
            first = 1  # the number of the block's first line
            for block in _blocks(stream):
                # CRLF as LF, so '$' matches before '\r\n' as it did on a stripped line
                text = _valid_utf8(block.replace(b"\r\n", b"\n"))
                for index, line in _matching_lines(regex, text):
                    shown_line = line.decode("utf-8")[:MAX_MATCH_CHARS]
                    found.append(f"{shown}:{first + index}:{shown_line}")
                    if len(found) > limit:
                        return
                first += text.count(b"\n")


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
        return await anyio.to_thread.run_sync(self._glob, pattern, path, limit)

    def _glob(self, pattern: str, path: str | None, limit: int) -> ToolResult:
        try:
            matcher = GlobMatcher(pattern)
            base = _base(self.workspace, path)
        except ValueError as exc:
            return ToolResult.error(f"glob: {exc}")
        if not self.workspace.is_dir(base):
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
