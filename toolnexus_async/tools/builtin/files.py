"""The ``read``, ``write`` and ``edit`` built-ins.

Rules of this module:

- Every path goes through the :class:`Workspace` (and so its confinement), every file is
  opened through :mod:`._regular` with the workspace's ``within`` (regular files only, and
  never through a symlink swapped in to lead out), and all file work runs in a worker
  thread, never on the event loop.
- Text means UTF-8. A file with a NUL byte in its first 8 KiB, or one that does not decode,
  is binary: it is refused, never shown garbled or rewritten.
- ``write`` and ``edit`` change files, so they ask first (:mod:`._approval`): the request
  shows the unified diff of the file before and after. The preview, the check that it is
  still what was approved, and the write happen in one go under :data:`MUTATION_LOCK`.
- ``edit`` changes a file only when the request is unambiguous; any error leaves it as it was.
- Mutations (``write``, ``edit``, ``apply_patch``) hold :data:`MUTATION_LOCK`: the calls of one
  model turn run concurrently, and two edits of one file must not interleave their
  read-modify-write.
"""

from __future__ import annotations

import errno
import io
import threading
from pathlib import Path
from typing import Any

import anyio

from ..._core.types import ToolContext, ToolResult
from ._approval import ActingTool, Decision, Preview, cut_for_prompt, digest_of, unified_diff
from ._regular import BINARY_PROBE, is_binary, open_regular, read_regular, write_regular
from ._workspace import ArgumentError, WorkspaceTool, optional_bool, optional_int, required_str

__all__ = (
    "BINARY_PROBE",
    "DEFAULT_READ_LIMIT",
    "MUTATION_LOCK",
    "EditTool",
    "NotTextError",
    "ReadTool",
    "WriteTool",
    "decode_text",
    "describe_os_error",
    "is_binary",
    "read_text",
)

DEFAULT_READ_LIMIT = 2000
MAX_LINE_CHARS = 2000

MUTATION_LOCK = threading.Lock()


class NotTextError(ValueError):
    """The file is binary or not UTF-8."""


def decode_text(data: bytes, shown: str) -> str:
    """``data`` as UTF-8 text; :class:`NotTextError` for binary content."""
    if is_binary(data):
        raise NotTextError(f"{shown} looks binary (it contains NUL bytes); refusing to use it")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NotTextError(f"{shown} is not UTF-8 text (bad byte at {exc.start})") from None


def read_text(path: Path, shown: str, *, within: Path | None = None) -> str:
    """The UTF-8 text of the regular file ``path``; :class:`NotTextError` for binary content,
    ``SpecialFileError`` for a FIFO, device or socket, else OSError."""
    return decode_text(read_regular(path, shown, within=within), shown)


def describe_os_error(exc: OSError, shown: str) -> str:
    """A one-line explanation of ``exc`` for the model, naming the path as it gave it."""
    if isinstance(exc, FileNotFoundError):
        return f"file not found: {shown}"
    if isinstance(exc, IsADirectoryError):
        return f"{shown} is a directory, not a file"
    if isinstance(exc, NotADirectoryError):
        return f"a parent of {shown} is not a directory"
    if isinstance(exc, PermissionError):
        return f"permission denied: {shown}"
    if exc.errno == errno.ENXIO:
        return f"{shown} is not a regular file (a FIFO or a socket?); refusing to use it"
    return f"{shown}: {exc.strerror or exc}"


def _fail(tool: str, exc: Exception, shown: str) -> ToolResult:
    if isinstance(exc, OSError):
        return ToolResult.error(f"{tool}: {describe_os_error(exc, shown)}")
    return ToolResult.error(f"{tool}: {exc}")


def _current(path: Path, shown: str, within: Path | None) -> bytes | None:
    """What ``path`` holds now, or None when there is no such file."""
    try:
        return read_regular(path, shown, within=within)
    except FileNotFoundError:
        return None


def _change_preview(
    tool: str, verb: str, path: Path, shown: str, before: bytes | None, after: bytes
) -> Preview:
    diff = unified_diff(before, after, shown, shown)
    return Preview(
        prompt=f"Allow {tool} to {verb} {shown}?\n\n{cut_for_prompt(diff)}".rstrip("\n"),
        details={"path": shown, "diff": diff},
        digest=digest_of(tool, str(path), before, after),
        subject=shown,
    )


