"""The tool registry: which tools a run may call, where they came from, how they are executed.

Rules of this module:

- Arguments are checked against the tool's input schema before it runs (compiled once per
  schema); a violation is an error result naming the field and the rule.
- A tool never raises across the registry: :meth:`ToolRegistry.execute` turns an exception
  into an error result naming the tool and the exception, and an unknown name into an error
  result naming the tools that do exist. Only cancellation passes through. The same holds
  for :meth:`ToolRegistry.refused`, which tells a tool that its request was refused. The
  exception is logged with its traceback (``tracing.tool_raised``), not only told to the
  model. A tool class that keeps this rule itself (``guards_itself``: ``define_tool``'s)
  is awaited without the registry's guard around it.
- Tools come from :class:`~toolnexus_async.ToolSource` s composed into the registry
  (:meth:`ToolRegistry.compose`), entered in order when the registry is entered and left in
  reverse when it closes (``toolsources``). A source that fails to open closes the ones
  opened before it (and the registry): nothing stays open. A composed registry refuses to
  execute before it is entered, since its tools are not there yet.
- Names are unique. Two sources offering one name when the registry opens is a
  :class:`UsageError` naming both; :meth:`register` refuses a taken name unless told to
  replace it. A *live* source (one whose tools change while it is open: it has
  ``watch``) never takes a taken name: its tool is left out, with a warning, since its list
  may change mid-run, when nobody could handle an error. A live source's tools keep their
  places when its list changes.
- The registry imports no tool source (the engine's layer rule): the built-ins, HTTP and
  MCP sources sit above the engine, and the public :class:`~toolnexus_async.Toolkit`
  (``tools/_standard.py``) is this class plus the standard assembly (``Toolkit.create``).
  The engine takes any registry: it reads ``specs`` and calls ``execute`` and ``refused``.
- The schema adapters (``to_openai`` ...) are the codecs' renderers, handed one tuple of
  the tools that stays the same until the tools change, so the codecs render it once.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Self, TypeVar

from .._core.closing import FlagClosing
from .._core.codecs._tools import render_anthropic, render_gemini, render_openai
from .._core.errors import UsageError
from .._core.types import Tool, ToolContext, ToolResult, ToolSource, check_tool
from .._core.validation import Validator, validator_for
from .guard import GUARDS_ITSELF, guarded, ready
from .toolsources import ToolSources
from .tracing import run_extra

__all__ = ("MAKES_CONTEXT", "ToolRegistry", "makes_context")

log = logging.getLogger("toolnexus_async")


class ToolRegistry(ToolSources, FlagClosing):
    """A set of uniquely named tools from composed sources, executed safely.

    The public :class:`~toolnexus_async.Toolkit` is this class plus the standard assembly;
    build one with ``Toolkit.compose(*sources)`` (or ``Toolkit.create``) and enter it, so
    that every source it opened is closed::

        async with Toolkit.compose(NativeTools(send_payment)) as tk:
            result = await tk.execute("send_payment", {"amount": 30})

    A closed toolkit refuses to execute, to register and to be entered again
    (:class:`UsageError`), as a closed client refuses to run.
    """

    _kind = "toolkit"

    def __init__(self, tools: Iterable[Tool] = (), *, validate: bool = True) -> None:
        self._tools: dict[str, Tool] = {}
        # The tools as one tuple, handed to the codecs every turn; rebuilt when tools change,
        # so a codec can remember its rendering by the tuple's identity.
        self._spec_tuple: tuple[Tool, ...] = ()
        self._validate = validate
        self._validators: dict[str, Validator] = {}
        self._sources: list[ToolSource] = []  # composed, entered by start()
        self._opened: list[ToolSource] = []  # entered, left in reverse by aclose()
        self._instructing: list[ToolSource] = []  # those of them with instructions()
        self._owners: dict[str, ToolSource] = {}  # a source's tool's name -> that source
        self._started = False
        # True while execute must refuse: closed, or composed and not entered yet. One flag,
        # so the hot path reads one attribute.
        self._blocked = False
        self._closed = False
        for tool in tools:
            self.register(tool)

    @classmethod
    def compose(cls, *sources: ToolSource, validate: bool = True) -> Self:
        """A toolkit of the tools ``sources`` offer, in that order, once it is entered
        (``async with``): entering opens the sources, leaving closes them in reverse.

        Args:
            sources: each a :class:`~toolnexus_async.ToolSource` (an async context manager
                with ``tools()``), used by this toolkit only.
            validate: check each call's arguments against the tool's input schema before
                the tool runs; a violation is an error result for the model.

        Raises:
            UsageError: something given is not a tool source, or one is given twice.
        """
        toolkit = cls(validate=validate)
        for source in sources:
            toolkit._add_source(source)
        toolkit._blocked = True
        return toolkit

    async def __aenter__(self) -> Self:
        self._check_open()
        await self.start()
        return self

    def _check_ready(self) -> None:
        self._check_open()
        if self._blocked:
            raise UsageError(
                "this toolkit is not open yet: its sources open when it is entered "
                "(async with toolkit: ...) or started (await toolkit.start())"
            )

    def register(self, tool: Tool, *, replace: bool = False) -> None:
        """Add ``tool``; a taken name is refused unless ``replace=True``."""
        self._check_open()
        tool = check_tool(tool)
        if tool.name in self._tools and not replace:
            raise UsageError(
                f"a tool named {tool.name!r} is already registered; pass replace=True to swap it"
            )
        self._tools[tool.name] = tool
        self._owners.pop(tool.name, None)  # its source still closes the one replaced
        self._spec_tuple = tuple(self._tools.values())
        self._validators.pop(tool.name, None)

    def get(self, name: str) -> Tool | None:
        """The tool called ``name``, or None."""
        return self._tools.get(name)

    def tools(self) -> list[Tool]:
        """Every tool, in registration order."""
        return list(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self._tools)!r})"

    def execute(
        self, name: str, args: dict[str, Any], ctx: ToolContext | None = None
    ) -> Coroutine[Any, Any, ToolResult]:
        """Run the tool ``name``; whatever happens, the answer is a :class:`ToolResult`.

        Not a coroutine itself: the checks run here, and what is handed back to be awaited
        is the tool's own ``execute`` when the tool keeps this rule itself (a
        :func:`guards_itself` class: ``define_tool``'s), else a guard around it. A call
        awaits one frame fewer that way (see the issue 41 C = 500 section of
        docs/performance.md).

        Raises:
            UsageError: the toolkit is closed (its tools' resources are gone), or it was
                composed of sources and is not entered yet.
        """
        tool = self._runnable(name, args)
        if isinstance(tool, ToolResult):
            return ready(tool)  # the error the model is given instead
        if type(tool) in GUARDS_ITSELF:
            return tool.execute(args, ctx)
        return guarded(tool, name, args, ctx)

    def execute_call(
        self, name: str, args: dict[str, Any], call_id: str, run_id: str, turn: int | None
    ) -> Coroutine[Any, Any, ToolResult]:
        """``execute(name, args, ToolContext(None, call_id, run_id, name, None, turn))``,
        the executor's plain call: a tool class that makes that context itself when it is
        needed (:func:`makes_context`: ``define_tool``'s, which needs it only for a function
        that takes one, or when the function raises) is handed its parts instead. A
        context is 7,700 instructions to make (3.11), two per run of issue 41's scenario."""
        tool = self._runnable(name, args)
        if isinstance(tool, ToolResult):
            return ready(tool)
        start = MAKES_CONTEXT.get(type(tool))
        if start is not None:
            return start(tool, args, call_id, run_id, turn)
        ctx = ToolContext(None, call_id, run_id, name, None, turn)
        if type(tool) in GUARDS_ITSELF:
            return tool.execute(args, ctx)
        return guarded(tool, name, args, ctx)

    def _runnable(self, name: str, args: dict[str, Any]) -> Tool | ToolResult:
        """The tool ``name``, if it may run with ``args``; else the error result for the
        model."""
        if self._blocked:
            self._check_ready()
        tool = self._tools.get(name)
        if tool is None:
            return ToolResult.error(self._unknown(name))
        if self._validate:
            problem = self._check_arguments(tool, args)
            if problem is not None:
                return ToolResult.error(problem)
        return tool

    async def refused(self, name: str, args: dict[str, Any], ctx: ToolContext) -> None:
        """Tell the tool ``name`` that its request ``ctx.request`` was refused
        (``ctx.answer``: ``ok=False``) and that it will not run again for this call.

        Calls the tool's optional ``async refused(args, ctx)``; nothing for an unknown tool
        or one without it. Never raises for the tool's sake: an exception from it is logged
        (a warning naming the tool and the exception's type) and ignored. Only cancellation
        passes through.

        Raises:
            UsageError: the toolkit is closed, or composed and not entered yet.
        """
        if self._blocked:
            self._check_ready()
        tell = getattr(self._tools.get(name), "refused", None)
        if tell is None:
            return
        try:
            await tell(args, ctx)
        except Exception as exc:
            # The type only: an exception's text may carry what the tool was sent.
            where = run_extra(ctx.run_id)
            log.warning(
                "tool %r raised %s in refused(); ignored", name, type(exc).__name__, extra=where
            )
            log.debug("tool %r raised in refused()", name, exc_info=True, extra=where)

    def check_arguments(self, name: str, args: dict[str, Any]) -> str | None:
        """What is wrong with calling the tool ``name`` with ``args`` (unknown tool, or
        arguments its ``input_schema`` refuses), or ``None`` when nothing is. Checks even
        when the toolkit was made with ``validate=False``.

        >>> ToolRegistry().check_arguments("nope", {})
        "unknown tool 'nope'; available tools: none"
        """
        tool = self._tools.get(name)
        if tool is None:
            return self._unknown(name)
        return self._check_arguments(tool, args)

    def _unknown(self, name: str) -> str:
        return f"unknown tool {name!r}; available tools: {', '.join(self._tools) or 'none'}"

    def _check_arguments(self, tool: Tool, args: dict[str, Any]) -> str | None:
        check = self._validators.get(tool.name)
        if check is None:
            try:
                check = validator_for(tool.input_schema)
            except UsageError as exc:
                return f"tool {tool.name!r} cannot be called: its input schema is invalid: {exc}"
            self._validators[tool.name] = check
        problem = check(args)
        if problem is None:
            return None
        return f"invalid arguments for tool {tool.name!r}: {problem}; the tool did not run"

    @property
    def specs(self) -> tuple[Tool, ...]:
        """The tools, as the one tuple a model request renders: the same object until the
        tools change, so a codec renders it once (see ``_codecs._tools``).

        Raises:
            UsageError: the toolkit was composed of sources and is not entered yet.
        """
        if self._blocked:
            self._check_ready()
        return self._spec_tuple

    def to_openai(self) -> list[dict[str, Any]]:
        """Chat Completions ``tools``: ``{"type": "function", "function": {...}}`` each."""
        return copy.deepcopy(render_openai(self._spec_tuple))

    def to_anthropic(self) -> list[dict[str, Any]]:
        """Messages API ``tools``: ``{"name", "description", "input_schema"}`` each."""
        return copy.deepcopy(render_anthropic(self._spec_tuple))

    def to_gemini(self) -> list[dict[str, Any]]:
        """Gemini ``functionDeclarations``, with the schema keys Gemini rejects removed."""
        return copy.deepcopy(render_gemini(self._spec_tuple))


# A tool class whose calls in a run may be started from the context's parts (its function's
# value here), making the ToolContext only when it is needed; the exact class, as
# GUARDS_ITSELF. Such a class keeps GUARDS_ITSELF's rule too.
StartCall = Callable[[Any, dict[str, Any], str, str, int | None], Coroutine[Any, Any, ToolResult]]
MAKES_CONTEXT: dict[type, StartCall] = {}

T = TypeVar("T", bound=type)


def makes_context(start: StartCall) -> Callable[[T], T]:
    """Mark a tool class (one that :func:`guards_itself`) as starting a run's call with
    ``start(tool, args, call_id, run_id, turn)``: what ``tool.execute(args,
    ToolContext(None, call_id, run_id, tool.name, None, turn))`` does."""

    def mark(cls: T) -> T:
        if cls not in GUARDS_ITSELF:
            raise TypeError(f"{cls.__name__} must guard itself to make its own context")
        MAKES_CONTEXT[cls] = start
        return cls

    return mark
