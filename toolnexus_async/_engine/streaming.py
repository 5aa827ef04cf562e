"""Streaming a run: typed events as they happen, from one owned producer task.

Rules of this module:

- A stream is a run like any other (same loop, tools, hooks, suspension rule); it only
  reports more: ``text`` and ``reasoning`` deltas, each ``tool_call``, each
  ``tool_result``, each ``pending`` request (before ``wait_for`` is awaited, so a host can
  push a login link at once), ``usage`` per model reply, and a last ``done`` carrying the
  :class:`RunResult`.
- A run that fails raises from the iteration; it never ends with a truncated ``done``.
- The run is a task owned by the stream's task group: leaving ``async with`` early (a
  ``break``, an exception) cancels it, which aborts the HTTP request and the tool tasks.
  Iterating without ``async with`` is refused with a clear error: a plain ``async for``
  that stops early could not close the run's task group from the right task.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Generic, Literal, Self

import anyio
import attrs
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from .._core.errors import UsageError
from .._core.fastinit import fast_init
from .._core.messages import Usage
from .._core.output import WRAP_KEY
from .._core.partial_json import parse_partial
from .._core.results import OutputT, RunResult
from .._core.types import Request

__all__ = (
    "RunStream",
    "StreamDone",
    "StreamEvent",
    "StreamOutput",
    "StreamPending",
    "StreamReasoning",
    "StreamText",
    "StreamToolCall",
    "StreamToolResult",
    "StreamUsage",
    "arguments_preview",
    "output_preview",
    "text_preview",
)


@fast_init
@attrs.frozen
class StreamText:
    """A piece of the model's text; the pieces of one reply join to its text."""

    text: str
    kind: Literal["text"] = attrs.field(default="text", init=False)


@fast_init
@attrs.frozen
class StreamReasoning:
    """A piece of the model's reasoning (Anthropic's thinking, the ``reasoning`` of
    OpenAI-compatible servers), as it arrives; never part of the text."""

    text: str
    kind: Literal["reasoning"] = attrs.field(default="reasoning", init=False)


@fast_init
@attrs.frozen
class StreamToolCall:
    """The model called a tool (emitted when its reply is complete)."""

    id: str
    name: str
    arguments: dict[str, object]
    kind: Literal["tool_call"] = attrs.field(default="tool_call", init=False)


@fast_init
@attrs.frozen
class StreamToolResult:
    """What a call's result is, as the model will see it (never a suspension);
    ``declined``: the call asked and its request was refused, cancelled or expired."""

    id: str
    name: str
    output: str
    is_error: bool
    declined: bool = False
    kind: Literal["tool_result"] = attrs.field(default="tool_result", init=False)


@fast_init
@attrs.frozen
class StreamPending:
    """A call suspended on ``request``; emitted before anyone is asked."""

    request: Request
    call_id: str
    tool: str
    kind: Literal["pending"] = attrs.field(default="pending", init=False)


@fast_init
@attrs.frozen
class StreamUsage:
    """The tokens of one model reply."""

    usage: Usage
    kind: Literal["usage"] = attrs.field(default="usage", init=False)


@fast_init
@attrs.frozen
class StreamOutput:
    """A preview of a run's typed output as its JSON arrives (best effort, not validated):
    the JSON value the reply holds so far (its text, or the output tool's arguments),
    completed where it is cut off. Emitted when it grows, for every method; the validated
    value is ``StreamDone.result.output``."""

    partial: object
    kind: Literal["output"] = attrs.field(default="output", init=False)


@fast_init
@attrs.frozen
class StreamDone(Generic[OutputT]):
    """The run is over; the last event. ``result`` is typed as the run is: a
    ``RunResult[Order]`` for ``stream(..., output_type=Order)``."""

    result: RunResult[OutputT]
    kind: Literal["done"] = attrs.field(default="done", init=False)


# Every event but the last, whatever the run's output type.
StreamStep = (
    StreamText
    | StreamReasoning
    | StreamToolCall
    | StreamToolResult
    | StreamPending
    | StreamUsage
    | StreamOutput
)
if TYPE_CHECKING:
    # Generic for mypy (a RunStream[Order] yields a StreamDone[Order]); at run time the
    # plain union of the classes, so that isinstance(event, StreamEvent) still works.
    StreamEvent = StreamStep | StreamDone[OutputT]
