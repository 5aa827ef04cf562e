"""``define_tool``: a Python function becomes a :class:`~toolnexus_async.Tool`.

Rules of this module:

- The input schema is inferred from the type hints, the description from the docstring
  (first paragraph), and each parameter's description from a Google-style ``Args:`` section
  or an ``Annotated[T, "text"]`` hint (how: :mod:`._describe`).
- A parameter typed ``ToolContext`` (or ``ToolContext | None``), or an unannotated one named
  ``ctx``, receives the call's context and is not part of the schema.
- A returned ``str`` is an ok result, a returned ``ToolResult`` passes through (so a
  function can suspend), anything else is returned as JSON; a raised exception becomes an
  error result naming it. Wrong arguments become an error result too, before the function
  runs.
- A plain (non-async) function runs inline on the event loop: keep it quick, or pass
  ``blocking=True`` to run it in a worker thread.
- A function whose first parameter is ``self`` or ``cls`` (``@define_tool`` on a method in
  a class body) is refused: the model would be asked for ``self`` as a JSON argument.
  Binding it would need a tool per instance behind the user's back; instead the error says
  to pass the bound method (``define_tool(obj.method)``), which works as is.
- A tool the model cannot read about is a silent mistake: no docstring and no
  ``description=`` warns (``UserWarning``) when the tool is built, rather than sending an
  empty description. A warning, not an error, so quick scripts and tests still run.
- ``on_refused=`` is the tool's optional ``refused(args, ctx)`` (``Toolkit.refused``): an
  ``async`` callable, checked when the tool is built; without it ``refused`` is None, which
  the toolkit treats as absent.
"""

from __future__ import annotations

import enum
import functools
import inspect
import json
import typing
import warnings
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence, Set
from typing import Any, overload

import anyio.to_thread

from .._core.errors import UsageError
from .._core.types import ToolContext, ToolResult, check_tool_name
from .._engine.guard import guards_itself, raised
from .._engine.toolkit import makes_context
from ._describe import is_context, json_value, parse_docstring, schema_for

__all__ = ("FunctionTool", "define_tool")


def _as_result(value: object) -> ToolResult:
    if type(value) is str:
        return ToolResult.ok(value)
    if isinstance(value, ToolResult):
        return value
    if isinstance(value, str):
        return ToolResult.ok(value)
    if value is None:
        return ToolResult.ok("")
    return ToolResult.ok(json.dumps(value, default=str))


OnRefused = Callable[[dict[str, Any], ToolContext], Awaitable[None]]


def _start_call(
    tool: FunctionTool, args: dict[str, Any], call_id: str, run_id: str, turn: int | None
) -> Coroutine[Any, Any, ToolResult]:
    """A run's call of ``tool`` (``makes_context``): its context made only for a function
    that takes one (or, in ``_run``, when it raises)."""
    if tool._context_param is None:
        return tool._run(args, None, call_id, run_id, turn)
    return tool._run(
        args, ToolContext(None, call_id, run_id, tool.name, None, turn), None, None, None
    )


