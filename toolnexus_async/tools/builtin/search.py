"""The ``grep`` and ``glob`` built-ins: find files by content and by name.

Rules of this module:

- Both walk the tree in a worker thread, in a fixed (name-sorted) order, and check for
  cancellation at every entry, so a call cancelled through an anyio cancel scope stops
  promptly instead of finishing the walk.
- The walk never follows a symlinked directory (no loops, no escapes) and skips version
  control directories (``.git``, ``.hg``, ``.svn``). Under confinement a symlinked file that
  leads out of the root is skipped as if absent, and each directory is opened and listed
  through the workspace's root descriptor (:mod:`._beneath`): one swapped for a symlink
  after its parent was listed is skipped, never listed through the link.
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
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple, Protocol, cast

import anyio
import anyio.from_thread
import re2

from ..._types import ToolContext, ToolResult
from ._beneath import SUPPORTED, open_beneath
from ._regular import BINARY_PROBE, SpecialFileError, is_binary, open_regular
from ._workspace import (
    ArgumentError,
    ConfinementError,
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


class _Compiled(Protocol):
    """The part of a compiled ``re2`` pattern used here (google-re2 ships no types)."""

    def search(self, text: bytes, pos: int = ...) -> _Span | None: ...

    def fullmatch(self, text: bytes) -> _Span | None: ...


class _Span(Protocol):
    def start(self) -> int: ...


def _re2_compile(regex: str, *, within_lines: bool = False) -> _Compiled:
    """RE2 with what both tools want: no capture bookkeeping, no log lines on stderr.

    ``within_lines`` (RE2's ``never_nl``) keeps every match inside one line, so grep can
    search a block of lines in one call and still match line by line.
    """
    options = re2.Options()
    options.never_capture = True
    options.log_errors = False
    options.never_nl = within_lines
    return cast(_Compiled, re2.compile(regex, options))


def _re2_message(exc: Exception) -> str:
    # google-re2 raises its error with RE2's message as bytes.
    message = exc.args[0] if exc.args else exc
    return message.decode("utf-8", "replace") if isinstance(message, bytes) else str(message)


def _utf8(text: str) -> bytes:
    """``text`` as UTF-8 for RE2, which matches no character at an invalid byte: a name
    that is not UTF-8 (its bytes kept as surrogates by ``os.fsdecode``) has U+FFFD there,
    one character for ``?`` and ``*`` as it was for Python's ``re``."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raw = text.encode("utf-8", "surrogateescape")
        return raw.decode("utf-8", "replace").encode("utf-8")


def _class(body: str, negated: bool) -> str:
    """A glob class as an RE2 class: every member escaped, ``a-z`` kept as a range."""
    out: list[str] = ["[^/" if negated else "["]
    i = 0
    while i < len(body):
        if i + 2 < len(body) and body[i + 1] == "-":
            out.append(f"{re2.escape(body[i])}-{re2.escape(body[i + 2])}")
            i += 3
        else:
            out.append(re2.escape(body[i]))
            i += 1
    out.append("]")
    return "".join(out)


def _braces(pattern: str, classes: dict[int, int]) -> dict[int, int]:
    """Each ``{`` that has a closing ``}`` mapped to it, braces in a class not counted.

    One pass with a stack, so a pattern of many or deeply nested braces costs its length.
    """
    pairs: dict[int, int] = {}
    opened: list[int] = []
    i = 0
    while i < len(pattern):
        if i in classes:
            i = classes[i] + 1
            continue
        if pattern[i] == "{":
            opened.append(i)
        elif pattern[i] == "}" and opened:
            pairs[opened.pop()] = i
        i += 1
    return pairs


def _classes(pattern: str) -> dict[int, int]:
    """Each ``[`` that opens a class mapped to its closing ``]``."""
    spans: dict[int, int] = {}
    i = 0
    while i < len(pattern):
        if pattern[i] != "[":
            i += 1
            continue
        end = i + 1
        if end < len(pattern) and pattern[end] in "!^":
            end += 1
        if end < len(pattern) and pattern[end] == "]":
            end += 1  # a ']' first in a class is a member, not the end
        end = pattern.find("]", end)
        if end < 0:
            break  # no class can close after this: the rest holds literal '['
        spans[i] = end
        i = end + 1
    return spans


def _translate(pattern: str) -> str:
    """The glob as an RE2 expression. RE2 runs in time linear in the path, so nesting
    wildcards and alternatives here costs nothing at match time (Python's ``re`` took
    seconds to backtrack through ``*a*a*a*a*a*a*a*a*a*a*b``)."""
    classes = _classes(pattern)
    braces = _braces(pattern, classes)
    closing = set(braces.values())
    open_braces = 0
    out: list[str] = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if i in classes:
            end = classes[i]
            body = pattern[i + 1 : end]
            negated = body[:1] in ("!", "^")
            out.append(_class(body[1:] if negated else body, negated))
            i = end + 1
            continue
        if pattern.startswith("**/", i):
            out.append("(?:[^/]*/)*")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "{" and i in braces:
            out.append("(?:")
            open_braces += 1
        elif char == "}" and i in closing:
            out.append(")")
            open_braces -= 1
        elif char == "," and open_braces:
            out.append("|")
        else:
            out.append(re2.escape(char))
        i += 1
    return "".join(out)


class GlobMatcher:
    """Matches ``/``-separated relative paths against one glob pattern (see module rules).

    Raises :class:`ArgumentError` for a pattern RE2 cannot take (a class range such as
    ``[z-a]``, or a pattern too large to compile).
    """

    def __init__(self, pattern: str) -> None:
        pattern = pattern.removeprefix("./")
        self.pattern = pattern
        self._whole_path = "/" in pattern
        try:
            self._regex = _re2_compile("(?s)" + _translate(pattern))
        except re2.error as exc:
            raise ArgumentError(f"invalid glob {pattern!r}: {_re2_message(exc)}") from None

    def match(self, relative: str) -> bool:
        subject = relative if self._whole_path else relative.rpartition("/")[2]
        return self._regex.fullmatch(_utf8(subject)) is not None


def _check_pattern(pattern: str, field: str) -> None:
    if pattern.startswith("/") or ".." in pattern.split("/"):
        raise ArgumentError(
            f"'{field}' must be relative and must not contain '..' (got {pattern!r}); "
            "choose the directory with 'path'"
        )


class _Entry(NamedTuple):
    """What the walk needs of a directory entry, taken while its listing is open: a listing
    of a descriptor answers ``is_file()`` through that descriptor, closed with it."""

    name: str
    is_dir: bool
    is_link: bool
    is_file: bool


def _list(workspace: Workspace, directory: Path) -> list[_Entry]:
    """The entries of ``directory`` in name order; OSError if it cannot be listed."""
    within = workspace.within
    if within is None or not SUPPORTED:
        with os.scandir(directory) as scan:
            entries = [_entry(entry) for entry in scan]
    else:
        fd = open_beneath(
            within,
            directory.relative_to(within),
            os.O_RDONLY | os.O_DIRECTORY,
            workspace.display(directory),
            follow_last=False,
        )
        try:
            with os.scandir(fd) as scan:
                entries = [_entry(entry) for entry in scan]
        finally:
            os.close(fd)
    return sorted(entries, key=lambda entry: entry.name)


def _entry(entry: os.DirEntry[str]) -> _Entry:
    return _Entry(
        entry.name,
        entry.is_dir(follow_symlinks=False),
        entry.is_symlink(),
        entry.is_file(follow_symlinks=False),
    )


def _files(workspace: Workspace, base: Path) -> Iterator[Path]:
    """Every regular file under ``base`` (``base`` itself when it is a file), in walk order."""
    if not workspace.is_dir(base):
        yield base
        return
    stack = [base]
    while stack:
        anyio.from_thread.check_cancelled()
        directory = stack.pop()
        try:
            entries = _list(workspace, directory)
        except (OSError, ValueError):
            continue  # unreadable, vanished or swapped: a search shows what it can reach
        subdirs: list[Path] = []
        for entry in entries:
            anyio.from_thread.check_cancelled()
            path = directory / entry.name
            if entry.is_dir:
                if entry.name not in _SKIP_DIRS:
                    subdirs.append(path)
                continue
            if entry.is_link:
                try:
                    # Followed through the workspace: ConfinementError when it leads out.
                    if not stat.S_ISREG(workspace.stat(path).st_mode):
                        continue  # a directory (never followed), a FIFO, a device
                except (OSError, ValueError):
                    continue  # dangling, or leading out
            elif not entry.is_file:
                continue  # sockets, FIFOs, devices
            yield path
        stack.extend(reversed(subdirs))


def _base(workspace: Workspace, path: str | None) -> Path:
    base = workspace.resolve(path) if path else workspace.root
    if not workspace.exists(base):
        raise ValueError(f"path {path!r} does not exist")
    return base


# RE2's messages for what it parses but leaves out by design; anything else is a plain error.
_UNSUPPORTED = ("invalid perl operator", "invalid escape sequence", "bad repetition operator")
_UNSUPPORTED_HINT = (
    "grep uses RE2, which runs in time linear in the text and so has no backreferences "
    "(\\1, (?P=name)), lookahead or lookbehind ((?=, (?!, (?<=, (?<!), atomic groups "
    "(?>...), possessive quantifiers (a*+), conditionals, comments (?#...) or verbose mode (?x)"
)
_LINE_ANCHORS = {"\\A": "^", "\\Z": "$", "\\z": "$"}
# Blocks of whole lines go to RE2 in one call each: one call per line cost more in
# Python than the search itself.
_BLOCK = 1024 * 1024


def _line_anchors(pattern: str) -> str:
    r"""``\A``, ``\Z`` and ``\z`` as ``^`` and ``$``: each line is searched as if on its
    own, so the start and end of the text are the line's (RE2 has no ``\Z`` at all)."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        pair = pattern[i : i + 2]
        if pattern[i] == "\\" and len(pair) == 2:
            out.append(_LINE_ANCHORS.get(pair, pair))
            i += 2
        else:
            out.append(pattern[i])
            i += 1
    return "".join(out)


def _grep_regex(pattern: str) -> _Compiled | str:
    """The compiled pattern, or why it cannot be used."""
    anchored = _line_anchors(pattern)
    try:
        _re2_compile(anchored)  # for a message that quotes the pattern without our (?m)
        return _re2_compile("(?m)" + anchored, within_lines=True)
    except re2.error as exc:
        message = _re2_message(exc)
    if message.startswith(_UNSUPPORTED):
        return (
            f"the regular expression {pattern!r} uses a construct RE2 does not support "
            f"({message}); {_UNSUPPORTED_HINT}"
        )
    return f"invalid regular expression {pattern!r}: {message}"


def _blocks(stream: BinaryIO) -> Iterator[bytes]:
    """The rest of ``stream`` in blocks that end at a line end (a longer line is one block)."""
    parts: list[bytes] = []
    while chunk := stream.read(_BLOCK):
        anyio.from_thread.check_cancelled()
        cut = chunk.rfind(b"\n") + 1
        if not cut:
            parts.append(chunk)
            continue
        parts.append(chunk[:cut])
        yield b"".join(parts)
        parts = [chunk[cut:]]
    if any(parts):
        yield b"".join(parts)


def _valid_utf8(block: bytes) -> bytes:
    """The block with each invalid byte as U+FFFD: RE2 matches no character at an invalid
    byte, where Python's ``re`` on the decoded line matched the replacement character."""
    try:
        block.decode("utf-8")
    except UnicodeDecodeError:
        return block.decode("utf-8", "replace").encode("utf-8")
    return block


def _matching_lines(regex: _Compiled, text: bytes) -> Iterator[tuple[int, bytes]]:
    """(line index in ``text``, line) of each line with a match, in order."""
    counted = index = pos = 0
    while True:
        match = regex.search(text, pos)
        if match is None:
            return
        at = match.start()
        if at == len(text) and (not text or text.endswith(b"\n")):
            return  # an empty match after the last line end is not on a line
        start = text.rfind(b"\n", 0, at) + 1
        end = text.find(b"\n", at)
        end = len(text) if end < 0 else end
        index += text.count(b"\n", counted, start)
        counted = start
        yield index, text[start:end]
        pos = end + 1
        if pos > len(text):
            return


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