_READ_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "description": "The file to read."},
        "offset": {
            "type": "integer",
            "minimum": 1,
            "description": "The 1-based line to start at (default 1).",
        },
        "limit": {
            "type": "integer",
            "minimum": 1,
            "description": f"How many lines to read (default {DEFAULT_READ_LIMIT}).",
        },
    },
    "required": ["path"],
}


class ReadTool(WorkspaceTool):
    """Read a text file, its lines numbered."""

    name = "read"
    description = (
        "Read a UTF-8 text file. Lines come numbered ('     1<TAB>text'); use 'offset' "
        f"(1-based) and 'limit' to page through long files (default {DEFAULT_READ_LIMIT} "
        f"lines). Lines over {MAX_LINE_CHARS} characters are cut."
    )
    input_schema = _READ_SCHEMA

    async def execute(self, args: dict[str, Any], ctx: ToolContext | None = None) -> ToolResult:
        try:
            path = required_str(args, "path")
            offset = optional_int(args, "offset", 1)
            limit = optional_int(args, "limit", DEFAULT_READ_LIMIT)
        except ArgumentError as exc:
            return ToolResult.error(f"read: {exc}")
        return await anyio.to_thread.run_sync(self._read, path, offset, limit)

    def _read(self, given: str, offset: int, limit: int) -> ToolResult:
        shown = given
        try:
            path = self.workspace.resolve(given)
            shown = self.workspace.display(path)
            lines: list[str] = []
            count = 0
            more = False
            # Streamed, so that reading the first lines of a huge log costs only those lines.
            with open_regular(path, shown, within=self.workspace.within) as raw:
                if is_binary(raw.read(BINARY_PROBE)):
                    return ToolResult.error(f"read: {shown} is a binary file; not shown")
                raw.seek(0)
                with io.TextIOWrapper(raw, encoding="utf-8") as stream:
                    for count, line in enumerate(stream, 1):
                        if count >= offset + limit:
                            more = True
                            break
                        if count >= offset:
                            text = _cut(line.rstrip("\n"))
                            lines.append(f"{count:>6}\t{text}")
        except IsADirectoryError:
            return ToolResult.error(f"read: {shown} is a directory; use glob to list it")
        except UnicodeDecodeError:
            return ToolResult.error(f"read: {shown} is not UTF-8 text (binary?); not shown")
        except (OSError, ValueError) as exc:
            return _fail("read", exc, given)
        if count == 0:
            return ToolResult.ok(f"({shown} is empty)")
        if not lines:
            return ToolResult.error(
                f"read: offset {offset} is past the end of {shown}, which has {count} lines"
            )
        last = offset + len(lines) - 1
        out = "\n".join(lines)
        if more:
            out += (
                f"\n\n(showing lines {offset}-{last}; the file goes on: "
                f"read again with offset={last + 1})"
            )
        return ToolResult.ok(out, {"path": shown, "truncated": more})


def _cut(line: str) -> str:
    if len(line) <= MAX_LINE_CHARS:
        return line
    return f"{line[:MAX_LINE_CHARS]}... [line cut: {len(line)} characters]"


_WRITE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "description": "The file to write; parents are created."},
        "content": {"type": "string", "description": "The whole new content of the file."},
    },
    "required": ["path", "content"],
}


