"""A Python type as the JSON Schema of a run's output, and a JSON value back as that type.

Rule of this module: pure and dependency-free. :func:`describe` turns an output type into
``(name, schema, convert)``: an attrs class, a dataclass, a ``TypedDict``, a pydantic model
(read through its own ``model_json_schema``/``model_validate``, with pydantic imported by
the user, never here), a union of these, or a plain JSON Schema (a ``dict``, whose value
is the JSON itself). ``convert`` builds the typed value from JSON the schema accepted, and
raises ``ValueError``/``TypeError`` when it cannot; the caller tells the model so.

Classes are inlined where they are used; a class that contains itself is refused, since an
inlined schema of it would never end.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from .errors import UsageError

__all__ = ("Convert", "describe")

Convert = Callable[[Any], Any]

_SIMPLE: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _same(value: Any) -> Any:
    return value


def describe(output_type: object) -> tuple[str, dict[str, Any], Convert]:
    """The name, JSON Schema and converter of ``output_type``.

    Raises:
        UsageError: the type cannot be described as JSON Schema (the message names it).
    """
    if isinstance(output_type, Mapping):
        schema = dict(output_type)
        title = schema.get("title")
        return (title if isinstance(title, str) and title else "output"), schema, _same
    schema, convert = _of(output_type, ())
    return _name_of(output_type), schema, convert


def _name_of(hint: object) -> str:
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return "_or_".join(_name_of(a) for a in args)
    name = getattr(hint, "__name__", None)
    return name if isinstance(name, str) else "output"


def _fields(cls: type) -> list[tuple[str, Any, bool]] | None:
    """``(name, hint, required)`` per field of a class we can read, or None."""
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except Exception as exc:  # a forward reference that does not resolve
        raise UsageError(f"cannot read the type hints of {cls.__qualname__}: {exc}") from None
    if attrs.has(cls):
        return [
            (f.alias or f.name, hints.get(f.name, f.type), f.default is attrs.NOTHING)
            for f in attrs.fields(cls)
            if f.init
        ]
    if dataclasses.is_dataclass(cls):
        return [
            (
                f.name,
                hints.get(f.name, f.type),
                f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
            )
            for f in dataclasses.fields(cls)
            if f.init
        ]
    if typing.is_typeddict(cls):
        required: frozenset[str] = getattr(cls, "__required_keys__", frozenset(hints))
        # Read from the hints too: with string annotations (``from __future__ import
        # annotations``) the class's own keys miss a ``NotRequired[...]``.
        return [
            (
                name,
                hint,
                typing.get_origin(hint) is typing.Required
                or (typing.get_origin(hint) is not typing.NotRequired and name in required),
            )
            for name, hint in hints.items()
        ]
    return None


def _is_pydantic(hint: object) -> bool:
    return isinstance(hint, type) and callable(getattr(hint, "model_json_schema", None))


def _of(hint: Any, seen: tuple[type, ...]) -> tuple[dict[str, Any], Convert]:
    if hint is Any:
        return {}, _same
    if hint in _SIMPLE:
        return {"type": _SIMPLE[hint]}, _same
    if hint is None or hint is type(None):
        return {"type": "null"}, _same
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Required, typing.NotRequired):  # a TypedDict's: read by _fields
        return _of(args[0], seen)
    if origin is typing.Annotated:
        schema, convert = _of(args[0], seen)
        texts = [a for a in args[1:] if isinstance(a, str)]
        return ({**schema, "description": " ".join(texts)} if texts else schema), convert
    if origin is typing.Literal:
        return {"enum": list(args)}, _same
    if origin in (typing.Union, types.UnionType):
        return _union(args, seen)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return {"enum": [m.value for m in hint]}, hint
    if origin in (list, set, frozenset, tuple, Sequence) or hint in (list, tuple):
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis) and args:
            raise UsageError(f"a fixed-length tuple ({hint!r}) is not an output field type")
        items, each = _of(args[0], seen) if args else ({}, _same)
        build: Any = origin or hint
        if build is Sequence:
            build = list
        return {"type": "array", "items": items}, lambda v: build(each(x) for x in v)
    if origin in (dict, Mapping) or hint is dict:
        if len(args) == 2:
            values, each = _of(args[1], seen)
            return (
                {"type": "object", "additionalProperties": values},
                lambda v: {k: each(x) for k, x in v.items()},
            )
        return {"type": "object"}, _same
    if _is_pydantic(hint):
        return _pydantic(hint)
    if isinstance(hint, type):
        fields = _fields(hint)
        if fields is not None:
            return _class(hint, fields, seen)
    raise UsageError(
        f"cannot describe {hint!r} as JSON Schema: an output type is an attrs class, a "
        "dataclass, a TypedDict, a pydantic model, a union of these, or a JSON Schema dict"
    )


def _class(
    cls: type, fields: list[tuple[str, Any, bool]], seen: tuple[type, ...]
) -> tuple[dict[str, Any], Convert]:
    if cls in seen:
        raise UsageError(f"{cls.__qualname__} contains itself; a recursive output type is refused")
    inner = (*seen, cls)
    properties: dict[str, Any] = {}
    converters: dict[str, Convert] = {}
    for name, hint, _ in fields:
        properties[name], converters[name] = _of(hint, inner)
    schema: dict[str, Any] = {
        "type": "object",
        "title": cls.__name__,
        "properties": properties,
        "required": [name for name, _, required in fields if required],
        "additionalProperties": False,
    }
    doc = (cls.__doc__ or "").strip()
    if doc and not doc.startswith(f"{cls.__name__}("):  # not the dataclass's generated one
        schema["description"] = doc.split("\n\n", 1)[0]
    plain = typing.is_typeddict(cls)

    def convert(value: Any) -> Any:
        built = {k: converters[k](v) for k, v in value.items() if k in converters}
        return built if plain else cls(**built)

    return schema, convert


def _pydantic(model: Any) -> tuple[dict[str, Any], Convert]:
    schema = model.model_json_schema()
    if not isinstance(schema, dict):
        raise UsageError(f"{model.__qualname__}.model_json_schema() is not a JSON object")
    # Inlined: the schema may be nested in another one, where its "#/$defs/..." would
    # point at the wrong root.
    schema = _inline(schema, schema.pop("$defs", {}), ())
    validate = model.model_validate

    def convert(value: Any) -> Any:
        try:
            return validate(value)
        except ValueError as exc:  # pydantic's ValidationError is one
            raise ValueError(str(exc)) from None

    return schema, convert


def _inline(node: Any, defs: Mapping[str, Any], seen: tuple[str, ...]) -> Any:
    if isinstance(node, list):
        return [_inline(item, defs, seen) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        name = ref.removeprefix("#/$defs/")
        if name in seen or name not in defs:
            raise UsageError(f"output schema: {ref} is recursive or missing; it cannot be inlined")
        rest = {k: v for k, v in node.items() if k != "$ref"}
        return {**_inline(defs[name], defs, (*seen, name)), **_inline(rest, defs, seen)}
    return {k: _inline(v, defs, seen) for k, v in node.items()}


def _union(args: tuple[Any, ...], seen: tuple[type, ...]) -> tuple[dict[str, Any], Convert]:
    from .validation import validator_for  # a union is rare: compiled only when met

    parts = [_of(a, seen) for a in args]
    checks = [(validator_for(dict(schema)), convert) for schema, convert in parts]

    def convert(value: Any) -> Any:
        # The first alternative that accepts the value and converts: the order of the union.
        failure: Exception | None = None
        for check, each in checks:
            if check(value) is None:
                try:
                    return each(value)
                except (TypeError, ValueError) as exc:
                    failure = exc
        raise ValueError(str(failure) if failure else "the value matches none of the forms")

    return {"anyOf": [schema for schema, _ in parts]}, convert
