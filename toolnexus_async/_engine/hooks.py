"""Hooks: the host's code at the four seams of a run, and the approval gate built on them.

Rules of this module:

- A hook may be a plain function or a coroutine function (``on_metric`` only a plain one:
  it is called on the hot path); its return value decides:
  ``before_llm`` returns ``None`` or an :class:`LlmCall` that replaces the messages and/or
  tools for the rest of the run; ``after_llm`` only observes; ``before_tool`` returns
  ``None`` (go on), a ``dict`` (the arguments to use instead) or a ``ToolResult`` (the
  call's result, the tool does not run; a suspension goes through the suspension rule like
  any other); ``after_tool`` returns ``None`` or a replacement ``ToolResult``.
- ``after_tool`` sees results the model will see, never a suspension: it runs on the
  resolved result (after ``wait_for`` and the retry), or not at all when the run halts.
- A tool hook that raises is reported to the model as an error result naming the hook, the
  same way a raising tool is; the other calls of the turn go on.
- ``require_approval`` fails closed: what it is given is checked when it is built (a
  string, an empty list or a non-string name is a :class:`UsageError`), and its names
  against a toolkit as soon as it meets one: ``toolkit=`` at once, else at the start of
  every run through a client whose ``before_tool`` it is (``check_gate``). A name that
  is no tool would guard nothing while its tool, spelt right, runs unasked.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, NoReturn, TypeAlias

import attrs

from .._core.audit import canonical_digest
from .._core.errors import UsageError
from .._core.fastinit import builder
from .._core.messages import Message, ModelReply
from .._core.suspension import GATE
from .._core.types import Answer, Request, Tool, ToolContext, ToolResult
from .._core.wire import new_request_id
from .toolkit import ToolRegistry

# The gate's Request, every field by position (no expiry): built per held call.
_request: Callable[[str, str, str, str | None, dict[str, Any] | None, str | None], Request]
_request = builder(Request)

__all__ = ("GATE", "Hooks", "LlmCall", "require_approval")


@attrs.frozen
class LlmCall:
    """What the next model request will carry; ``before_llm`` may return a changed copy."""

    messages: list[Message]
    tools: list[Tool]


# Evaluated at import (no quotes): type hints of Hooks must resolve from any namespace.
BeforeLlm: TypeAlias = Callable[[LlmCall], Awaitable[LlmCall | None] | LlmCall | None]
AfterLlm: TypeAlias = Callable[[ModelReply, Any], Awaitable[None] | None]
BeforeTool: TypeAlias = Callable[
    [str, dict[str, Any], ToolContext],
    Awaitable[dict[str, Any] | ToolResult | None] | dict[str, Any] | ToolResult | None,
]
# A require_approval gate's verdict, which never awaits and reads of the context only its
# answer: ``(name, args, ctx.answer)``, so the executor need not build a context for it.
PlainBeforeTool: TypeAlias = Callable[
    [str, dict[str, Any], Answer | None], dict[str, Any] | ToolResult | None
]
AfterTool: TypeAlias = Callable[
    [str, dict[str, Any], ToolResult, ToolContext],
    Awaitable[ToolResult | None] | ToolResult | None,
]


def _check_on_metric(_instance: object, _attribute: object, value: Any) -> None:
    if value is None:
        return
    if not callable(value):
        raise UsageError(f"on_metric must be callable or None, got {type(value).__name__}")
    if inspect.iscoroutinefunction(value):
        raise UsageError(
            "on_metric must be a plain function: it is called while the run goes on and "
            "cannot be awaited; hand the event to a queue or a task of your own"
        )


@attrs.frozen
class Hooks:
    """The host's hooks; every one is optional, sync or async.

    Args:
        before_llm: ``(call: LlmCall) -> LlmCall | None`` before each model request.
        after_llm: ``(reply: ModelReply, raw) -> None`` after each reply; ``raw`` is the
            provider's decoded JSON (or the in-process model's return value).
        before_tool: ``(name, args, ctx) -> dict | ToolResult | None`` before each call.
        after_tool: ``(name, args, result, ctx) -> ToolResult | None`` on each final result.
        on_metric: ``(event) -> None``, a plain function (not async: it is called on the
            hot path and must not wait) given every :class:`LlmCallEvent`,
            :class:`ToolCallEvent` and :class:`RunEvent`; an exception from it is logged
            and ignored.
    """

    before_llm: BeforeLlm | None = None
    after_llm: AfterLlm | None = None
    before_tool: BeforeTool | None = None
    after_tool: AfterTool | None = None
    on_metric: Callable[[Any], None] | None = attrs.field(default=None, validator=_check_on_metric)


async def call_hook(hook: Callable[..., Any], *args: Any) -> Any:
    """Call a sync or async hook and return what it returned."""
    value = hook(*args)
    if inspect.isawaitable(value):
        value = await value
    return value


def require_approval(
    tools: Iterable[str],
    *,
    prompt: Callable[[str, Mapping[str, Any]], str] | None = None,
    toolkit: ToolRegistry | None = None,
    editable: bool = False,
) -> BeforeTool:
    """A ``before_tool`` hook that asks for approval before any of ``tools`` runs.

    The call suspends with ``kind="approval"`` (``data`` holds the tool name, the
    arguments and their ``digest``); approved, it runs with those arguments; declined, the
    model is told ``declined/expired: <prompt>`` and the tool never runs. Without
    ``wait_for`` the run halts on the request like on any other.

    ``editable=True`` lets the approver change the arguments: the request says so
    (``data["editable"]``), and an approving answer may carry ``data["arguments"]`` (with
    the request's ``data["digest"]``, naming the call it changes). The tool then runs with
    those, once they pass its ``input_schema`` (else it does not run and the model is told
    why), and the call's :class:`ToolCallRecord` keeps both (``arguments`` and
    ``changed_arguments``). Without it, an answer that changes the arguments is refused
    (:class:`AnswerMismatchError` from an inbox or a store; an error result, nothing run,
    when a ``wait_for`` resolver returns it).

    ``tools`` is a non-empty list of tool names; a string, an empty list or a name that is
    not a string is a :class:`UsageError`. Every name must be a tool: with ``toolkit``
    (a :class:`Toolkit`) that is checked here, and in any case at the start of each run
    through a client whose ``Hooks(before_tool=...)`` this hook is, which fails with a
    :class:`UsageError` naming the tools that exist before anything runs.

    >>> hook = require_approval(["bash"])
    >>> import asyncio
    >>> result = asyncio.run(hook("bash", {"command": "rm -rf build"}, ToolContext()))
    >>> data = result.metadata["pending"].data
    >>> data["tool"], data["arguments"], data["gate"], data["digest"][:7]
    ('bash', {'command': 'rm -rf build'}, 'require_approval', 'sha256:')
    """
    if not isinstance(editable, bool):
        # A string "no" would be truthy: what decides who may change a call fails closed.
        raise UsageError(f"require_approval: editable must be True or False, got {editable!r}")
    gate = _Gate(_guarded(tools), prompt, editable)
    if toolkit is not None:
        check_gate(gate, toolkit)
    return gate


def _guarded(tools: object) -> frozenset[str]:
    """The names ``tools`` lists, or the :class:`UsageError` saying what to pass."""
    how = 'pass a list of tool names, such as require_approval(["bash"])'
    if isinstance(tools, str | bytes):
        # Iterated, "pay" would guard the tools "p", "a" and "y".
        raise UsageError(f"require_approval got the string {tools!r}; {how}")
    try:
        names = list(tools)  # type: ignore[call-overload]
    except TypeError:
        raise UsageError(f"require_approval got {type(tools).__name__}; {how}") from None
    if not names:
        raise UsageError(f"require_approval got no tool names, so it would guard nothing; {how}")
    for name in names:
        if not isinstance(name, str):
            raise UsageError(f"require_approval: a tool name must be a str, got {name!r}; {how}")
    return frozenset(names)


class _Gate:
    """The hook ``require_approval`` returns: callable like any ``before_tool``, and
    knowing its names, so a run can check them against its toolkit (``check_gate``)."""

    __slots__ = ("editable", "guarded", "prompt")

    def __init__(
        self,
        guarded: frozenset[str],
        prompt: Callable[[str, Mapping[str, Any]], str] | None,
        editable: bool = False,
    ) -> None:
        self.guarded = guarded
        self.prompt = prompt
        self.editable = editable

    def __repr__(self) -> str:
        edits = ", editable=True" if self.editable else ""
        return f"require_approval({sorted(self.guarded)!r}{edits})"

    async def __call__(
        self, name: str, args: dict[str, Any], ctx: ToolContext
    ) -> ToolResult | dict[str, Any] | None:
        return self.verdict(name, args, None if ctx is None else ctx.answer)

    def verdict(
        self, name: str, args: dict[str, Any], answer: Answer | None
    ) -> ToolResult | dict[str, Any] | None:
        """What the hook returns for a call whose context's answer is ``answer``, without a
        coroutine or the context (see :func:`plain_before_tool`)."""
        if name not in self.guarded:
            return None
        if answer is not None and answer.ok:
            return self._approved(name, args, answer.data)
        prompt = self.prompt
        text = prompt(name, args) if prompt is not None else f"Allow {name} with {args!r}?"
        # One copy, both shown and digested: the digest is over exactly what data shows.
        shown = dict(args)
        data: dict[str, Any] = {
            "tool": name,
            "arguments": shown,
            # "gate" marks the request as the hook's, not the tool's, so that a run halted
            # on it and resumed (maybe in another process) still runs the tool without
            # handing it this approval as its own answer.
            "gate": GATE,
            "digest": canonical_digest({"tool": name, "arguments": shown}),
        }
        if self.editable:
            data["editable"] = True
        # Its id made here: an empty one would have pending() build the Request twice. By
        # its builder (every field by position): no type.__call__ and no move to the twin.
        return ToolResult.pending(_request(new_request_id(), "approval", text, None, data, None))

    def _approved(
        self, name: str, args: dict[str, Any], data: Mapping[str, Any] | None
    ) -> ToolResult | dict[str, Any] | None:
        """The retry after the approval: the tool runs as shown (``None``), with the
        approver's arguments, or not at all when they may not be changed."""
        if data is None or "arguments" not in data or data["arguments"] == args:
            return None
        changed = data["arguments"]
        # An inbox or a store refuses such an answer; a wait_for resolver's is seen here.
        if not self.editable:
            return ToolResult.error(
                f"the approval of {name!r} changed its arguments, but this require_approval "
                f"gate was not made with editable=True, so only the arguments shown may run; "
                f"nothing ran"
            )
        if not isinstance(changed, dict):
            return ToolResult.error(
                f"the approval of {name!r} gave arguments as {type(changed).__name__}, not "
                f"an object; nothing ran"
            )
        return dict(changed)


