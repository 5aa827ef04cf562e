"""Tool specs in each wire style: the schemas a model is told it may call.

Rule of this module: pure renderers, one per style, from any sequence of tool specs
(objects with ``name``, ``description`` and ``input_schema``: every :class:`Tool` is one)
to the provider's JSON. A run sends its tools on every turn, so a renderer remembers the
rendering of the last few sequences it saw, by identity: a toolkit hands out the same tuple
until its tools change. What a cache hands out is shared; callers treat it as read-only,
and :func:`shared_json` gives its JSON text, encoded once.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from ..hotjson import compact

__all__ = ("ToolSpec", "render_anthropic", "render_gemini", "render_openai", "shared_json")

# JSON Schema keys Gemini's function declarations reject.
_GEMINI_DROP = frozenset({"$schema", "additionalProperties", "$defs", "definitions", "$id"})
# Distinct tool sequences remembered per style: a process rarely has more toolkits than this.
_REMEMBER = 32


class ToolSpec(Protocol):
    """What a model is told about a tool."""

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def input_schema(self) -> Mapping[str, Any]: ...


Rendered = list[dict[str, Any]]

# Every rendering a renderer's cache holds now, by id (handed out to every request of its
# toolkit, never changed), and the JSON text of those that were asked for it.
_SHARED: dict[int, Rendered] = {}
_TEXT: dict[int, str] = {}


def shared_json(rendered: object) -> str | None:
    """The compact JSON text of ``rendered`` (:data:`~toolnexus_async._core.hotjson.compact`),
    encoded once, if it is a cached rendering; None for anything else (a rendering of a
    list of specs is new each time, and is not one)."""
    key = id(rendered)
    if rendered is None or _SHARED.get(key) is not rendered:
        return None
    text = _TEXT.get(key)
    if text is None:
        text = _TEXT[key] = compact(rendered)
    return text


def _openai(tool: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": dict(tool.input_schema),
        },
    }


def _anthropic(tool: ToolSpec) -> dict[str, Any]:
    return {
        "name": tool.name,
        "description": tool.description,
        "input_schema": dict(tool.input_schema),
    }


def _gemini(tool: ToolSpec) -> dict[str, Any]:
    return {
        "name": tool.name,
        "description": tool.description,
        "parameters": gemini_schema(tool.input_schema),
    }


def gemini_schema(schema: Any) -> Any:
    """``schema`` without the keys Gemini's function declarations reject, at every depth."""
    if isinstance(schema, Mapping):
        return {k: gemini_schema(v) for k, v in schema.items() if k not in _GEMINI_DROP}
    if isinstance(schema, list):
        return [gemini_schema(v) for v in schema]
    return schema


class _Renderer:
    """One style's renderer, with a small cache keyed by the identity of the sequence."""

    __slots__ = ("_cache", "_one")

    def __init__(self, one: Callable[[ToolSpec], dict[str, Any]]) -> None:
        self._one = one
        # id -> (the sequence, kept so its id cannot be reused; its rendering)
        self._cache: OrderedDict[int, tuple[Sequence[ToolSpec], Rendered]] = OrderedDict()

    def __call__(self, tools: Sequence[ToolSpec]) -> Rendered:
        key = id(tools)
        hit = self._cache.get(key)
        if hit is not None and hit[0] is tools:
            return hit[1]
        rendered = list(map(self._one, tools))  # no comprehension: no cell for self per call
        if isinstance(tools, tuple):  # a list may change under the same id: never cached
            self._cache[key] = (tools, rendered)
            _SHARED[id(rendered)] = rendered
            if len(self._cache) > _REMEMBER:
                _, (_, dropped) = self._cache.popitem(last=False)
                del _SHARED[id(dropped)]
                _TEXT.pop(id(dropped), None)
        return rendered


render_openai = _Renderer(_openai)
"""Chat Completions ``tools``: ``{"type": "function", "function": {...}}`` each."""
render_anthropic = _Renderer(_anthropic)
"""Messages API ``tools``: ``{"name", "description", "input_schema"}`` each."""
render_gemini = _Renderer(_gemini)
"""Gemini ``functionDeclarations``, with the schema keys Gemini rejects removed."""
