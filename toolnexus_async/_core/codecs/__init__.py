"""Wire styles: pure translations between the neutral transcript and a provider's JSON.

Rule of this package: no I/O. A codec builds the URL, headers and JSON body of a request
(from the transcript and the specs of the tools, never a toolkit) and decodes a parsed
reply into a :class:`~toolnexus_async.ModelReply`, raising
:class:`~toolnexus_async.ProtocolError` when the reply lacks what the style requires.
A streamed reply goes through :class:`~._sse.SSEParser` (bytes to events) and the style's
stream decoder (events to text deltas, then one ``ModelReply``).
Sending is the transport's job; tests drive codecs with plain dicts and bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ..errors import UsageError
from ..messages import Message, ModelReply
from ..output import OutputSpec
from ._sse import SSEEvent, SSEParser
from ._stream import ArgumentsDelta, StreamDecoder, TextDelta
from ._tools import ToolSpec, render_anthropic, render_gemini, render_openai
from .anthropic import AnthropicCodec
from .gemini import GeminiCodec
from .openai import OpenAICodec

__all__ = (
    "STYLES",
    "ArgumentsDelta",
    "Codec",
    "ToolSpec",
    "render_anthropic",
    "render_gemini",
    "render_openai",
    "SSEEvent",
    "SSEParser",
    "StreamDecoder",
    "TextDelta",
    "codec_for",
)


class Codec(Protocol):
    """What a wire style provides to the client."""

    style: str
    key_env: str
    default_base_url: str

    def endpoint(self, base_url: str) -> str: ...

    # The URL of one request to ``model`` at ``endpoint`` (Gemini names the model and the
    # streaming method in it; the other styles post every request to the endpoint).
    def url(self, endpoint: str, model: str, stream: bool) -> str: ...

    def headers(self, api_key: str | None) -> dict[str, str]: ...

    def encode(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        *,
        model: str,
        max_tokens: int | None,
        extra: dict[str, Any] | None = None,
        stream: bool = False,
        max_tokens_field: str | None = None,
        output: OutputSpec | None = None,
    ) -> dict[str, Any]: ...

    def decode(self, payload: object) -> ModelReply: ...

    def stream_decoder(self, url: str) -> StreamDecoder: ...


_CODECS: dict[str, Codec] = {
    "openai": OpenAICodec(),
    "anthropic": AnthropicCodec(),
    "gemini": GeminiCodec(),
}
STYLES: tuple[str, ...] = tuple(_CODECS)


def codec_for(style: str) -> Codec:
    """The codec of ``style``; a clear error for an unknown one."""
    try:
        return _CODECS[style]
    except KeyError:
        raise UsageError(f"unknown style {style!r}; choose one of {', '.join(STYLES)}") from None