def plain_before_tool(hook: object) -> PlainBeforeTool | None:
    """A ``require_approval`` gate's verdict as a plain call ``(name, args, ctx.answer)``,
    which never awaits anything and needs no context, so that the executor makes neither a
    coroutine nor a :class:`ToolContext` for it; None for any other hook."""
    return hook.verdict if isinstance(hook, _Gate) else None


def call_digest(tool: str, args: Mapping[str, Any]) -> str:
    """``sha256:`` over the tool's name and its arguments as canonical JSON (sorted keys, no
    spaces): what a ``require_approval`` request asks about, which an answer may echo in
    ``data["digest"]`` to approve exactly that call."""
    return canonical_digest({"tool": tool, "arguments": dict(args)})


def check_gate(hook: object, toolkit: ToolRegistry) -> None:
    """Raise :class:`UsageError` if ``hook`` is a ``require_approval`` gate naming a tool
    ``toolkit`` does not have; any other hook passes (its names cannot be known)."""
    if not isinstance(hook, _Gate):
        return
    if not isinstance(toolkit, ToolRegistry):
        raise UsageError(
            f"require_approval: toolkit must be a Toolkit, got {type(toolkit).__name__}"
        )
    for name in hook.guarded:  # a loop, not a list: this runs at the start of every run
        if name not in toolkit:
            break
    else:
        return
    _unknown_names(hook, toolkit)


def _unknown_names(hook: _Gate, toolkit: ToolRegistry) -> NoReturn:
    """:func:`check_gate`'s error, in a function of its own: its comprehensions in
    ``check_gate`` would keep ``toolkit`` in a cell, made at the start of every run."""
    unknown = [name for name in hook.guarded if name not in toolkit]
    known = ", ".join(repr(tool.name) for tool in toolkit.tools()) or "none"
    # A source's tools (an MCP server's) are registered when the toolkit is entered.
    hint = " (its sources' tools join when it is entered)" if toolkit.unopened else ""
    raise UsageError(
        f"require_approval names {', '.join(map(repr, sorted(unknown)))}, which the toolkit "
        f"does not have, so it would guard nothing; the tools are: {known}{hint}"
    )
