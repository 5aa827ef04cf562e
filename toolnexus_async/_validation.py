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

Why fastjsonschema. ``benchmarks/validation.py`` on a realistic tool schema (nested objects
in an array, an enum, integer bounds, ``anyOf``, ``additionalProperties: false``), Python
3.11 on a shared 2-vCPU machine, jsonschema 4.26.0 against fastjsonschema 2.22.3; checks per
second (ranges over runs):

==================  ===============  ===============  ============
library             valid args       invalid args     compile once
==================  ===============  ===============  ============
jsonschema          7,000 - 10,000   2,800 - 5,000    lazy (0 ms)
fastjsonschema      57,000 - 97,000  43,000 - 75,000  ~2.5 ms
this module         83,000 - 95,000  47,000 - 63,000  ~2.5 ms
==================  ===============  ===============  ============

fastjsonschema compiles a schema into Python code, so a check costs about 10-15 us instead
of about 100-150 us. Every run shares one event loop and arguments are checked on it before
each tool call, so that is the figure that matters; the compile is paid once per schema.
The messages do not decide it: both libraries expose the failing path, rule and value, and
this module words the message itself from those. jsonschema could list every violation at
once where fastjsonschema stops at the first; a model fixing one field per retry is an
acceptable price. fastjsonschema is also pure Python with no dependencies (jsonschema brings
referencing, rpds-py and jsonschema-specifications). Its limits: drafts 4, 6, 7 and 2019-09
(a 2020-12 schema is read as 2019-09, so ``prefixItems`` is ignored); ``format`` is not
checked here (an annotation by default in current drafts); and left to itself it would
fetch a remote ``$ref`` with urllib, which is why every scheme gets a refusing handler.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import fastjsonschema

from ._errors import UsageError

__all__ = ("Validator", "validator_for")

Validator = Callable[[dict[str, Any]], str | None]

# Enough for every tool of many toolkits; a program that mints schemas without end does not
# grow memory without end.
_CACHE_SIZE = 2048
_cache: OrderedDict[int, tuple[object, Validator | UsageError]] = OrderedDict()
_lock = threading.Lock()
_ROOT = "arguments"
_VALUE_CHARS = 60


def _refuse(uri: str) -> Any:
    raise fastjsonschema.JsonSchemaDefinitionException(
        f"$ref {uri!r} points outside the schema; inline it (schemas are never fetched)"
    )


class _NoRemote(Mapping[str, Callable[[str], Any]]):
    """A handler for every URI scheme that refuses: fastjsonschema would otherwise fetch it."""

    def __getitem__(self, scheme: str) -> Callable[[str], Any]:
        return _refuse

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def validator_for(schema: Mapping[str, Any]) -> Validator:
    """The compiled check for ``schema``: ``check(args)`` is None when valid, else a message.

    >>> check = validator_for({"type": "object", "required": ["city"]})
    >>> check({})
    'city is required'
    >>> check({"city": "Oslo"}) is None
    True

    Raises:
        UsageError: the schema is not a valid JSON Schema (or not JSON at all).
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
        # A plain-JSON copy: fastjsonschema wants dicts, and a schema that does not survive
        # this could not be sent to a model either.
        definition = json.loads(json.dumps(schema))
    except (TypeError, ValueError) as exc:
        return UsageError(f"input schema is not JSON: {exc}")
    if not isinstance(definition, dict):
        return UsageError(f"input schema must be a JSON object, got {type(schema).__name__}")
    try:
        compiled = fastjsonschema.compile(
            definition,
            handlers=_NoRemote(),
            use_default=False,
            use_formats=False,
        )
    except Exception as exc:  # the library raises whatever the generated code meets
        return UsageError(f"invalid input schema: {exc}")

    def check(args: dict[str, Any]) -> str | None:
        try:
            compiled(args)
        except fastjsonschema.JsonSchemaValueException as exc:
            return _describe(exc, args)
        except Exception as exc:
            return f"the tool's input schema could not be applied: {type(exc).__name__}: {exc}"
        return None

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


def _where(parts: list[str], args: object) -> str:
    """``questions[0].question`` for fastjsonschema's ``['data', 'questions', '0', ...]``."""
    path = _ROOT
    node: object = args
    for part in parts[1:]:
        if isinstance(node, list) and part.isdigit():
            index = int(part)
            path = f"{path}[{index}]" if path != _ROOT else f"[{index}]"
            node = node[index] if index < len(node) else None
        else:
            path = _join(path, part)
            node = node.get(part) if isinstance(node, dict) else None
    return path


def _describe(exc: fastjsonschema.JsonSchemaValueException, args: object) -> str:
    where = _where(exc.path, args)
    rule = exc.rule
    rule_def = exc.rule_definition
    value = exc.value
    definition = exc.definition if isinstance(exc.definition, dict) else {}
    if rule == "required" and isinstance(rule_def, list):
        have = value if isinstance(value, dict) else {}
        missing = [str(k) for k in rule_def if k not in have]
        if missing:
            return "; ".join(f"{_join(where, k)} is required" for k in missing)
    elif rule == "type":
        wanted = " or ".join(rule_def) if isinstance(rule_def, list) else str(rule_def)
        return f"{where} must be {wanted}, got {_json_type(value)}"
    elif rule == "enum" and isinstance(rule_def, list):
        choices = ", ".join(_show(v) for v in rule_def)
        return f"{where} must be one of {choices}, got {_show(value)}"
    elif rule == "const":
        return f"{where} must be {_show(rule_def)}, got {_show(value)}"
    elif rule == "additionalProperties" and isinstance(value, dict):
        return _extra_fields(where, value, definition)
    elif rule in _BOUNDS and not isinstance(rule_def, bool):
        got = f", got {_show(value)}" if isinstance(value, int | float) else ""
        return f"{where} {_BOUNDS[rule].format(rule_def)}{got}"
    elif rule == "uniqueItems":
        return f"{where} must not contain the same item twice"
    elif rule == "pattern":
        return f"{where} must match the pattern {rule_def}, got {_show(value)}"
    elif rule in ("anyOf", "oneOf") and isinstance(rule_def, list):
        forms = [str(d.get("type")) for d in rule_def if isinstance(d, dict) and "type" in d]
        how = "at least one" if rule == "anyOf" else "exactly one"
        shown = f" ({', '.join(forms)})" if len(forms) == len(rule_def) else ""
        return f"{where} must match {how} of the {len(rule_def)} allowed forms{shown}"
    elif rule == "not":
        return f"{where} must not match the schema under 'not', got {_show(value)}"
    # Anything else: the library's own wording, with its path replaced by ours.
    message = str(exc.message)
    name = exc.name or ""
    if name and message.startswith(name):
        message = message[len(name) :].lstrip()
    return f"{where} {message}"


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
}


def _extra_fields(where: str, value: dict[str, Any], definition: dict[str, Any]) -> str:
    properties = definition.get("properties")
    known = list(properties) if isinstance(properties, dict) else []
    patterns = definition.get("patternProperties")
    regexes = [re.compile(p) for p in patterns] if isinstance(patterns, dict) else []
    extras = [k for k in value if k not in known and not any(r.search(k) for r in regexes)]
    allowed = ", ".join(known) if known else "none"
    fields = ", ".join(_join(where, k) for k in extras) or where
    verb = "is" if len(extras) == 1 else "are"
    return f"{fields} {verb} not allowed (allowed fields: {allowed})"
