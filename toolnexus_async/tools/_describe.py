"""What the model is told about a Python function: a JSON Schema from its type hints, its
description and its parameters' from its docstring.

Rules of this module:

- A hint becomes the subset of JSON Schema tool arguments need: the JSON scalars, ``None``,
  ``Literal`` and ``Enum`` (an ``enum``), unions (``anyOf``), lists, sets, tuples (fixed or
  ``tuple[T, ...]``) and mappings; ``Any`` or no hint is any value, ``Annotated[T, "text"]``
  a description. Any other type is refused, with the hint named.
- A docstring's first paragraph is the description; a Google-style ``Args:`` (or
  ``Arguments:``, ``Parameters:``) section gives each parameter's, continuation lines
  included, up to the next section at the left margin.
- A parameter typed ``ToolContext`` (or a union with it) receives the call's context
  (:func:`is_context`); a default is shown to the model only when it is a JSON value.
"""

from __future__ import annotations

import enum
import inspect
import json
import re
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from .._core.errors import UsageError
from .._core.types import ToolContext

__all__ = ("is_context", "json_value", "parse_docstring", "schema_for")

_SIMPLE: dict[Any, dict[str, Any]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
    type(None): {"type": "null"},
}


def schema_for(hint: Any) -> dict[str, Any]:
    """A JSON Schema for a type hint (the subset tool arguments need)."""
    if hint is inspect.Parameter.empty or hint is Any:
        return {}
    if hint in _SIMPLE:
        return dict(_SIMPLE[hint])
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Annotated:
        schema = schema_for(args[0])
        texts = [a for a in args[1:] if isinstance(a, str)]
        if texts:
            schema["description"] = " ".join(texts)
        return schema
    if origin is typing.Literal:
        values = list(args)
        schema = {"enum": values}
        kinds = {type(v) for v in values}
        if len(kinds) == 1 and (kind := kinds.pop()) in _SIMPLE:
            schema = {**_SIMPLE[kind], "enum": values}
        return schema
    if origin in (typing.Union, types.UnionType):
        return {"anyOf": [schema_for(a) for a in args]}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return schema_for(typing.Literal[tuple(m.value for m in hint)])
    if origin in (list, set, frozenset, Sequence) or hint in (list, set, frozenset):
        return {"type": "array", "items": schema_for(args[0])} if args else {"type": "array"}
    if origin is tuple or hint is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": schema_for(args[0])}
        if args:
            return {
                "type": "array",
                "prefixItems": [schema_for(a) for a in args],
                "minItems": len(args),
                "maxItems": len(args),
            }
        return {"type": "array"}
    if origin in (dict, Mapping) or hint in (dict, Mapping):
        if len(args) == 2 and args[1] is not Any:
            return {"type": "object", "additionalProperties": schema_for(args[1])}
        return {"type": "object"}
    raise UsageError(f"cannot describe type {hint!r} as JSON Schema; annotate with a JSON type")


def is_context(hint: Any) -> bool:
    if hint is ToolContext:
        return True
    return typing.get_origin(hint) in (typing.Union, types.UnionType) and ToolContext in (
        typing.get_args(hint)
    )


_ARGS_HEADER = re.compile(r"^\s*(Args|Arguments|Parameters):\s*$")
_ARG_LINE = re.compile(r"^\s+(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """The summary (first paragraph) and the ``Args:`` descriptions of a docstring."""
    lines = doc.splitlines()
    summary: list[str] = []
    for line in lines:
        if not line.strip() or _ARGS_HEADER.match(line):
            break
        summary.append(line.strip())
    params: dict[str, str] = {}
    current: str | None = None
    in_args = False
    for line in lines:
        if _ARGS_HEADER.match(line):
            in_args = True
            continue
        if not in_args:
            continue
        if line.strip() and not line.startswith((" ", "\t")):
            break  # the next section (Returns:, Raises:) starts at the left margin
        match = _ARG_LINE.match(line)
        indent = len(line) - len(line.lstrip())
        if match and (current is None or indent <= _indent_of(lines, current)):
            current = match.group(1).lstrip("*")
            params[current] = match.group(3).strip()
        elif current is not None and line.strip():
            params[current] = f"{params[current]} {line.strip()}".strip()
    return " ".join(summary), params


def _indent_of(lines: list[str], name: str) -> int:
    for line in lines:
        match = _ARG_LINE.match(line)
        if match and match.group(1).lstrip("*") == name:
            return len(line) - len(line.lstrip())
    return 0


def json_value(value: object) -> bool:
    """Whether ``value`` can be shown to the model as JSON (a default it is told)."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True
