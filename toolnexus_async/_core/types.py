"""The data a tool and its run exchange: results, the call's context, the tool protocol.

Rule of this module: plain values only. Nothing here awaits, does I/O or knows about a
model; the loop and the client build on these types, never the other way round. The wire
data a suspension carries, :class:`Request` and :class:`Answer`, is in ``_wire`` and is
named here too, since a tool's result and context carry it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

import attrs

from .errors import UsageError
from .fastinit import builder, fast_init
from .wire import Answer, Request, check_optional, new_request_id, wrong_type

__all__ = (
    "Answer",
    "HaltRun",
    "Request",
    "Tool",
    "ToolContext",
    "ToolResult",
    "ToolSource",
    "pending_of",
)

# The strictest rule among providers (OpenAI function names): a name that passes here is
# accepted by every wire style.
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def check_tool_name(name: object) -> str:
    """``name`` if every provider accepts it as a tool name, else :class:`UsageError`."""
    if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
        raise UsageError(
            f"tool name {name!r} must be 1-64 letters, digits, '_' or '-' "
            "(the rule every provider accepts)"
        )
    return name


@fast_init
@attrs.frozen
class ToolResult:
    """What a tool hands back: text for the model, an error flag, optional metadata.

    A *suspension* is a result too: :meth:`pending` wraps a :class:`Request` in
    ``metadata["pending"]``; the run loop notices it and either awaits ``wait_for`` or halts.

    >>> ToolResult.ok("sent")
    ToolResult(output='sent', is_error=False, metadata=None)
    >>> r = ToolResult.auth_required("https://example.com/login", "Log in first")
    >>> r.output
    'Log in first\\nhttps://example.com/login'
    >>> pending_of(r).kind
    'authorization'
    """

    output: str
    is_error: bool = False
    metadata: dict[str, Any] | None = None

    def __attrs_post_init__(self) -> None:
        # Plain checks, not attrs validators: a result is built on every tool call. The
        # usual result is checked in one expression, as Request's is; only a value that
        # fails it is looked at field by field.
        output, is_error, metadata = self.output, self.is_error, self.metadata
        if (
            type(output) is str
            and (is_error is False or is_error is True)
            and (metadata is None or type(metadata) is dict)
        ):
            return
        if not isinstance(self.output, str):
            raise wrong_type("ToolResult", "output", "a str", self.output)
        if self.is_error is not True and self.is_error is not False:
            raise wrong_type("ToolResult", "is_error", "True or False", self.is_error)
        if self.metadata is not None and not isinstance(self.metadata, dict):
            raise wrong_type("ToolResult", "metadata", "a dict or None", self.metadata)

    @classmethod
    def ok(cls, text: str, metadata: dict[str, Any] | None = None) -> ToolResult:
        """A successful result."""
        return _made(cls, text, False, metadata)

    @classmethod
    def error(cls, text: str, metadata: dict[str, Any] | None = None) -> ToolResult:
        """A failed result; the model sees ``text`` and decides what to do."""
        return _made(cls, text, True, metadata)

    @classmethod
    def pending(cls, request: Request) -> ToolResult:
        """A suspension: the tool cannot finish until ``request`` is answered.

        ``is_error`` is true (there is no usable answer yet); ``output`` is the prompt,
        followed by the URL on its own line when there is one. An empty ``request.id`` is
        replaced by a generated unique id.
        """
        if not request.id:
            request = attrs.evolve(request, id=new_request_id())
        text = request.prompt if request.url is None else f"{request.prompt}\n{request.url}"
        return _made(cls, text, True, {"pending": request})

    @classmethod
    def auth_required(
        cls, url: str, prompt: str = "Sign in to continue, then try again."
    ) -> ToolResult:
        """A suspension of kind ``"authorization"``: someone must log in at ``url``."""
        return cls.pending(Request("", "authorization", prompt, url=url))

    @staticmethod
    def pending_of(x: object) -> Request | None:
        """The :class:`Request` carried by a suspended result or a halted run, else None."""
        return pending_of(x)


_tool_result: Callable[[str, bool, dict[str, Any] | None], ToolResult] = builder(ToolResult)


def _made(
    cls: type[ToolResult], output: str, is_error: bool, metadata: dict[str, Any] | None
) -> ToolResult:
    # ToolResult itself by its builder (no type.__call__, no move to the twin: a result is
    # made on every tool call); a subclass, which may take other arguments, by its own
    # constructor. tests/test_types.py holds both to the constructor's value.
    if cls is ToolResult:
        return _tool_result(output, is_error, metadata)
    return cls(output, is_error, metadata)


def pending_of(x: object) -> Request | None:
    """The :class:`Request` carried by a ``ToolResult`` or a halted ``RunResult``, else None.

    >>> pending_of(ToolResult.ok("fine")) is None
    True
    """
    if isinstance(x, ToolResult):
        return request_in(x)
    # A RunResult (duck-typed so this module does not import the run machinery).
    if getattr(x, "status", None) == "pending":
        found = getattr(x, "pending", None)
        return found if isinstance(found, Request) else None
    return None


def request_in(result: ToolResult) -> Request | None:
    """The suspension in ``result``, if any (the hot-path form of :func:`pending_of`)."""
    meta = result.metadata
    if meta is None:
        return None
    found = meta.get("pending")
    return found if isinstance(found, Request) else None


class HaltRun(Exception):
    """Raised by a ``wait_for`` that will not wait any longer (a signal, not a failure).

    Not a :class:`ToolnexusError`: it is not an error, and ``except ToolnexusError`` around
    a run must not swallow it.

    The suspended call stays suspended and the run halts with ``status == "pending"``, as if
    no ``wait_for`` were set, so the host can store it and resume it later. The
    :class:`~toolnexus_async.Inbox` raises it for runs parked longer than ``park_timeout``.
    """


@fast_init
@attrs.frozen
class ToolContext:
    """What the run loop tells a tool about the call it is executing.

    A tool called directly (outside a run) may receive ``ctx=None`` and must cope.

    Attributes:
        answer: set only on the retry after ``wait_for`` resolved this call's suspension.
        call_id: the model's id for this tool call.
        run_id: the id of the run the call belongs to.
        tool_name: the name the model called.
        request: on that retry, the request ``answer`` answers (what the tool asked, its
            ``data`` included), so a tool can check that what was approved is what it is
            about to do.
        turn: the number of the model request that asked for the call (1 for the first).
        idempotency_key: see the property.
    """

    answer: Answer | None = None
    call_id: str | None = None
    run_id: str | None = None
    tool_name: str | None = None
    request: Request | None = None
    turn: int | None = None

    @property
    def idempotency_key(self) -> str | None:
        """A key for this tool call that is the same every time the call is executed (its
        retry after an answer, a resume in another process, a re-run after a crash) and
        different for any other call: pass it to an API that deduplicates (a payment API's
        ``Idempotency-Key``) so that a call run twice acts once. ``None`` outside a run.

        >>> ToolContext(call_id="c1", run_id="run_1", turn=1).idempotency_key
        'tnx-c67cf1c53949228854d176dfe24d38dc'
        """
        if self.run_id is None or self.call_id is None or self.turn is None:
            return None
        digest = hashlib.sha256(f"{self.run_id}\0{self.turn}\0{self.call_id}".encode())
        return "tnx-" + digest.hexdigest()[:32]

    def __attrs_post_init__(self) -> None:
        # Built for every tool call: the usual shape is checked in one expression, and
        # only a value that fails it is looked at field by field.
        answer, request = self.answer, self.request
        if (
            (answer is None or type(answer) is Answer)
            and (request is None or type(request) is Request)
            and (self.call_id is None or type(self.call_id) is str)
            and (self.run_id is None or type(self.run_id) is str)
            and (self.tool_name is None or type(self.tool_name) is str)
            and (self.turn is None or type(self.turn) is int)
        ):
            return
        if answer is not None and not isinstance(answer, Answer):
            raise wrong_type("ToolContext", "answer", "an Answer or None", answer)
        if request is not None and not isinstance(request, Request):
            raise wrong_type("ToolContext", "request", "a Request or None", request)
        for name in ("call_id", "run_id", "tool_name"):
            check_optional("ToolContext", name, getattr(self, name), str, "a str")
        turn = self.turn
        if turn is not None and (isinstance(turn, bool) or not isinstance(turn, int)):
            raise wrong_type("ToolContext", "turn", "an int or None", turn)


@runtime_checkable
class Tool(Protocol):
    """Anything with these attributes and an async ``execute`` is a tool; no base class.

    ``input_schema`` is a JSON Schema object describing ``args``. ``source`` says where the
    tool comes from: ``"custom"``, ``"native"``, ``"http"``, ``"builtin"``, ``"mcp"``, ...

    Optional, not part of the protocol's check: ``async def refused(self, args, ctx) ->
    None``, called once (at least once, in a durable run) when the call's own suspension
    ends without an ok answer (declined, cancelled, expired) and the tool will not run
    again for it; ``ctx.answer`` is the refusing answer, ``ctx.request`` its request.
    What it raises is logged and ignored (``Toolkit.refused``).
    """

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def input_schema(self) -> Mapping[str, Any]: ...

    @property
    def source(self) -> str: ...

    async def execute(self, args: dict[str, Any], ctx: ToolContext | None = None) -> ToolResult: ...


def check_tool(tool: object) -> Tool:
    """``tool`` if it has a tool's shape and a valid name, else :class:`UsageError`."""
    missing = [
        attr
        for attr in ("name", "description", "input_schema", "source", "execute")
        if not hasattr(tool, attr)
    ]
    if missing:
        raise UsageError(f"{tool!r} is not a tool: it lacks {', '.join(missing)}")
    assert isinstance(tool, Tool)
    check_tool_name(tool.name)
    if not isinstance(tool.input_schema, Mapping):
        raise UsageError(f"tool {tool.name!r}: input_schema must be a JSON Schema object")
    return tool


@runtime_checkable
class ToolSource(Protocol):
    """Where a toolkit's tools come from: an async context manager that, entered, offers
    its tools (:meth:`tools`) and, left, releases what it opened (sessions, processes).

    A toolkit enters its sources in order when it is entered, and leaves them in reverse.
    Entering a source must either succeed or leave nothing open behind.

    Optional, not part of the protocol's check: ``watch(changed)``, for a *live* source
    whose tools change while it is open (an MCP server's list): the toolkit calls it once,
    before entering the source, and the source calls ``changed()`` whenever :meth:`tools`
    would answer differently. A live source's tool never takes a name another source's
    tool holds; it is left out, with a warning.
    """

    async def __aenter__(self) -> object: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None: ...

    def tools(self) -> Sequence[Tool]:
        """The tools offered now, in a stable order; called after entering."""
        ...
