"""Public fakes for testing code that uses toolnexus_async, without a network or a key.

``ScriptedModel`` plays a model for :meth:`LlmClient.in_process`: it returns the replies
it was given, in order, and records every transcript it was sent::

    model = ScriptedModel(
        reply(tool_call("add", {"a": 1, "b": 2}, id="c1")),
        "The sum is 3.",
    )
    client = LlmClient.in_process(model)
    result = await client.run("add 1 and 2", toolkit)
    assert model.requests[1][-1] == ToolReturn("c1", "add", "3")

A reply may also be a function of the transcript, for a model that reacts to what it sees.

``MockTransport`` fakes a provider *over HTTP*, without a socket: give it to
``LlmClient(..., transport=MockTransport(handler))`` and ``handler(request)`` answers each
request the client sends, in the provider's own JSON, so the wire style's encoding and
decoding, the error mapping and the retries are all exercised::

    def handler(request: HttpRequest) -> HttpResponse:
        return json_response({"choices": [{"message": {"content": "hi"}}]})

    client = LlmClient("https://api.example.com/v1", model="m", api_key="sk-test-key",
                       transport=MockTransport(handler))
"""

from __future__ import annotations

import inspect
import itertools
import json
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping
from typing import Any

import anyio

from ._core.errors import TransportError, UsageError
from ._core.http import HttpRequest, HttpResponse
from ._core.messages import AssistantMessage, Message, ToolCall
from ._core.types import Tool

__all__ = (
    "MockTransport",
    "ScriptedModel",
    "json_response",
    "reply",
    "sse_response",
    "tool_call",
)

_ids = itertools.count(1)

Scripted = AssistantMessage | str | Callable[[list[Message]], AssistantMessage | str]


def tool_call(
    name: str, arguments: Mapping[str, Any] | None = None, *, id: str | None = None
) -> ToolCall:
    """A tool call as a model would send it; ids are generated unless given."""
    return ToolCall(id or f"call_{next(_ids)}", name, dict(arguments or {}))


def reply(*parts: str | ToolCall | None) -> AssistantMessage:
    """An assistant message: its strings are the text, its ``ToolCall``s the calls.

    ``None`` parts are ignored, so ``reply(None, call)`` is the same as ``reply(call)``.
    """
    texts: list[str] = []
    calls: list[ToolCall] = []
    for part in parts:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, ToolCall):
            calls.append(part)
        elif part is not None:
            raise TypeError(f"reply() takes strings and ToolCalls, not {type(part).__name__}")
    return AssistantMessage("".join(texts) if texts else None, tuple(calls))


class ScriptedModel:
    """A ``generate`` function for :meth:`LlmClient.in_process` that follows a script."""

    def __init__(self, *replies: Scripted) -> None:
        self._replies = list(replies)
        self.requests: list[list[Message]] = []
        self.tools_seen: list[list[str]] = []

    @property
    def remaining(self) -> int:
        """Replies not yet played."""
        return len(self._replies) - len(self.requests)

    async def __call__(self, messages: list[Message], tools: list[Tool]) -> AssistantMessage | str:
        index = len(self.requests)
        self.requests.append(messages)
        self.tools_seen.append([t.name for t in tools])
        if index >= len(self._replies):
            raise AssertionError(
                f"ScriptedModel was asked for reply {index + 1} but has only {len(self._replies)}"
            )
        scripted = self._replies[index]
        return scripted(messages) if callable(scripted) else scripted


Handler = Callable[
    [HttpRequest], HttpResponse | Mapping[str, Any] | Awaitable[HttpResponse | Mapping[str, Any]]
]


def json_response(
    data: object, status: int = 200, headers: Mapping[str, str] | None = None
) -> HttpResponse:
    """A reply whose body is ``data`` as JSON."""
    return HttpResponse(
        status,
        {"Content-Type": "application/json", **(headers or {})},
        json.dumps(data).encode(),
    )


def sse_response(events: Iterable[object], status: int = 200) -> HttpResponse:
    """A streamed reply (``text/event-stream``) carrying ``events`` in order.

    Each event is a JSON object (sent as ``data: {...}``), a ``(name, object)`` pair (sent
    with ``event: name``, as Anthropic names its events), or a string sent as the data line
    verbatim (``"[DONE]"``, which ends an OpenAI stream).
    """
    lines: list[str] = []
    for event in events:
        if isinstance(event, tuple):
            name, data = event
            lines.append(f"event: {name}\ndata: {json.dumps(data)}\n\n")
        elif isinstance(event, str):
            lines.append(f"data: {event}\n\n")
        else:
            lines.append(f"data: {json.dumps(event)}\n\n")
    return HttpResponse(status, {"Content-Type": "text/event-stream"}, "".join(lines).encode())


class MockTransport:
    """A :class:`~toolnexus_async.Transport` that answers every request from ``handler``.

    ``handler(request)``, plain or async, returns an :class:`HttpResponse` (see
    :func:`json_response` and :func:`sse_response`) or a plain mapping, sent as a 200 JSON
    reply; it may raise :class:`TransportError` to play a connection that failed. The
    request's ``timeout`` is applied as a real transport would (its passing is a
    ``TransportError``). A streamed reply is handed over in pieces of ``chunk_size`` bytes,
    so that decoders meet events cut in the middle, as on a real network.

    Attributes:
        requests: every request sent, in order; :meth:`body` decodes one's JSON.
    """

    def __init__(self, handler: Handler, *, chunk_size: int = 7) -> None:
        if not callable(handler):
            raise UsageError(f"handler must be callable, got {type(handler).__name__}")
        if chunk_size < 1:
            raise UsageError(f"chunk_size must be at least 1, got {chunk_size}")
        self._handler = handler
        self._chunk = chunk_size
        self.requests: list[HttpRequest] = []
        self.closed = False

    def __repr__(self) -> str:
        return f"<MockTransport requests={len(self.requests)}>"

    def body(self, index: int = -1) -> Any:
        """The JSON body of request number ``index`` (the last by default)."""
        return json.loads(self.requests[index].content)

    async def _answer(self, request: HttpRequest) -> HttpResponse:
        if self.closed:
            raise UsageError("this transport is closed; create a new LlmClient")
        self.requests.append(request)
        with anyio.move_on_after(request.timeout if request.timeout is not None else float("inf")):
            reply = self._handler(request)
            if inspect.isawaitable(reply):
                reply = await reply
            if isinstance(reply, HttpResponse):
                return reply
            if isinstance(reply, Mapping):
                return json_response(dict(reply))
            raise UsageError(
                f"the handler returned {type(reply).__name__}; return an HttpResponse "
                "(json_response, sse_response) or a mapping"
            )
        raise TransportError(f"{request.method} {request.url} timed out after {request.timeout} s")

    async def send(self, request: HttpRequest) -> HttpResponse:
        reply = await self._answer(request)
        content = reply.content
        if content is not None and len(content) > request.max_bytes:
            # What a real transport does: it stops reading at the cap.
            return HttpResponse(reply.status, reply.headers, None)
        return reply

    async def stream(self, request: HttpRequest) -> AsyncGenerator[HttpResponse | bytes, None]:
        reply = await self._answer(request)
        content = reply.content or b""
        if not 200 <= reply.status < 300:
            yield reply
            return
        yield HttpResponse(reply.status, reply.headers)
        for start in range(0, len(content), self._chunk):
            yield content[start : start + self._chunk]
            await anyio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        self.closed = True
