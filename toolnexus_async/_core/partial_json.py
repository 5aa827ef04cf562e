"""The JSON value a text that is still arriving already holds (best effort).

Rule of this module: pure, and never an exception: :func:`parse_partial` closes what is
open (a string, arrays, objects) and drops a last member that is not complete yet (a key
without its value, a number or ``true`` cut short), so that a consumer of a stream sees
the fields as they arrive. ``None`` when nothing usable is there yet. What it gives is a
preview, never validated: the run's output is the whole reply, checked.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ("parse_partial",)

# Where a text may be cut back to: after these, what follows is an unfinished member.
_CUTS = ",{[:"


def _closers(text: str) -> tuple[str, bool] | None:
    """The brackets still open in ``text`` (as their closers, innermost first) and
    whether a string is open; None when the text is not the start of JSON."""
    stack: list[str] = []
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch == "{":
            stack.append("}")
        elif ch == "[":
            stack.append("]")
        elif ch in "}]":
            if not stack or stack.pop() != ch:
                return None
    if escaped:
        return None
    return "".join(reversed(stack)), in_string


def _attempt(text: str) -> Any:
    state = _closers(text)
    if state is None:
        return _FAILED
    closers, in_string = state
    try:
        return json.loads(text + ('"' if in_string else "") + closers)
    except ValueError:
        return _FAILED


_FAILED = object()


def parse_partial(text: str) -> Any:
    """The value ``text`` (the start of a JSON document) holds so far, or None."""
    body = text.strip()
    if body.startswith("```"):  # a fenced reply (the prompt method): the fence is skipped
        body = body.split("\n", 1)[1] if "\n" in body else ""
        body = body.removesuffix("```").rstrip()
    if not body or body[0] not in "{[":
        return None
    # Cut back a member at a time until what is left closes into JSON: a few tries, since
    # a member is cut at its last separator.
    for _ in range(4):
        value = _attempt(body)
        if value is not _FAILED:
            return value
        cut = max(body.rfind(c) for c in _CUTS)
        if cut <= 0:
            return None
        body = body[: cut + 1] if body[cut] in "{[" else body[:cut]
        body = body.rstrip()
    return None
