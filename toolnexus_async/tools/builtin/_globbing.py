"""Glob patterns for ``grep`` and ``glob``, matched by RE2; RE2 helpers both tools share.

Rules of this module:

- Glob patterns: ``*`` and ``?`` stay within one path segment, ``**`` crosses segments
  (``**/`` may match none), ``[abc]``/``[!abc]`` are classes and ``{a,b}`` alternatives. A
  pattern without ``/`` matches a file's name at any depth, as in ripgrep and .gitignore.
- A pattern is translated to one RE2 expression, so matching costs time linear in the path
  however the pattern nests; a pattern RE2 cannot take raises :class:`ArgumentError`.
- Paths are matched as UTF-8; a name that is not UTF-8 has U+FFFD at each invalid byte
  (:func:`_utf8`), one character for ``?`` and ``*``.
- RE2 is compiled only through :func:`_re2_compile` (no captures, nothing logged to
  stderr), and its errors are worded through :func:`_re2_message`.
"""

from __future__ import annotations

from typing import Protocol, cast

import re2

from ._workspace import ArgumentError


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
