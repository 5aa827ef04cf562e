"""Where a model reply comes from: an HTTP provider (codec + transport) or a Python function.

Rule of this module: a model turns a transcript and a toolkit into one
:class:`~toolnexus_async._loop.ModelReply`; it does not loop, execute tools or keep state
between requests. The client drives it.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from ._codecs import Codec
from ._errors import ProtocolError
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


class Model(Protocol):
    name: str

    async def request(self, messages: Sequence[Message], toolkit: Toolkit) -> ModelReply: ...

    async def aclose(self) -> None: ...


class HttpModel:
    """A provider reached over HTTP in one wire style."""

    __slots__ = ("_codec", "_extra", "_headers", "_max_tokens", "_transport", "_url", "name")

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

    async def request(self, messages: Sequence[Message], toolkit: Toolkit) -> ModelReply:
        body = self._codec.encode(
            messages, toolkit, model=self.name, max_tokens=self._max_tokens, extra=self._extra
        )
        payload = await self._transport.post_json(self._url, self._headers, body)
        try:
            return self._codec.decode(payload)
        except ProtocolError as exc:
            # The codec quotes the provider's error text, which may echo the key back; the
            # unscrubbed error must not survive even as __context__.
            message = self._transport.scrub(str(exc))
        raise ProtocolError(message)

    async def aclose(self) -> None:
        await self._transport.aclose()


class FunctionModel:
    """A model played by a Python function: ``generate(messages, tools)`` returns one reply.

    The reply may be an :class:`AssistantMessage`, a plain string (a final text), or a full
    ``ModelReply`` when the function wants to report usage.
    """

    __slots__ = ("_generate", "name")

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
            return ModelReply(reply, model=self.name)
        if isinstance(reply, str):
            return ModelReply(AssistantMessage(reply), model=self.name)
        raise ProtocolError(
            f"in-process model {self.name!r} returned {type(reply).__name__}; "
            "return an AssistantMessage, a ModelReply or a str"
        )

    async def aclose(self) -> None:
        return None