class WriteTool(ActingTool):
    """Create or overwrite a file with the given content, once approved."""

    name = "write"
    description = (
        "Write 'content' to the file at 'path' (UTF-8), replacing what was there and "
        "creating missing parent folders. Prefer edit for changing part of a file."
    )
    input_schema = _WRITE_SCHEMA

    async def execute(self, args: dict[str, Any], ctx: ToolContext | None = None) -> ToolResult:
        try:
            path = required_str(args, "path")
            content = required_str(args, "content", allow_empty=True)
        except ArgumentError as exc:
            return ToolResult.error(f"write: {exc}")
        decision = self.approval.decide(self.name, args, ctx)
        if isinstance(decision, ToolResult):
            return decision
        return await anyio.to_thread.run_sync(self._write, args, path, content, decision)

    def _write(
        self, args: dict[str, Any], given: str, content: str, decision: Decision
    ) -> ToolResult:
        try:
            data = content.encode("utf-8")
            with MUTATION_LOCK:
                path = self.workspace.resolve(given)
                shown = self.workspace.display(path)
                within = self.workspace.within
                if self.workspace.is_dir(path):
                    return ToolResult.error(f"write: {shown} is a directory")
                if decision.needs_preview:
                    before = _current(path, shown, within)
                    existed = before is not None
                    verb = "overwrite" if existed else "create"
                    preview = _change_preview("write", verb, path, shown, before, data)
                    stop = decision.check(self.name, args, preview)
                    if stop is not None:
                        return stop
                else:
                    existed = self.workspace.exists(path)
                write_regular(path, data, shown, within=within)
        except (OSError, ValueError) as exc:
            return _fail("write", exc, given)
        how = "overwrote" if existed else "created"
        return ToolResult.ok(
            f"wrote {len(data)} bytes to {shown} ({how})", {"path": shown, "bytes": len(data)}
        )


_EDIT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "description": "The file to change."},
        "oldString": {"type": "string", "description": "The exact text to replace."},
        "newString": {"type": "string", "description": "The text to put in its place."},
        "replaceAll": {
            "type": "boolean",
            "description": "Replace every occurrence (default false: it must occur once).",
        },
    },
    "required": ["path", "oldString", "newString"],
}


class EditTool(ActingTool):
    """Replace an exact piece of text in a file, once approved."""

    name = "edit"
    description = (
        "Replace 'oldString' with 'newString' in the file at 'path'. 'oldString' must match "
        "the file exactly (whitespace included) and occur exactly once, unless 'replaceAll' "
        "is true. On any error the file is left unchanged."
    )
    input_schema = _EDIT_SCHEMA

    async def execute(self, args: dict[str, Any], ctx: ToolContext | None = None) -> ToolResult:
        try:
            path = required_str(args, "path")
            old = required_str(args, "oldString")
            new = required_str(args, "newString", allow_empty=True)
            replace_all = optional_bool(args, "replaceAll", False)
        except ArgumentError as exc:
            return ToolResult.error(f"edit: {exc}")
        if old == new:
            return ToolResult.error("edit: oldString and newString are the same; nothing to do")
        decision = self.approval.decide(self.name, args, ctx)
        if isinstance(decision, ToolResult):
            return decision
        return await anyio.to_thread.run_sync(
            self._edit, args, path, (old, new, replace_all), decision
        )

    def _edit(
        self,
        args: dict[str, Any],
        given: str,
        change: tuple[str, str, bool],
        decision: Decision,
    ) -> ToolResult:
        old, new, replace_all = change
        try:
            with MUTATION_LOCK:
                path = self.workspace.resolve(given)
                shown = self.workspace.display(path)
                within = self.workspace.within
                before = read_regular(path, shown, within=within)
                text = decode_text(before, shown)
                count = text.count(old)
                if count == 0 and "\r\n" in text and "\r" not in old:
                    # The model writes "\n"; a file with Windows line endings still matches.
                    old, new = old.replace("\n", "\r\n"), new.replace("\n", "\r\n")
                    count = text.count(old)
                if count == 0:
                    return ToolResult.error(
                        f"edit: oldString was not found in {shown}; the file is unchanged "
                        "(read it again and copy the text exactly)"
                    )
                if count > 1 and not replace_all:
                    return ToolResult.error(
                        f"edit: oldString occurs {count} times in {shown}; the file is "
                        "unchanged (include more surrounding lines to pick one, or set "
                        "replaceAll to change them all)"
                    )
                done = count if replace_all else 1
                after = text.replace(old, new, done).encode("utf-8")
                if decision.needs_preview:
                    preview = _change_preview("edit", "change", path, shown, before, after)
                    stop = decision.check(self.name, args, preview)
                    if stop is not None:
                        return stop
                write_regular(path, after, shown, within=within)
        except (OSError, ValueError) as exc:
            return _fail("edit", exc, given)
        noun = "occurrence" if done == 1 else "occurrences"
        return ToolResult.ok(
            f"replaced {done} {noun} in {shown}", {"path": shown, "replacements": done}
        )