else:
    StreamEvent = StreamStep | StreamDone
Sink = Callable[[StreamEvent], None]


class RunStream(Generic[OutputT]):
    """The events of one run: ``async with client.stream(...) as events: async for e in events``.

    Leaving the ``async with`` stops the run if it is still going. Its last event, a
    :class:`StreamDone`, carries the result typed as the run's output
    (``RunStream[Order]`` for ``output_type=Order``).
    """

    def __init__(self, start: Callable[[Sink], Awaitable[RunResult[OutputT]]]) -> None:
        self._start = start
        self._tg: TaskGroup | None = None
        self._send: MemoryObjectSendStream[StreamEvent] | None = None
        self._receive: MemoryObjectReceiveStream[StreamEvent] | None = None
        self._failure: BaseException | None = None
        self._closed = False

    async def __aenter__(self) -> Self:
        if self._tg is not None or self._closed:
            raise UsageError("a run stream can be entered once")
        self._send, self._receive = anyio.create_memory_object_stream[StreamEvent](math.inf)
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._produce)
        return self

    async def _produce(self) -> None:
        send = self._send
        assert send is not None
        with send:
            try:
                result = await self._start(send.send_nowait)
            except Exception as exc:
                # Kept and raised from the iteration: a task group would wrap it in a group.
                self._failure = exc
                return
            send.send_nowait(StreamDone(result))

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> StreamEvent[OutputT]:
        if self._tg is None and not self._closed:
            raise UsageError(
                "iterate a run stream inside `async with client.stream(...) as events:`; "
                "leaving that block is what stops the run when you stop early"
            )
        receive = self._receive
        if receive is None or self._closed:
            raise StopAsyncIteration
        try:
            return await receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            pass
        failure = self._failure
        if failure is not None:
            self._failure = None
            raise failure
        raise StopAsyncIteration

    async def aclose(self) -> None:
        """Stop the run if it is still going and release everything. Idempotent."""
        await self.__aexit__(None, None, None)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._closed:
            return
        self._closed = True
        tg, self._tg = self._tg, None
        if tg is not None:
            tg.cancel_scope.cancel()
            await tg.__aexit__(None, None, None)
        if self._receive is not None:
            self._receive.close()


def output_preview(sink: Sink, wrapped: bool) -> Callable[[str], None]:
    """Told the output's JSON a piece at a time (one reply's), tells the sink the value
    so far whenever it changed; ``wrapped``: the JSON is ``{"result": value}`` and the
    value is what is shown."""
    text_so_far: list[str] = []
    shown: list[object] = [None]

    def previewing(text: str) -> None:
        text_so_far.append(text)
        # Read again only when a value may have grown: at a quote, a separator or a
        # bracket, not at every letter of a long string.
        if not any(c in text for c in _GROWS):
            return
        partial = parse_partial("".join(text_so_far))
        if wrapped:
            if not isinstance(partial, dict) or WRAP_KEY not in partial:
                return
            partial = partial[WRAP_KEY]
        if partial is not None and partial != shown[0]:
            shown[0] = partial
            sink(StreamOutput(partial))

    return previewing


def text_preview(
    on_text: Callable[[str], None], sink: Sink, wrapped: bool
) -> Callable[[str], None]:
    """``on_text`` that also previews the output the text holds (``"native"`` and
    ``"prompt"`` methods)."""
    preview = output_preview(sink, wrapped)

    def previewing(text: str) -> None:
        on_text(text)
        preview(text)

    return previewing


def arguments_preview(sink: Sink, wrapped: bool) -> Callable[[str, int], None]:
    """What previews the output from the output tool's arguments (the ``"tool"``
    method): the pieces of the reply's first call of that tool; any other is ignored."""
    preview = output_preview(sink, wrapped)
    first: list[int] = []

    def previewing(text: str, index: int) -> None:
        if not first:
            first.append(index)
        elif first[0] != index:
            return
        preview(text)

    return previewing


_GROWS = frozenset('",]}0123456789el')  # "...e" ends true/false, "l" ends null
