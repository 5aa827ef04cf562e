"""Where a model reply comes from: an HTTP provider (codec + transport) or a Python function.

Rule of this module: a model turns a transcript and a toolkit into one
:class:`~toolnexus_async._loop.ModelReply`; it does not loop, execute tools or keep state
between requests. The client drives it.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from ._codecs import Codec, SSEParser
from ._errors import ProtocolError, ProviderError, ReplyTooLarge
from ._loop import ModelReply
from ._messages import AssistantMessage, Message
from ._toolkit import Toolkit
from ._transport import Transport
from ._types import Tool

__all__ = ("FunctionModel", "Generate", "HttpModel", "Model")

Generate = Callable[
    [list[Message], list[Tool]],
    Awaitable[AssistantMessage | ModelReply | str] | AssistantMessage | ModelReply | str,
]


OnText = Callable[[str], None]


class Model(Protocol):
    name: str
    # True when the model applies the request time limit itself (an HTTP session timeout).
    enforces_timeout: bool

    def request(self, messages: Sequence[Message], toolkit: Toolkit) -> Awaitable[ModelReply]: ...

    async def stream(
        self, messages: Sequence[Message], toolkit: Toolkit, on_text: OnText
    ) -> ModelReply: ...

    async def aclose(self) -> None: ...


class HttpModel:
    """A provider reached over HTTP in one wire style."""

    __slots__ = ("_codec", "_extra", "_headers", "_max_tokens", "_transport", "_url", "name")

    enforces_timeout = True

    def __init__(
        self,
        codec: Codec,
        transport: Transport,
        *,
        base_url: str,
        model: str,
        headers: Mapping[str, str],
        max_tokens: int | None,
        extra_body: dict[str, Any] | None,
    ) -> None:
        self._codec = codec
        self._transport = transport
        self._url = codec.endpoint(base_url)
        self._headers = {**headers, "Content-Type": "application/json"}
        self._max_tokens = max_tokens
        self._extra = extra_body
        self.name = model

    @property
    def url(self) -> str:
        return self._url

    def request(self, messages: Sequence[Message], toolkit: Toolkit) -> Awaitable[ModelReply]:
        # The transport's coroutine, not one of our own: a frame fewer per request in flight.
        # And the body goes straight into the call, not into a local: no frame of this run
        # holds its dicts while the request is in flight, so the garbage collector, which
        # visits every live container of every run in flight, does not visit them over and
        # over.
        return self._transport.post_json(
            self._url,
            self._headers,
            self._codec.encode(
                messages, toolkit, model=self.name, max_tokens=self._max_tokens, extra=self._extra
            ),
            self._codec.decode,
        )

    async def stream(
        self, messages: Sequence[Message], toolkit: Toolkit, on_text: OnText
    ) -> ModelReply:
        """A streamed request: ``on_text`` gets the text as it arrives; the reply at the end.

        A stream that breaks off or carries a provider error raises; a truncated reply is
        never returned.
        """
        parser = SSEParser()
        decoder = self._codec.stream_decoder(self._url)
        failure: ProviderError | ProtocolError | None = None
        chunks = self._transport.stream(
            self._url,
            self._headers,
            self._codec.encode(
                messages,
                toolkit,
                model=self.name,
                max_tokens=self._max_tokens,
                extra=self._extra,
                stream=True,
            ),
        )
        try:
            async with contextlib.aclosing(chunks):
                async for chunk in chunks:
                    for event in parser.feed(chunk):
                        for delta in decoder.feed(event):
                            on_text(delta.text)
                    if decoder.done:
                        break
                return decoder.finish()
        except (ProviderError, ProtocolError) as exc:
            failure = exc
        # Decoders quote what the provider sent, which may echo the key back: rebuilt
        # scrubbed, outside the except block so the original is not even __context__.
        scrub = self._transport.scrub
        if isinstance(failure, ReplyTooLarge):
            raise ReplyTooLarge(str(failure), limit=failure.limit)  # built scrubbed
        if isinstance(failure, ProviderError):
            raise ProviderError(
                failure.status, scrub(failure.body), failure.url, headers=failure.headers
            )
        raise ProtocolError(scrub(str(failure)))

    async def aclose(self) -> None:
        await self._transport.aclose()


class FunctionModel:
    """A model played by a Python function: ``generate(messages, tools)`` returns one reply.

    The reply may be an :class:`AssistantMessage`, a plain string (a final text), or a full
    ``ModelReply`` when the function wants to report usage.
    """

    __slots__ = ("_generate", "name")

    enforces_timeout = False

    def __init__(self, generate: Generate, model: str) -> None:
        self._generate = generate
        self.name = model

    async def request(self, messages: Sequence[Message], toolkit: Toolkit) -> ModelReply:
        # A copy: the function may keep or mutate what it gets without touching the run.
        reply: object = self._generate(list(messages), toolkit.tools())
        if inspect.isawaitable(reply):
            reply = await reply
        if isinstance(reply, ModelReply):
            return reply
        if isinstance(reply, AssistantMessage):
            return ModelReply(reply, model=self.name, raw=reply)
        if isinstance(reply, str):
            return ModelReply(AssistantMessage(reply), model=self.name, raw=reply)
        raise ProtocolError(
            f"in-process model {self.name!r} returned {type(reply).__name__}; "
            "return an AssistantMessage, a ModelReply or a str"
        )

    async def stream(
        self, messages: Sequence[Message], toolkit: Toolkit, on_text: OnText
    ) -> ModelReply:
        """The function's reply; its text is handed to ``on_text`` in one piece."""
        reply = await self.request(messages, toolkit)
        if reply.message.text:
            on_text(reply.message.text)
        return reply

    async def aclose(self) -> None:
        return None