@makes_context(_start_call)
@guards_itself
class FunctionTool:
    """A tool backed by a Python function; build it with :func:`define_tool`."""

    source = "native"

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        blocking: bool = False,
        on_refused: OnRefused | None = None,
    ) -> None:
        if not callable(fn):
            raise UsageError(f"define_tool needs a function, got {fn!r}")
        self.fn = fn
        self.name: str = check_tool_name(name if name is not None else getattr(fn, "__name__", ""))
        summary, arg_docs = parse_docstring(inspect.getdoc(fn) or "")
        self.description = description if description is not None else summary
        if not self.description:
            warnings.warn(
                f"tool {self.name!r} has no description: the model only sees its name. "
                f"Give the function a docstring, or pass define_tool(description=...)",
                UserWarning,
                stacklevel=3,
            )
        self._is_async = inspect.iscoroutinefunction(fn)
        if blocking and self._is_async:
            raise UsageError(f"tool {self.name!r}: blocking=True is for plain functions only")
        self._blocking = blocking
        try:
            hints = typing.get_type_hints(fn, include_extras=True)
        except Exception as exc:
            raise UsageError(f"tool {self.name!r}: cannot read its type hints: {exc}") from exc
        properties: dict[str, Any] = {}
        required: list[str] = []
        self._context_param: str | None = None
        self._enums: dict[str, type[enum.Enum]] = {}
        self._params: set[str] = set()
        self._accepts_extra = False
        parameters = list(inspect.signature(fn).parameters.values())
        if parameters and parameters[0].name in ("self", "cls"):
            raise UsageError(
                f"tool {self.name!r}: its first parameter is {parameters[0].name!r}, so the "
                f"model would be asked for it as an argument. @define_tool does not bind "
                f"methods: build the tool from the bound method, define_tool(obj.{self.name})"
            )
        for param in parameters:
            hint = hints.get(param.name, param.annotation)
            if is_context(hint) or (param.name == "ctx" and hint is param.empty):
                self._context_param = param.name
                continue
            if param.kind is param.VAR_KEYWORD:
                self._accepts_extra = True
                continue
            if param.kind in (param.VAR_POSITIONAL, param.POSITIONAL_ONLY):
                raise UsageError(
                    f"tool {self.name!r}: parameter {param.name!r} cannot be passed by "
                    "keyword; tool arguments are named"
                )
            schema = schema_for(hint)
            base = typing.get_args(hint)[0] if typing.get_origin(hint) is typing.Annotated else hint
            if isinstance(base, type) and issubclass(base, enum.Enum):
                self._enums[param.name] = base
            if param.name in arg_docs and "description" not in schema:
                schema["description"] = arg_docs[param.name]
            if param.default is param.empty:
                required.append(param.name)
            elif json_value(param.default):
                schema["default"] = param.default
            properties[param.name] = schema
            self._params.add(param.name)
        self._required = tuple(required)
        self._arity = len(required)  # _check's, on every call
        # _run's usual call hands fn the arguments dict as it came: no enum to convert, no
        # context to add (one test per call instead of three).
        self._as_given = not self._enums and self._context_param is None
        self.input_schema: dict[str, Any] = {"type": "object", "properties": properties}
        if required:
            self.input_schema["required"] = required
        if not self._accepts_extra:
            self.input_schema["additionalProperties"] = False
        functools.update_wrapper(self, fn, updated=())
        if on_refused is not None and not inspect.iscoroutinefunction(on_refused):
            raise UsageError(
                f"tool {self.name!r}: on_refused must be an async function "
                f"(async def ...(args, ctx)), got {on_refused!r}"
            )
        # Set after update_wrapper, which copies fn's attributes onto the tool.
        self.refused: OnRefused | None = on_refused

    def __repr__(self) -> str:
        return f"<FunctionTool {self.name!r} source='native'>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the underlying function directly, as if it were not decorated."""
        return self.fn(*args, **kwargs)

    def execute(
        self, args: dict[str, Any], ctx: ToolContext | None = None
    ) -> Coroutine[Any, Any, ToolResult]:
        """Run the function with ``args``; every failure is an error result.

        Every exception (but a cancellation) is one, wherever it comes from: the toolkit
        awaits this without a guard of its own (``guards_itself``). Not a coroutine function
        itself: it hands back the coroutine to await, which a run's call may also start
        without a context made for it (``makes_context``).
        """
        return self._run(args, ctx, None, None, None)

    async def _run(
        self,
        args: dict[str, Any],
        ctx: ToolContext | None,
        call_id: str | None,
        run_id: str | None,
        turn: int | None,
    ) -> ToolResult:
        """:meth:`execute`'s work; ``call_id``, ``run_id`` and ``turn``: the parts of the
        context a run's call has not made (``ctx`` is then None), made if it raises."""
        raw: object = args  # a direct caller may pass anything
        if type(raw) is not dict and not isinstance(raw, Mapping):
            return ToolResult.error(f"{self.name}: arguments must be an object")
        try:
            problem = self._check(args)
            if problem is not None:
                return ToolResult.error(f"{self.name}: {problem}")
            # fn(**kwargs) gets a dict of its own: a copy here only when this one is changed.
            kwargs = args
            if not self._as_given:
                kwargs = dict(args)
                for key, kind in self._enums.items():
                    if key in kwargs:
                        try:
                            kwargs[key] = kind(kwargs[key])
                        except ValueError:
                            allowed = ", ".join(repr(m.value) for m in kind)
                            return ToolResult.error(
                                f"{self.name}: {key!r} must be one of {allowed}"
                            )
                if self._context_param is not None:
                    kwargs[self._context_param] = ctx
            if self._is_async:
                value = await self.fn(**kwargs)
            elif self._blocking:
                value = await anyio.to_thread.run_sync(functools.partial(self.fn, **kwargs))
            else:
                value = self.fn(**kwargs)
                if inspect.isawaitable(value):
                    value = await value
            return _as_result(value)
        except Exception as exc:
            if ctx is None and run_id is not None:
                ctx = ToolContext(None, call_id, run_id, self.name, None, turn)
            return raised(self.name, exc, ctx)

    def _check(self, args: Mapping[str, Any]) -> str | None:
        # By index, and no key view unless optional parameters were given: each view and
        # each iterator (over a tuple too) is an object the collector tracks, made on every
        # call (see the issue 41 C = 500 section of performance.md).
        # The messages are written by functions of their own: a comprehension here would
        # make this frame keep ``self`` and ``args`` in cells, two tracked objects a call.
        required = self._required
        arity = self._arity
        for index in range(arity):
            if required[index] not in args:
                return _missing(required, args)
        if len(args) == arity or self._accepts_extra:
            return None  # every key is a required parameter's
        if not args.keys() <= self._params:
            return _unexpected(self._params, args)
        return None


def _missing(required: Sequence[str], args: Mapping[str, Any]) -> str:
    missing = [name for name in required if name not in args]
    return f"missing required argument(s): {', '.join(missing)}"


def _unexpected(params: Set[str], args: Mapping[str, Any]) -> str | None:
    extra = [key for key in args if key not in params]
    if not extra:
        return None
    takes = ", ".join(sorted(params)) or "none"
    return f"unexpected argument(s): {', '.join(extra)}; it takes {takes}"


@overload
def define_tool(fn: Callable[..., Any], /) -> FunctionTool: ...


@overload
def define_tool(
    *,
    name: str | None = None,
    description: str | None = None,
    blocking: bool = False,
    on_refused: OnRefused | None = None,
) -> Callable[[Callable[..., Any]], FunctionTool]: ...


def define_tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    blocking: bool = False,
    on_refused: OnRefused | None = None,
) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """Turn a function into a tool; usable bare or with options.

    >>> @define_tool
    ... async def add(a: int, b: int) -> str:
    ...     '''Add two integers.'''
    ...     return str(a + b)
    >>> add.name, add.description, add.input_schema["required"]
    ('add', 'Add two integers.', ['a', 'b'])
    """
    if fn is not None:
        return FunctionTool(
            fn, name=name, description=description, blocking=blocking, on_refused=on_refused
        )

    def decorate(f: Callable[..., Any]) -> FunctionTool:
        return FunctionTool(
            f, name=name, description=description, blocking=blocking, on_refused=on_refused
        )

    return decorate
