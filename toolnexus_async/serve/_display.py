"""What a person approves, in the form the page shows it: the display rules of the inbox.

Rules of this module (docs/security.md, "What the inbox shows is what runs"):

- A character that could make the shown text differ from what runs is never shown raw: the
  bidirectional controls, the zero-width and other format characters (category Cf), C0 and
  C1 controls other than newline and tab, line and paragraph separators, surrogates,
  private-use and unassigned code points, and the invisible fillers of :data:`_FILLERS`.
  Each becomes an escape piece, ``{"escape": "⟨U+202E⟩", "name": ...}``, which the page
  draws as visible text, and counts towards the request's ``hidden``.
- Everything else, accented and right-to-left letters included, is left exactly as it is.
- Text is cut into lines at ``\\n`` only (the line break a shell and a patch mean); tabs and
  runs of spaces stay in the text. Nothing is shortened here: cutting is the page's, and
  it always says so and offers the whole.
- A ``diff`` string in the request's data is a diff: one entry per line, each marked by
  what its first character says (added, removed, context, hunk, file, note).
- Pure and deterministic: the request's own fields are never changed; :func:`display_of`
  builds a separate ``display`` that serve adds beside them.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Mapping
from typing import Any, TypeAlias

__all__ = ("Piece", "display_of", "escape_lines", "hidden_count", "is_hidden")

# A run of text shown as it is, or one escaped character.
Piece: TypeAlias = str | dict[str, str]
Line: TypeAlias = list[Piece]

# Categories never shown raw. Cn and Co: a font may draw anything, or nothing, for them;
# Zl and Zp: browsers break the line where a shell or a patch does not.
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
# Letters and marks that are drawn as nothing at all (Unicode's default-ignorable ones
# outside Cf), used to pad look-alike names.
_FILLERS = frozenset({0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x3164, 0xFFA0})
# Printable ASCII, newline and tab are always fine: only the rest is looked at one by one.
_SUSPECT = re.compile(r"[^\x20-\x7e\n\t]")

_DIFF_MARKS = {"+": "add", "-": "del", " ": "context", "@": "hunk", "\\": "note"}


def is_hidden(char: str) -> bool:
    """Whether ``char`` (one code point) is shown as an escape."""
    if char in "\n\t":
        return False
    return ord(char) in _FILLERS or unicodedata.category(char) in _HIDDEN_CATEGORIES


def _escape(char: str) -> dict[str, str]:
    code = f"U+{ord(char):04X}"
    # Controls have no name in the Unicode database; the code says what they are.
    return {"escape": f"⟨{code}⟩", "name": unicodedata.name(char, code)}


def _pieces(line: str) -> Line:
    pieces: Line = []
    start = 0
    for match in _SUSPECT.finditer(line):
        char = match.group()
        if not is_hidden(char):
            continue
        if match.start() > start:
            pieces.append(line[start : match.start()])
        pieces.append(_escape(char))
        start = match.end()
    if start < len(line):
        pieces.append(line[start:])
    return pieces


def escape_lines(text: str) -> list[Line]:
    """``text`` as lines of pieces: plain strings, and escapes for hidden characters.

    Joining a line's strings and escaped characters back, and the lines with ``\\n``,
    gives ``text`` again: nothing is dropped, only made visible.
    """
    return [_pieces(line) for line in text.split("\n")]


def _diff_lines(diff: str) -> list[dict[str, Any]]:
    lines = diff.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line starts no line of its own
    out = []
    for line in lines:
        mark = _DIFF_MARKS.get(line[:1], "other")
        if line.startswith(("+++ ", "--- ")):
            mark = "file"
        out.append({"mark": mark, "pieces": _pieces(line)})
    return out


def _field(key: str, value: Any) -> dict[str, Any]:
    """One data entry: its text as shown, or nothing for a value that holds no text."""
    if isinstance(value, str):
        if key == "diff":
            return {"key": key, "kind": "diff", "lines": _diff_lines(value)}
        return {"key": key, "kind": "text", "lines": escape_lines(value)}
    if isinstance(value, dict | list):
        # Strings inside keep their quotes and \n escapes: the value's exact JSON, readable.
        shown = json.dumps(value, ensure_ascii=False, indent=2)
        return {"key": key, "kind": "json", "lines": escape_lines(shown)}
    return {"key": key, "kind": "value"}  # a number, yes/no or null: no text to hide in


def hidden_count(display: Any) -> int:
    """How many escapes a display form (or any part of one) holds."""
    if isinstance(display, dict):
        if "escape" in display:
            return 1
        return sum(hidden_count(v) for v in display.values())
    if isinstance(display, list):
        return sum(hidden_count(v) for v in display)
    return 0


def display_of(request: Mapping[str, Any]) -> dict[str, Any]:
    """The display form of a request's wire dict (``Request.to_dict()``).

    ``{"hidden": N, "prompt": lines, "url": lines?, "fields": [...]}``: ``hidden`` counts
    the escapes in all of it (a character shown in the prompt and in the command counts
    twice); ``fields`` follow the data's own key order.
    """
    shown: dict[str, Any] = {"prompt": escape_lines(str(request.get("prompt", "")))}
    url = request.get("url")
    if isinstance(url, str):
        shown["url"] = escape_lines(url)
    data = request.get("data")
    if isinstance(data, Mapping):
        shown["fields"] = [_field(str(key), value) for key, value in data.items()]
    else:
        shown["fields"] = []
    return {"hidden": hidden_count(shown), **shown}
