"""Grep's matching: a regular expression compiled by RE2, searched line by line.

Rules of this module:

- Patterns are RE2 syntax, which runs in time linear in the text: a construct RE2 leaves
  out by design (backreferences, lookaround, ...) is refused with a message naming what
  RE2 lacks, any other bad pattern with RE2's own message.
- Each line is searched as if on its own: no match crosses a line end, ``^``/``$`` and
  ``\\A``/``\\Z``/``\\z`` are the line's start and end.
- A file is read in blocks of whole lines (:data:`_BLOCK`, a longer line is one block),
  each searched in one RE2 call, checking for cancellation between blocks.
- Invalid UTF-8 is searched as U+FFFD, as Python's ``re`` on the decoded line matched it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

import anyio.from_thread
import re2

from ._globbing import _Compiled, _re2_compile, _re2_message

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
