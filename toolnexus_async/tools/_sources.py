"""Tool sources for a toolkit: your tools and functions, HTTP tools, and the built-ins.

Rules of this module:

- Each source is an async context manager (``Toolkit.compose`` enters it); its tools exist
  from construction, since none of these needs I/O to know them. Leaving a source closes
  what it holds: the built-ins' shared HTTP sessions, and every given tool that has an
  ``aclose`` (an :class:`~toolnexus_async.HttpTool` that made its own session). Leaving is
  idempotent; a closed source cannot be entered again.
- Bad input is refused when the source is built (:class:`UsageError`): something that is
  not a tool, one name given twice, an unknown built-in, an approval policy that is none.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from .._core.closing import FlagClosing
from .._core.errors import UsageError
from .._core.types import Tool, check_tool
from ._session import SharedSession
from .builtin import BUILTIN_NAMES, ApprovalPolicy, Workspace, builtin_tools, check_policy
from .http import HttpTool
from .native import define_tool

__all__ = ("BuiltinTools", "HttpTools", "NativeTools")


async def _close_each(tools: Iterable[object]) -> None:
    """Call every ``aclose`` among ``tools``; one failing does not keep the others open."""
    first: Exception | None = None
    for tool in tools:
        close = getattr(tool, "aclose", None)
        if close is None:
            continue
        try:
            await close()
        except Exception as exc:
            first = first or exc
    if first is not None:
        raise first


def _unique(tools: Iterable[Tool], owner: str) -> tuple[Tool, ...]:
    seen: dict[str, Tool] = {}
    for tool in tools:
        if tool.name in seen:
            raise UsageError(f"{owner} is given two tools named {tool.name!r}")
        seen[tool.name] = tool
    return tuple(seen.values())


class NativeTools(FlagClosing):
    """Your tools (anything with a :class:`~toolnexus_async.Tool`'s shape) and plain or
    ``async`` functions (made tools with :func:`~toolnexus_async.define_tool`), as one
    source. Leaving it closes the tools that have an ``aclose``.

    >>> def add(a: int, b: int) -> int:
    ...     "Add two numbers."
    ...     return a + b
    >>> [tool.name for tool in NativeTools(add).tools()]
    ['add']
    """

    _kind = "tool source"

    def __init__(self, *tools: Tool | Callable[..., Any]) -> None:
        made: list[Tool] = []
        for given in tools:
            if not isinstance(given, Tool) and inspect.isroutine(given):
                made.append(define_tool(given))
            else:  # a tool, or an error naming what it lacks
                made.append(check_tool(given))
        self._tools = _unique(made, type(self).__name__)

    def tools(self) -> Sequence[Tool]:
        return self._tools

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await _close_each(self._tools)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(tool.name for tool in self._tools)})"


class HttpTools(NativeTools):
    """HTTP tools (:func:`~toolnexus_async.http_tool`) as one source; leaving it closes
    the HTTP sessions the tools made for themselves (a borrowed one is its owner's)."""

    def __init__(self, *tools: HttpTool) -> None:
        for tool in tools:
            if not isinstance(tool, HttpTool):
                raise UsageError(f"HttpTools takes tools made by http_tool(), got {tool!r}")
        super().__init__(*tools)


class BuiltinTools(NativeTools):
    """The built-in tools (``bash``, ``read``, ``write``, ``webfetch``, ...) as one source,
    with the settings ``Toolkit.create`` takes (its docstring says what each means).

    Args:
        workdir: the directory the file tools and ``bash`` work in (default: the current
            directory).
        confine: keep the file tools and ``bash``'s working directory under ``workdir``.
        approve: ``"ask"`` (default), ``"allow-all"``, or ``(tool_name, args) -> bool``.
        allow_hosts: non-public hosts and networks ``webfetch`` may reach.
        disable: names of built-ins to leave out; an unknown name is a :class:`UsageError`.

    Leaving it closes the tools that hold a resource, then the HTTP sessions ``webfetch``
    opened.
    """

    def __init__(
        self,
        *,
        workdir: str | os.PathLike[str] | None = None,
        confine: bool = True,
        approve: ApprovalPolicy = "ask",
        allow_hosts: Iterable[str] = (),
        disable: Iterable[str] = (),
    ) -> None:
        approve = check_policy(approve)
        if isinstance(disable, str):
            raise UsageError("disable takes a list of built-in names, not one string")
        off = set(disable)
        unknown = sorted(off - set(BUILTIN_NAMES))
        if unknown:
            raise UsageError(
                f"unknown built-in tool(s): {', '.join(unknown)}; "
                f"the built-ins are {', '.join(BUILTIN_NAMES)}"
            )
        workspace = Workspace(Path.cwd() if workdir is None else workdir, confine=confine)
        self.session = SharedSession()
        every = builtin_tools(workspace, self.session, approve=approve, allow_hosts=allow_hosts)
        super().__init__(*(tool for tool in every if tool.name not in off))

    async def aclose(self) -> None:
        try:
            await super().aclose()
        finally:
            await self.session.aclose()  # idempotent
