"""The patch grammar of ``apply_patch``: parsing, and applying hunks to text in memory.

Rule of this module: it is pure. It never touches the file system: :func:`parse_patch` turns
the patch text into operations (or raises :class:`PatchError` naming the line), and
:func:`apply_hunks` turns a file's text into its new text (or raises :class:`PatchError`
naming the hunk that does not match). Deciding which files change, and writing them all or
none, belongs to :mod:`.apply_patch`.

The grammar::

    *** Begin Patch
    *** Add File: path           every following line starts with '+'
    *** Update File: path
    *** Move to: new/path        optional, right after Update File
    @@ optional anchor line      each hunk starts with '@@'; the anchor is a line to seek first
     context line                ' ' context, '-' removed, '+' added
    *** End of File              optional: the hunk sits at the end of the file
    *** Delete File: path
    *** End Patch

A hunk's context and removed lines must appear in the file in order, after the previous hunk;
they are compared exactly first, then ignoring trailing whitespace, then ignoring surrounding
whitespace (models often get indentation of blank lines wrong).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import attrs

__all__ = (
    "AddFile",
    "DeleteFile",
    "Hunk",
    "Operation",
    "PatchError",
    "UpdateFile",
    "apply_hunks",
    "parse_patch",
)

_BEGIN = "*** Begin Patch"
_END = "*** End Patch"
_ADD = "*** Add File:"
_UPDATE = "*** Update File:"
_DELETE = "*** Delete File:"
_MOVE = "*** Move to:"
_EOF = "*** End of File"
# "@@ -12,3 +12,4 @@ def f():" from a unified diff: the numbers mean nothing here; what follows
# the second @@ is a line of the file and serves as the anchor.
_UNIFIED_RANGE = re.compile(r"^-\d+(?:,\d+)? \+\d+(?:,\d+)? @@ ?")


class PatchError(ValueError):
    """The patch is malformed or does not apply; nothing was written."""


@attrs.frozen
class Hunk:
    """One ``@@`` section: ``(kind, text)`` lines, kind being ``" "``, ``"-"`` or ``"+"``."""

    anchor: str
    lines: tuple[tuple[str, str], ...]
    at_end: bool = False

    @property
    def old(self) -> list[str]:
        """The lines the file must contain: context and removed ones."""
        return [text for kind, text in self.lines if kind != "+"]


@attrs.frozen
class AddFile:
    """``*** Add File:``: a new file made of ``lines``."""

    path: str
    lines: tuple[str, ...]


@attrs.frozen
class DeleteFile:
    """``*** Delete File:``."""

    path: str


@attrs.frozen
class UpdateFile:
    """``*** Update File:``, optionally moved, changed by ``hunks`` in order."""

    path: str
    move_to: str | None
    hunks: tuple[Hunk, ...]


Operation = AddFile | DeleteFile | UpdateFile


def _header_path(line: str, prefix: str, number: int) -> str:
    path = line[len(prefix) :].strip()
    if not path:
        raise PatchError(f"patch line {number}: {prefix!r} needs a path")
    return path


def _parse_hunks(
    body: Sequence[str], i: int, path: str, line_no: Callable[[int], int]
) -> tuple[list[Hunk], int]:
    hunks: list[Hunk] = []
    anchor: str | None = None
    current: list[tuple[str, str]] = []
    at_end = False
    blank_tail = 0  # bare empty lines at the end of the hunk so far

    def close() -> None:
        # Bare empty lines that end a hunk are the gap before the next section far more
        # often than context, and as context they could only make a good hunk miss.
        kept = current[: len(current) - blank_tail]
        if anchor is not None or kept:
            hunks.append(Hunk(anchor or "", tuple(kept), at_end))

    while i < len(body):
        line = body[i]
        if line.rstrip() == _EOF:
            at_end = True
        elif line.startswith("*** "):
            break
        elif line.startswith("@@"):
            close()
            header = line[2:].strip()
            anchor = _UNIFIED_RANGE.sub("", header).strip()
            current, at_end, blank_tail = [], False, 0
        elif at_end and not line.strip():
            pass  # the gap before the next section
        elif at_end:
            raise PatchError(f"patch line {line_no(i)}: {_EOF!r} must end its hunk")
        elif line[:1] in ("-", "+", " "):
            current.append((line[0], line[1:]))
            blank_tail = 0
        elif not line.strip():
            # Most likely an empty context line whose leading space got lost on the way.
            current.append((" ", ""))
            blank_tail += 1
        else:
            raise PatchError(
                f"patch line {line_no(i)}: in the update of {path}, {line!r} is not a hunk "
                "line (hunk lines start with ' ', '-' or '+'; hunks start with '@@')"
            )
        i += 1
    close()
    return hunks, i


def _only_blank_until_header(body: Sequence[str], i: int) -> bool:
    while i < len(body) and not body[i].strip():
        i += 1
    return i == len(body) or body[i].startswith("*** ")


def parse_patch(text: str) -> list[Operation]:
    """The operations of a patch in order; :class:`PatchError` naming the line if malformed."""
    lines = text.splitlines()
    first = 0
    while first < len(lines) and not lines[first].strip():
        first += 1
    last = len(lines)
    while last > first and not lines[last - 1].strip():
        last -= 1
    if first == last or lines[first].strip() != _BEGIN:
        raise PatchError(f"the patch must start with {_BEGIN!r}")
    if last - first < 2 or lines[last - 1].strip() != _END:
        raise PatchError(f"the patch must end with {_END!r}")
    body = lines[first + 1 : last - 1]

    def line_no(i: int) -> int:
        return first + 2 + i

    ops: list[Operation] = []
    i = 0
    while i < len(body):
        line = body[i]
        if line.startswith(_ADD):
            path = _header_path(line, _ADD, line_no(i))
            i += 1
            content: list[str] = []
            while i < len(body) and not body[i].startswith("*** "):
                if not body[i].strip() and _only_blank_until_header(body, i):
                    i += 1
                    continue
                if not body[i].startswith("+"):
                    raise PatchError(
                        f"patch line {line_no(i)}: every line of an added file ({path}) "
                        f"must start with '+', got {body[i]!r}"
                    )
                content.append(body[i][1:])
                i += 1
            ops.append(AddFile(path, tuple(content)))
        elif line.startswith(_DELETE):
            ops.append(DeleteFile(_header_path(line, _DELETE, line_no(i))))
            i += 1
        elif line.startswith(_UPDATE):
            path = _header_path(line, _UPDATE, line_no(i))
            i += 1
            move_to = None
            if i < len(body) and body[i].startswith(_MOVE):
                move_to = _header_path(body[i], _MOVE, line_no(i))
                i += 1
            hunks, i = _parse_hunks(body, i, path, line_no)
            if not hunks and move_to is None:
                raise PatchError(f"the update of {path} has no hunks")
            ops.append(UpdateFile(path, move_to, tuple(hunks)))
        elif not line.strip():
            i += 1
        else:
            raise PatchError(
                f"patch line {line_no(i)}: expected '*** Add File:', '*** Update File:' or "
                f"'*** Delete File:', got {line!r}"
            )
    if not ops:
        raise PatchError("the patch changes no file")
    return ops


_LOOSENESS: tuple[Callable[[str], str], ...] = (
    lambda s: s,
    str.rstrip,
    str.strip,
)


def _find(lines: Sequence[str], wanted: Sequence[str], start: int, at_end: bool) -> int:
    """Where ``wanted`` occurs in ``lines`` at or after ``start``, or -1."""
    span = len(wanted)
    if at_end:
        candidates: Sequence[int] = [len(lines) - span] if len(lines) - span >= start else []
    else:
        candidates = range(start, len(lines) - span + 1)
    for norm in _LOOSENESS:
        target = [norm(s) for s in wanted]
        for pos in candidates:
            if all(norm(lines[pos + k]) == target[k] for k in range(span)):
                return pos
    return -1


def apply_hunks(text: str, hunks: Sequence[Hunk], shown: str) -> str:
    crlf = "\r\n" in text
    if crlf:
        text = text.replace("\r\n", "\n")
    ends_with_newline = text.endswith("\n") or not text
    lines = text.split("\n") if text else []
    if text.endswith("\n"):
        lines.pop()
    cursor = 0
    for number, hunk in enumerate(hunks, 1):
        name = f"hunk {number} of {shown}" + (f" (@@ {hunk.anchor})" if hunk.anchor else "")
        start = cursor
        if hunk.anchor:
            start = _find(lines, [hunk.anchor], cursor, False)
            if start < 0:
                raise PatchError(f"{name} does not match: the anchor line was not found")
        old = hunk.old
        if not old:
            # Nothing to match: add after the anchor, or at the end of the file.
            pos = start + 1 if hunk.anchor else len(lines)
        else:
            pos = _find(lines, old, start, hunk.at_end)
            if pos < 0:
                where = " after the previous hunk" if number > 1 else ""
                expected = "\n".join(old[:20])
                raise PatchError(
                    f"{name} does not match: these lines were not found in order{where}:\n"
                    f"{expected}"
                )
        # Context lines keep the file's own text: they may have matched only loosely.
        replacement: list[str] = []
        end = pos
        for kind, text in hunk.lines:
            if kind == "+":
                replacement.append(text)
                continue
            if kind == " ":
                replacement.append(lines[end])
            end += 1
        lines[pos:end] = replacement
        cursor = pos + len(replacement)
    out = "\n".join(lines) + ("\n" if lines and ends_with_newline else "")
    return out.replace("\n", "\r\n") if crlf else out
