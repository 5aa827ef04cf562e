"""Where a model reply comes from: an HTTP provider (codec + transport) or a Python function
(``function_model``).

Rule of this module: a model turns a transcript and the tools' specs into one
:class:`~toolnexus_async._core.loop.ModelReply`; it does not loop, execute tools or keep state
between requests. The client drives it.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol
from urllib.parse import urljoin, urlsplit

from .._core.codecs import ArgumentsDelta, Codec, SSEParser, TextDelta
from .._core.codecs._tools import shared_json
from .._core.errors import (
    ModelError,
    ProtocolError,
    ProviderError,
    ReplyTooLargeError,
    TransportError,
)
from .._core.fastinit import builder
from .._core.hotjson import compact, loads
from .._core.http import HttpRequest, HttpResponse, Transport
from .._core.messages import AssistantMessage, Message, ModelReply
from .._core.output import OUTPUT_TOOL, OutputSpec
from .._core.secrets import Scrubber, redact_url
from .._core.types import Tool

__all__ = ("Generate", "HttpModel", "Model", "OnArguments", "OnText", "hints_for")

_VERSION = re.compile(r"v\d")  # a path segment naming an API version: v1, v1beta, v2

# Every model request's value, built by its fast_init builder (every field by position): no
# type.__call__ and no move to the twin in __init__ (issue 41, park41h in performance.md).
_http_request: Callable[[str, str, Mapping[str, str], bytes, float | None, int], HttpRequest]
_http_request = builder(HttpRequest)


def _body_bytes(body: dict[str, Any]) -> bytes:
    """``body`` as compact JSON bytes; it may take its ``"tools"`` out (a body is encoded
    once).

    A toolkit's tools are the same cached rendering on every request, and most of a body's
    JSON: their text, encoded once by the renderers' cache, is put at the end of the object
    (a JSON object's members have no order) instead of being encoded again.
    """
    tools = shared_json(body.get("tools"))
    if tools is None:
        text = compact(body)
    else:
        del body["tools"]
        rest = compact(body)
        # One f-string, one copy: a chain of + copies the growing text at every step
        # (callgrind, a 1.5 kB body: 5,041 instructions through + and .encode, 3,959 so).
        text = f'{rest[:-1]}{"," if rest != "{}" else ""}"tools":{tools}}}'
    # A lone surrogate (a file name that is not UTF-8, decoded by os.fsdecode) is written as
    # the JSON escape ensure_ascii would give it; every other character as UTF-8.
    return text.encode("utf-8", "backslashreplace")


Generate = Callable[
    [list[Message], list[Tool]],
    Awaitable[AssistantMessage | ModelReply | str] | AssistantMessage | ModelReply | str,
]


OnText = Callable[[str], None]
# Told each piece of the output tool's arguments, and which call of the reply it is of.
OnArguments = Callable[[str, int], None]


class Model(Protocol):
    name: str
    # True when the model applies the request time limit itself (an HTTP session timeout).
    enforces_timeout: bool

    # ``output``: the run's output spec, for the codec to shape the request with (an
    # in-process model gets the output tool or instructions from the engine instead).
    # ``on_output``: told the output tool's arguments as they arrive (the "tool" method).
    def request(
        self, messages: Sequence[Message], tools: Sequence[Tool], output: OutputSpec | None = None
    ) -> Awaitable[ModelReply]: ...

    async def stream(
        self,
        messages: Sequence[Message],
        tools: Sequence[Tool],
        on_text: OnText,
        on_reasoning: OnText | None = None,
        output: OutputSpec | None = None,
        on_output: OnArguments | None = None,
    ) -> ModelReply: ...

    async def aclose(self) -> None: ...


def hints_for(codec: Codec, base_url: str, api_key: str | None) -> dict[int, str]:
    """The likely fix for a status this configuration makes likely, told with the error.

    A 404 from an OpenAI-style ``base_url`` with no version in its path (``/v1``, or
    ``/v1beta`` as Gemini's has) most often means the ``/v1`` was left out; a 401 with no
    key means the key was never given.
    """
    hints: dict[int, str] = {}
    segments = urlsplit(base_url).path.split("/")
    if codec.style == "openai" and not any(_VERSION.match(s) for s in segments):
        fixed = redact_url(base_url.rstrip("/") + "/v1")
        hints[404] = (
            f"an OpenAI-style base_url usually ends in /v1 (requests go to "
            f"{{base_url}}/chat/completions): try base_url={fixed!r}"
        )
    if not api_key:
        hints[401] = f"no API key was given: pass api_key=... to LlmClient, or set {codec.key_env}"
        if codec.style == "gemini":
            hints[403] = hints[401]  # Google refuses a request without a key with a 403
    return hints


class HttpModel:
    """A provider reached over HTTP in one wire style, through a :class:`Transport`.

    Rules kept here, whatever the transport:

    - A non-2xx reply is a :class:`ProviderError` (a bounded excerpt of its body), a 2xx
      body that is not JSON, or that lacks what the style requires, a
      :class:`ProtocolError`; one too large to read a :class:`ReplyTooLargeError`; JSON nested
      too deeply to parse a :class:`ProtocolError` saying so, never a ``RecursionError``.
    - Secrets are scrubbed from every message and attribute built from what the provider
      sent (the key, header values, URL credentials), and URLs are shown without their
      credentials; errors are raised with no ``__cause__`` or ``__context__``.
    """

    __slots__ = (
        "_codec",
        "_extra",
        "_headers",
        "_hints",
        "_max_bytes",
        "_max_tokens",
        "_max_tokens_field",
        "_scrub",
        "_shown",
        "_stream_shown",
        "_stream_url",
        "_timeout",
        "_transport",
        "_url",
        "name",
    )

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
        max_tokens_field: str | None = None,
        extra_body: dict[str, Any] | None,
        timeout: float | None,
        max_reply_bytes: int,
        secrets: Iterable[str],
        hints: Mapping[int, str] | None = None,
    ) -> None:
        self._codec = codec
        self._hints = dict(hints or {})  # status -> the likely fix, told with the error
        self._transport = transport
        endpoint = codec.endpoint(base_url)
        self._url = codec.url(endpoint, model, False)
        # Gemini streams from another URL; the other styles from the same one.
        self._stream_url = codec.url(endpoint, model, True)
        self._headers = {**headers, "Content-Type": "application/json"}
        self._max_tokens = max_tokens
        self._max_tokens_field = max_tokens_field
        self._extra = extra_body
        self._timeout = timeout
        self._max_bytes = max_reply_bytes
        self._scrub = Scrubber(secrets)
        self._shown = self._scrub(redact_url(self._url))
        self._stream_shown = self._scrub(redact_url(self._stream_url))
        self.name = model

    @property
    def url(self) -> str:
        return self._url

    def scrub(self, text: str) -> str:
        return self._scrub(text)

    def _request(
        self,
        messages: Sequence[Message],
        tools: Sequence[Tool],
        stream: bool,
        output: OutputSpec | None = None,
    ) -> HttpRequest:
        body = self._codec.encode(
            messages,
            tools,
            model=self.name,
            max_tokens=self._max_tokens,
            max_tokens_field=self._max_tokens_field,
            extra=self._extra,
            stream=stream,
            output=output,
        )
        url = self._stream_url if stream else self._url
        content = _body_bytes(body)
        return _http_request("POST", url, self._headers, content, self._timeout, self._max_bytes)

    async def request(
        self, messages: Sequence[Message], tools: Sequence[Tool], output: OutputSpec | None = None
    ) -> ModelReply:
        failure: TransportError | None = None
        try:
            response = await self.send(messages, tools, output)
        except TransportError as exc:
            failure = self.scrubbed(exc)  # raised below, outside the except block
        if failure is not None:
            raise failure
        return self.reply(response)

    # request() in its three steps, for the engine's plain turn, which awaits the transport
    # itself: one coroutine fewer per model request (a frame each of 500 runs in flight).

    def send(
        self, messages: Sequence[Message], tools: Sequence[Tool], output: OutputSpec | None = None
    ) -> Awaitable[HttpResponse]:
        """The transport's send of the request for ``messages``, to be awaited."""
        return self._transport.send(self._request(messages, tools, False, output))

    def scrubbed(self, error: TransportError) -> TransportError:
        """What :meth:`request` raises for the transport's ``error``: its text scrubbed, only
        a bare resource ``OSError`` chained (``__cause__``). Raise it outside the ``except``
        block, so that the original is not even its ``__context__``."""
        scrubbed = TransportError(self._scrub(str(error)))
        scrubbed.__cause__ = self._os_cause(error)  # suppresses the context, as `from` does
        return scrubbed

    def reply(self, response: HttpResponse) -> ModelReply:
        """The model's reply in the transport's ``response``; a :class:`ModelError` (built
        scrubbed) when there is none."""
        content = response.content
        if content is None or len(content) > self._max_bytes:
            raise self._too_large()
        if not 200 <= response.status < 300:
            raise self._provider_error(response)
        failure: str | None = None
        try:
            payload = loads(content)
        except ValueError:
            excerpt = self._scrub(content[:200].decode("utf-8", "replace"))
            failure = f"reply from {self._shown} is not JSON: {excerpt!r}"
        except RecursionError:
            failure = f"reply from {self._shown} is JSON nested too deeply to read"
        if failure is not None:
            raise ProtocolError(failure)
        try:
            return self._codec.decode(payload)
        except ProtocolError as exc:
            # Rebuilt outside the except block: decoders quote what the provider sent, which
            # may echo the key, and the unscrubbed error must not survive even as context.
            failure = self._scrub(str(exc))
        raise ProtocolError(failure)

    async def stream(
        self,
        messages: Sequence[Message],
        tools: Sequence[Tool],
        on_text: OnText,
        on_reasoning: OnText | None = None,
        output: OutputSpec | None = None,
        on_output: OnArguments | None = None,
    ) -> ModelReply:
        """A streamed request: ``on_text`` gets the text as it arrives (``on_reasoning`` the
        reasoning, ``on_output`` the pieces of the output tool's arguments); the reply at
        the end.

        A stream that breaks off or carries a provider error raises; a truncated reply is
        never returned.
        """
        parser = SSEParser()
        decoder = self._codec.stream_decoder(self._stream_shown)
        failure: ModelError | None = None
        chunks = self._transport.stream(self._request(messages, tools, True, output))
        left = self._max_bytes
        try:
            async with contextlib.aclosing(chunks):  # type: ignore[type-var]
                async for chunk in chunks:
                    if isinstance(chunk, HttpResponse):
                        if not 200 <= chunk.status < 300:
                            raise self._provider_error(chunk, self._stream_shown)
                        continue
                    left -= len(chunk)
                    if left < 0:
                        raise self._too_large()
                    for event in parser.feed(chunk):
                        for delta in decoder.feed(event):
                            if type(delta) is TextDelta:
                                on_text(delta.text)
                            elif type(delta) is ArgumentsDelta:
                                if on_output is not None and delta.name == OUTPUT_TOOL:
                                    on_output(delta.text, delta.index)
                            elif on_reasoning is not None:
                                on_reasoning(delta.text)
                    if decoder.done:
                        break
                return decoder.finish()
        except ModelError as exc:
            failure = exc
        # Decoders quote what the provider sent, which may echo the key back: rebuilt
        # scrubbed, outside the except block so the original is not even __context__.
        scrub = self._scrub
        if isinstance(failure, ReplyTooLargeError):
            raise ReplyTooLargeError(str(failure), limit=failure.limit)  # built scrubbed
        if isinstance(failure, ProviderError):
            raise ProviderError(
                failure.status,
                scrub(failure.body),
                failure.url,
                headers=failure.headers,
                hint=failure.hint or self._hints.get(failure.status),
            )
        if isinstance(failure, TransportError):
            raise self.scrubbed(failure)
        raise ProtocolError(scrub(str(failure)))

    def _os_cause(self, error: TransportError) -> OSError | None:
        """The bare ``OSError`` a transport chains to a resource error (EMFILE...), rebuilt
        from its errno and scrubbed text alone; anything else chained is dropped."""
        cause = error.__cause__
        if type(cause) is not OSError or cause.errno is None:
            return None
        return OSError(cause.errno, self._scrub(cause.strerror or ""))

    def _provider_error(self, response: HttpResponse, shown: str | None = None) -> ProviderError:
        body = self._scrub((response.content or b"").decode("utf-8", "replace"))
        headers = self._scrub.headers(response.headers)
        hint = self._hints.get(response.status)
        if hint is None and 300 <= response.status < 400:
            hint = self._redirect_hint(headers)
        url = shown or self._shown
        return ProviderError(response.status, body, url, headers=headers, hint=hint)

    def _redirect_hint(self, headers: Mapping[str, str]) -> str:
        """Why a redirect was not followed, and where it pointed (from scrubbed headers)."""
        location = next((v for k, v in headers.items() if k.lower() == "location"), None)
        where = ""
        if location:
            # A relative Location is resolved as a client would; the URL is shown without
            # credentials, its own or the ones it took from base_url.
            try:
                target = urljoin(self._url, location)
            except ValueError:  # not a URL urllib can read ("http://[oops"): shown as sent
                target = location
            where = f" to {self._scrub(redact_url(target))}"
        return (
            f"the provider redirected the request{where}; model requests do not follow"
            " redirects, since the API key and headers would go along: if the new address"
            " is the provider's, use it in base_url"
        )

    def _too_large(self) -> ReplyTooLargeError:
        return ReplyTooLargeError(
            f"reply from {self._shown} is larger than max_reply_bytes={self._max_bytes}; "
            "it was not read further",
            limit=self._max_bytes,
        )

    async def aclose(self) -> None:
        await self._transport.aclose()
