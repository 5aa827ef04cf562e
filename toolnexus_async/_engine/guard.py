"""How a tool's execution is guarded: whatever it does, the registry hands back a result.

Rules of this module:

- :func:`guarded` awaits a tool and turns its exception (but a cancellation) into
  :func:`raised`'s error result, and anything it returns that is not a
  :class:`ToolResult` into an error result naming the type.
- :func:`raised` is the one place that error result is made, logged first
  (``tracing.tool_raised``): a tool class that keeps the rule itself
  (:func:`guards_itself`: ``define_tool``'s) makes its errors here too, so the registry
  may await it unguarded, one coroutine fewer per call (see the issue 41 C = 500 section
  of docs/performance.md), and nobody can tell the two apart.
"""

from __future__ import annotations

from typing import Any, TypeVar

from .._core.types import Tool, ToolContext, ToolResult
from .tracing import tool_raised

__all__ = ("GUARDS_ITSELF", "guarded", "guards_itself", "raised", "ready")


async def guarded(
    tool: Tool, name: str, args: dict[str, Any], ctx: ToolContext | None
) -> ToolResult:
    """``tool``'s execution of ``args``, its exception or odd return an error result."""
    try:
        # Typed as object: tools are duck-typed user code and may return anything.
        result: object = await tool.execute(args, ctx)
    except Exception as exc:
        return raised(name, exc, ctx)
    if not isinstance(result, ToolResult):
        return ToolResult.error(f"tool {name!r} returned {type(result).__name__}, not a ToolResult")
    return result


def raised(name: str, exc: Exception, ctx: ToolContext | None) -> ToolResult:
    """The error result the model is given when tool ``name`` raised ``exc``, logged first
    (``tracing.tool_raised``). The registry's guard and a :func:`guards_itself` tool's own
    ``execute`` both make it here, so the two stay alike."""
    tool_raised(name, exc, ctx.run_id if ctx is not None else None)
    return ToolResult.error(f"tool {name!r} raised {type(exc).__name__}: {exc}")


async def ready(result: ToolResult) -> ToolResult:
    """``result`` to be awaited, where the registry answers without running a tool."""
    return result


# The tool classes whose execute keeps the registry's rule itself: every exception but a
# cancellation becomes the error result the registry would make of it, and what comes
# back is a ToolResult. The exact class: a subclass may execute otherwise.
GUARDS_ITSELF: set[type] = set()

T = TypeVar("T", bound=type)


def guards_itself(cls: T) -> T:
    """Mark ``cls`` (a tool class) as keeping :meth:`ToolRegistry.execute`'s rule itself:
    its ``execute`` never raises but for cancellation, turning an exception into
    :func:`raised`'s result, and always returns a :class:`ToolResult`. The registry then
    awaits it without a guard."""
    GUARDS_ITSELF.add(cls)
    return cls
