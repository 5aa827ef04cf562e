"""Tool arguments checked against the tool's input schema, with a message a model can act on.

Rules of this module:

- Each schema is compiled once: :func:`validator_for` caches the compiled check by the
  identity of the schema object, and keeps that object alive while it is cached, so an id is
  never reused for another schema. A schema is treated as frozen once a tool is registered.
- A violation is reported as ``<field> <rule>``: the field as a path into the arguments
  (``questions[0].question``, ``arguments`` for the whole object) and the rule it breaks
  (``is required``, ``must be integer, got string``, ``must be one of "a", "b"``).
- Validation never changes the arguments (schema ``default``\\ s are not filled in) and never
  reaches the network: a ``$ref`` to anything outside the schema is refused when compiling.
- A schema that is itself invalid raises :class:`UsageError` when it is compiled (the
  failure is cached, so it is reported again without recompiling); a schema that breaks
  only while checking gives a message, never an exception.

Why jsonschema-rs. Tool schemas come from MCP servers nobody here wrote, and MCP makes
JSON Schema 2020-12 their default dialect (SEP-1613): the validator must speak it, and be
fast and bounded on hostile input, since arguments are checked on the event loop before
each tool call. ``jsonschema-rs`` (a Rust validator) reads ``$schema`` (drafts 4, 6, 7,
2019-09 and 2020-12; 2020-12 when absent), evaluates ``pattern`` with a regex engine that
is linear for plain patterns and bounded by a backtrack limit for the others (``^(a+)+$``
against a hostile argument costs microseconds, where Python's ``re`` took seconds), and
compiles and checks faster than the pure-Python fastjsonschema used before
(``benchmarks/validation.py`` gives the figures). Its limits: ``format`` is not checked
here (an annotation by default in current drafts), and left to itself it would fetch a
remote ``$ref``; every retrieval is refused instead. The messages are worded here, from the
error's kind, its path and the schema, as before.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jsonschema_rs

from .errors import UsageError

__all__ = ("Validator", "validator_for")

Validator = Callable[[dict[str, Any]], str | None]

# Enough for every tool of many toolkits; a program that mints schemas without end does not
# grow memory without end.
_CACHE_SIZE = 2048
_cache: OrderedDict[int, tuple[object, Validator | UsageError]] = OrderedDict()
_lock = threading.Lock()
_ROOT = "arguments"
_VALUE_CHARS = 60
# Violations named in one message: enough to fix several at once, not a wall of text.
_MOST_SHOWN = 5


class _Refused(LookupError):
    """Raised by the retriever: no schema is ever fetched, from the network or a file."""


def _refuse(uri: str) -> Any:
    raise _Refused(uri)


def validator_for(schema: Mapping[str, Any]) -> Validator:
    """The compiled check for ``schema``: ``check(args)`` is None when valid, else a message.

    >>> check = validator_for({"type": "object", "required": ["city"]})
    >>> check({})
    'city is required'
    >>> check({"city": "Oslo"}) is None
    True

    Raises:
        UsageError: the schema is not a valid JSON Schema (or not JSON at all), or refers
            to a schema outside itself.
    """
    key = id(schema)
    with _lock:
        hit = _cache.get(key)
        if hit is not None and hit[0] is schema:
            _cache.move_to_end(key)
            entry = hit[1]
        else:
            entry = None
    if entry is None:
        entry = _compile(schema)
        with _lock:
            _cache[key] = (schema, entry)
            while len(_cache) > _CACHE_SIZE:
                _cache.popitem(last=False)
    if isinstance(entry, UsageError):
        raise UsageError(str(entry))
    return entry


def _compile(schema: Mapping[str, Any]) -> Validator | UsageError:
    try:
        # A plain-JSON copy: a schema that does not survive this could not be sent to a
        # model either, and the messages below walk it.
        definition = json.loads(json.dumps(schema))
    except (TypeError, ValueError) as exc:
        return UsageError(f"input schema is not JSON: {exc}")
    if not isinstance(definition, dict):
        return UsageError(f"input schema must be a JSON object, got {type(schema).__name__}")
    try:
        compiled = jsonschema_rs.validator_for(
            definition, retriever=_refuse, validate_formats=False
        )
    except jsonschema_rs.ValidationError as exc:
        first = str(exc).split("\n", 1)[0]
        if "retrieving it failed" in first:
            uri = first.split("'")[1] if first.count("'") >= 2 else "?"
            return UsageError(
                f"$ref {uri!r} points outside the schema; inline it (schemas are never fetched)"
            )
        return UsageError(f"invalid input schema: {first}")
    except Exception as exc:  # a pattern the engine cannot compile, an unknown draft
        return UsageError(f"invalid input schema: {type(exc).__name__}: {exc}")
    is_valid = compiled.is_valid

    def check(args: dict[str, Any]) -> str | None:
        try:
            if is_valid(args):
                return None
            return _describe(compiled.iter_errors(args), args, definition)
        except Exception as exc:
            return f"the tool's input schema could not be applied: {type(exc).__name__}: {exc}"

    return check


# --- messages ----------------------------------------------------------------------------


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _show(value: object) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= _VALUE_CHARS else text[: _VALUE_CHARS - 3] + "..."


def _join(path: str, field: str) -> str:
    return f"{path}.{field}" if path != _ROOT else field


def _where(parts: Iterable[str | int]) -> str:
    """``questions[0].question`` for the instance path ``["questions", 0, "question"]``."""
    path = _ROOT
    for part in parts:
        if isinstance(part, int):
            path = f"{path}[{part}]" if path != _ROOT else f"[{part}]"
        else:
            path = _join(path, part)
    return path


def _at(definition: object, path: Iterable[str | int]) -> object:
    """The part of the schema at ``path`` (a keyword location), or None if it is not there
    (a location through a ``$ref`` leads elsewhere)."""
    node = definition
    for part in path:
        if isinstance(node, dict) and str(part) in node:
            node = node[str(part)]
        elif isinstance(node, list) and isinstance(part, int | str) and str(part).isdigit():
            index = int(part)
            node = node[index] if index < len(node) else None
        else:
            return None
    return node


def _describe(errors: Iterable[Any], args: object, definition: object) -> str:
    messages: list[str] = []
    more = 0
    for error in errors:
        message = _message(error, args, definition)
        if message in messages:
            continue
        if len(messages) < _MOST_SHOWN:
            messages.append(message)
        else:
            more += 1
    if more:
        messages.append(f"and {more} more")
    return "; ".join(messages)


def _message(error: Any, args: object, definition: object) -> str:
    where = _where(error.instance_path)
    kind = error.kind
    rule = kind.name
    keyword = list(error.schema_path)
    declared = _at(definition, keyword)
    value = error.instance
    if rule == "required":
        return f"{_join(where, str(kind.property))} is required"
    if rule == "type":
        wanted = declared if isinstance(declared, list | str) else list(kind.types)
        shown = " or ".join(wanted) if isinstance(wanted, list) else str(wanted)
        return f"{where} must be {shown}, got {_json_type(value)}"
    if rule == "enum":
        choices = ", ".join(_show(v) for v in kind.options)
        return f"{where} must be one of {choices}, got {_show(value)}"
    if rule == "const":
        return f"{where} must be {_show(kind.expected_value)}, got {_show(value)}"
    if rule in ("additionalProperties", "unevaluatedProperties"):
        parent = _at(definition, keyword[:-1])
        return _extra_fields(where, list(kind.unexpected), parent)
    if rule in _BOUNDS:
        limit = kind.multiple_of if rule == "multipleOf" else kind.limit
        got = f", got {_show(value)}" if isinstance(value, int | float) else ""
        return f"{where} {_BOUNDS[rule].format(_show(limit))}{got}"
    if rule == "uniqueItems":
        return f"{where} must not contain the same item twice"
    if rule == "pattern":
        return f"{where} must match the pattern {kind.pattern}, got {_show(value)}"
    if rule in ("anyOf", "oneOfNotValid"):
        forms = declared if isinstance(declared, list) else []
        types = [str(d.get("type")) for d in forms if isinstance(d, dict) and "type" in d]
        how = "at least one" if rule == "anyOf" else "exactly one"
        shown = f" ({', '.join(types)})" if forms and len(types) == len(forms) else ""
        count = f"{len(forms)} " if forms else ""
        return f"{where} must match {how} of the {count}allowed forms{shown}"
    if rule == "oneOfMultipleValid":
        return f"{where} must match exactly one of the allowed forms, and matches several"
    if rule == "not":
        return f"{where} must not match the schema under 'not', got {_show(value)}"
    if rule == "falseSchema":
        return f"{where} is not allowed"
    if rule == "backtrackLimitExceeded":
        return f"{where} could not be checked against its pattern in bounded time"
    # Anything else (contains, dependentRequired's kin, propertyNames...): the library's
    # own wording, which names the value, after our path.
    return f"{where}: {error.message}"


_BOUNDS: dict[str, str] = {
    "minimum": "must be at least {}",
    "maximum": "must be at most {}",
    "exclusiveMinimum": "must be greater than {}",
    "exclusiveMaximum": "must be less than {}",
    "multipleOf": "must be a multiple of {}",
    "minLength": "must be at least {} characters long",
    "maxLength": "must be at most {} characters long",
    "minItems": "must have at least {} items",
    "maxItems": "must have at most {} items",
    "minProperties": "must have at least {} fields",
    "maxProperties": "must have at most {} fields",
    "additionalItems": "must have at most {} items",
}


def _extra_fields(where: str, extras: list[str], definition: object) -> str:
    properties = definition.get("properties") if isinstance(definition, dict) else None
    known = list(properties) if isinstance(properties, dict) else []
    allowed = ", ".join(known) if known else "none"
    fields = ", ".join(_join(where, k) for k in extras) or where
    verb = "is" if len(extras) == 1 else "are"
    return f"{fields} {verb} not allowed (allowed fields: {allowed})"
