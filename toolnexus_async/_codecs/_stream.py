"""Streaming replies: SSE events in, text deltas out, one :class:`ModelReply` at the end.

Rule of this module: a decoder never returns a reply it has not seen the provider finish.
:meth:`~OpenAIStreamDecoder.feed` hands out text as it arrives and keeps tool-call
fragments, usage and the stop reason to itself; :meth:`~OpenAIStreamDecoder.finish`
assembles the reply exactly as the non-streaming codec would decode it, or raises
:class:`~toolnexus_async.ProtocolError` when the stream broke off before its end marker.
A provider error sent inside the stream raises :class:`~toolnexus_async.ProviderError`
with the status that error would have had as an HTTP reply. Events after the end, and
events whose data is not JSON, are refused. No I/O: tests feed events by hand.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

import attrs

from .._errors import ProtocolError, ProviderError
from .._loop import ModelReply
from .._messages import AssistantMessage, ToolCall
from .._results import Usage
from ._common import count, parse_arguments
from ._sse import SSEEvent

__all__ = (
    "ANTHROPIC_ERROR_STATUS",
    "AnthropicStreamDecoder",
    "OpenAIStreamDecoder",
    "StreamDecoder",
    "TextDelta",
)

# The status each Anthropic error type has as an HTTP reply, so that a retry policy treats
# an error that arrives mid-stream like the same error arriving as a status line.
ANTHROPIC_ERROR_STATUS: dict[str, int] = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "overloaded_error": 529,
}

# Enough of an offending payload for a human to recognise it, bounded like error bodies.
_EXCERPT = 200


@attrs.frozen
class TextDelta:
    """A piece of the assistant's text, in order; the pieces join to the reply's text."""

    text: str


class StreamDecoder(Protocol):
    """What both styles' decoders provide to the client."""

    @property
    def done(self) -> bool: ...

    def feed(self, event: SSEEvent) -> list[TextDelta]: ...

    def finish(self) -> ModelReply: ...


class _Decoder:
    """What both styles share: the end/failure bookkeeping and JSON parsing."""

    style = ""
    end_marker = ""

    def __init__(self, url: str) -> None:
        self._url = url
        self._count = 0  # events seen, to name the bad one in errors
        self._done = False
        self._failed = False

    @property
    def done(self) -> bool:
        """True once the provider sent its end marker (``[DONE]`` or ``message_stop``)."""
        return self._done

    def feed(self, event: SSEEvent) -> list[TextDelta]:
        """The text deltas ``event`` carries; raises on a provider error or a bad event."""
        self._count += 1
        if self._failed:
            raise ProtocolError(f"{self.style} stream: event after the stream failed")
        if self._done:
            raise ProtocolError(
                f"{self.style} stream: event {self._name(event)} after {self.end_marker}"
            )
        try:
            return self._feed(event)
        except Exception:
            # Whatever broke, the partial reply is unusable; refuse to build on it.
            self._failed = True
            raise

    def finish(self) -> ModelReply:
        """The assembled reply; raises :class:`ProtocolError` unless the stream completed."""
        if self._failed:
            raise ProtocolError(f"{self.style} stream failed; there is no reply")
        if not self._done:
            raise ProtocolError(f"{self.style} stream ended before {self.end_marker}")
        return self._reply()

    def _feed(self, event: SSEEvent) -> list[TextDelta]:
        raise NotImplementedError

    def _reply(self) -> ModelReply:
        raise NotImplementedError

    def _name(self, event: SSEEvent) -> str:
        return f"#{self._count} ({event.event!r})"

    def _json(self, event: SSEEvent) -> dict[str, Any]:
        try:
            value = json.loads(event.data)
        except ValueError:
            raise ProtocolError(
                f"{self.style} stream: event {self._name(event)} data is not JSON: "
                f"{event.data[:_EXCERPT]!r}"
            ) from None
        if not isinstance(value, dict):
            raise ProtocolError(
                f"{self.style} stream: event {self._name(event)} data must be an object, "
                f"got {type(value).__name__}"
            )
        return value

    def _bad(self, event: SSEEvent, what: str) -> ProtocolError:
        return ProtocolError(f"{self.style} stream: event {self._name(event)}: {what}")


@attrs.define
class _OpenAICall:
    id: str = ""
    name: str = ""
    arguments: list[str] = attrs.field(factory=list)


def _openai_status(error: object) -> int:
    code = error.get("code") if isinstance(error, dict) else None
    if isinstance(code, str) and code.isascii() and code.isdigit():
        code = int(code)
    # Only a code that reads as an HTTP status is one; "rate_limit_exceeded" or 1234 is not.
    if isinstance(code, int) and not isinstance(code, bool) and 400 <= code <= 599:
        return code
    return 500


def _int_index(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class OpenAIStreamDecoder(_Decoder):
    """Chat Completions chunks: ``choices[0].delta`` pieces, then ``data: [DONE]``.

    Tool calls arrive as fragments keyed by ``index``: the first fragment of an index
    carries ``id`` and ``function.name``, every fragment may add to ``function.arguments``.
    With ``stream_options.include_usage`` a last chunk with empty ``choices`` carries the
    usage. The stream is complete once ``[DONE]`` or a ``finish_reason`` arrived.
    """

    style = "openai"
    end_marker = "[DONE]"

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self._text: list[str] | None = None  # None until the model sends any content
        self._calls: dict[int, _OpenAICall] = {}
        self._usage: dict[str, Any] | None = None
        self._model: str | None = None
        self._finish_reason: str | None = None

    def finish(self) -> ModelReply:
        # A finish_reason is the model's own end; a proxy that drops [DONE] (or a usage
        # chunk) after it has not truncated the reply.
        if self._finish_reason is not None and not self._failed:
            self._done = True
        return super().finish()

    def _feed(self, event: SSEEvent) -> list[TextDelta]:
        if event.data.strip() == "[DONE]":
            self._done = True
            return []
        chunk = self._json(event)
        if chunk.get("error"):
            raise ProviderError(_openai_status(chunk["error"]), event.data, self._url)
        model = chunk.get("model")
        if isinstance(model, str) and model:
            self._model = model
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            # Servers that repeat usage on every chunk send running totals: keep the last.
            self._usage = usage
        choices = chunk.get("choices")
        if choices is None:
            return []  # vLLM's usage-only chunk has "choices": null
        if not isinstance(choices, list):
            raise self._bad(event, "choices must be a list")
        deltas: list[TextDelta] = []
        for choice in choices:
            # With n > 1 the other choices interleave; the reply is choice 0, as unstreamed.
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            deltas.extend(self._choice(event, choice))
        return deltas

    def _choice(self, event: SSEEvent, choice: dict[str, Any]) -> list[TextDelta]:
        reason = choice.get("finish_reason")
        if isinstance(reason, str) and reason:
            self._finish_reason = reason
        delta = choice.get("delta")
        if delta is None:
            return []
        if not isinstance(delta, dict):
            raise self._bad(event, "choices[0].delta must be an object")
        fragments = delta.get("tool_calls")
        if fragments is not None and not isinstance(fragments, list):
            raise self._bad(event, "choices[0].delta.tool_calls must be a list")
        for fragment in fragments or ():
            self._fragment(event, fragment)
        content = delta.get("content")
        if content is None:
            return []
        if not isinstance(content, str):
            raise self._bad(event, "choices[0].delta.content must be a string or null")
        if self._text is None:
            self._text = []
        if not content:
            return []
        self._text.append(content)
        return [TextDelta(content)]

    def _fragment(self, event: SSEEvent, fragment: object) -> None:
        if not isinstance(fragment, dict):
            raise self._bad(event, "a tool_calls fragment must be an object")
        index = _int_index(fragment.get("index"))
        if index is None:
            raise self._bad(event, "a tool_calls fragment has no integer 'index'")
        call = self._calls.setdefault(index, _OpenAICall())
        call_id = fragment.get("id")
        if isinstance(call_id, str) and call_id and not call.id:
            call.id = call_id
        function = fragment.get("function")
        if not isinstance(function, dict):
            return
        name = function.get("name")
        if isinstance(name, str) and name and not call.name:
            call.name = name
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            call.arguments.append(arguments)

    def _reply(self) -> ModelReply:
        calls: list[ToolCall] = []
        seen: set[str] = set()
        for index in sorted(self._calls):
            call = self._calls[index]
            where = f"openai stream: tool call at index {index}"
            if not call.id or call.id in seen:
                raise ProtocolError(f"{where} has an empty or repeated id {call.id!r}")
            if not call.name:
                raise ProtocolError(f"{where} has no function name")
            seen.add(call.id)
            arguments, invalid = parse_arguments("".join(call.arguments))
            calls.append(ToolCall(call.id, call.name, arguments, invalid))
        totals = Usage()
        if self._usage is not None:
            prompt = count(self._usage, "prompt_tokens")
            completion = count(self._usage, "completion_tokens")
            total = count(self._usage, "total_tokens") or prompt + completion
            totals = Usage(prompt, completion, total)
        text = None if self._text is None else "".join(self._text)
        return ModelReply(
            AssistantMessage(text, tuple(calls)), totals, self._model, self._finish_reason
        )


@attrs.define
class _Block:
    kind: str  # "text", "tool_use", or another type whose deltas carry nothing for us
    id: str = ""
    name: str = ""
    start_input: object = None
    parts: list[str] = attrs.field(factory=list)
    stopped: bool = False


class AnthropicStreamDecoder(_Decoder):
    """Messages API events: ``message_start``, ``content_block_*``, ``message_delta``, stop.

    ``message_start`` carries the model and the prompt-side usage; each content block is
    opened by ``content_block_start`` (a ``text`` block, or a ``tool_use`` block with id,
    name and an empty ``input``), grown by ``text_delta`` / ``input_json_delta`` and closed
    by ``content_block_stop``; ``message_delta`` carries the stop reason and the running
    output token count; ``message_stop`` ends the stream. ``ping`` and unknown event types
    are ignored, as the API's versioning policy asks; ``error`` raises.
    """

    style = "anthropic"
    end_marker = "message_stop"

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self._started = False
        self._blocks: dict[int, _Block] = {}
        self._usage: dict[str, Any] = {}
        self._model: str | None = None
        self._stop_reason: str | None = None

    def _feed(self, event: SSEEvent) -> list[TextDelta]:
        payload = self._json(event)
        kind = payload.get("type", event.event)
        if kind == "error" or event.event == "error":
            error = payload.get("error")
            error_type = error.get("type") if isinstance(error, dict) else None
            status = ANTHROPIC_ERROR_STATUS.get(error_type, 500) if error_type else 500
            raise ProviderError(status, event.data, self._url)
        if kind == "ping":
            return []
        if kind == "message_start":
            return self._message_start(event, payload)
        if not self._started and kind in _NEEDS_START:
            raise self._bad(event, f"{kind} before message_start")
        if kind == "content_block_start":
            return self._block_start(event, payload)
        if kind == "content_block_delta":
            return self._block_delta(event, payload)
        if kind == "content_block_stop":
            self._block(event, payload).stopped = True
        elif kind == "message_delta":
            self._message_delta(payload)
        elif kind == "message_stop":
            self._done = True
        return []

    def _message_start(self, event: SSEEvent, payload: dict[str, Any]) -> list[TextDelta]:
        if self._started:
            raise self._bad(event, "a second message_start")
        message = payload.get("message")
        if not isinstance(message, dict):
            raise self._bad(event, "message_start has no 'message' object")
        self._started = True
        model = message.get("model")
        if isinstance(model, str) and model:
            self._model = model
        self._merge_usage(message.get("usage"))
        return []

    def _block_start(self, event: SSEEvent, payload: dict[str, Any]) -> list[TextDelta]:
        index = _int_index(payload.get("index"))
        block = payload.get("content_block")
        if index is None or not isinstance(block, dict):
            raise self._bad(event, "content_block_start needs an integer index and a block")
        if index in self._blocks:
            raise self._bad(event, f"content block {index} started twice")
        kind = block.get("type")
        if kind == "tool_use":
            call_id, name = block.get("id"), block.get("name")
            if not isinstance(call_id, str) or not isinstance(name, str):
                raise self._bad(event, "a tool_use block needs a string id and name")
            self._blocks[index] = _Block("tool_use", call_id, name, block.get("input", {}))
            return []
        self._blocks[index] = _Block(kind if isinstance(kind, str) else "")
        text = block.get("text") if kind == "text" else None
        if isinstance(text, str) and text:
            self._blocks[index].parts.append(text)
            return [TextDelta(text)]
        return []

    def _block_delta(self, event: SSEEvent, payload: dict[str, Any]) -> list[TextDelta]:
        block = self._block(event, payload)
        if block.stopped:
            raise self._bad(event, "a delta after its content_block_stop")
        delta = payload.get("delta")
        if not isinstance(delta, dict):
            raise self._bad(event, "content_block_delta has no 'delta' object")
        kind = delta.get("type")
        if kind == "text_delta":
            text = delta.get("text")
            if block.kind != "text" or not isinstance(text, str):
                raise self._bad(event, "a text_delta needs a text block and a string text")
            block.parts.append(text)
            return [TextDelta(text)] if text else []
        if kind == "input_json_delta":
            partial = delta.get("partial_json")
            if block.kind != "tool_use" or not isinstance(partial, str):
                raise self._bad(event, "an input_json_delta needs a tool_use block and a string")
            block.parts.append(partial)
        # thinking_delta, signature_delta, citations_delta...: nothing the loop acts on.
        return []

    def _block(self, event: SSEEvent, payload: dict[str, Any]) -> _Block:
        index = _int_index(payload.get("index"))
        if index is None or index not in self._blocks:
            raise self._bad(event, f"no started content block at index {index!r}")
        return self._blocks[index]

    def _message_delta(self, payload: dict[str, Any]) -> None:
        delta = payload.get("delta")
        if isinstance(delta, dict) and isinstance(delta.get("stop_reason"), str):
            self._stop_reason = delta["stop_reason"]
        self._merge_usage(payload.get("usage"))

    def _merge_usage(self, usage: object) -> None:
        # message_delta counts are cumulative, so a later value replaces an earlier one.
        if isinstance(usage, dict):
            self._usage.update({k: v for k, v in usage.items() if v is not None})

    def _reply(self) -> ModelReply:
        texts: list[str] = []
        calls: list[ToolCall] = []
        seen: set[str] = set()
        any_text = False
        for index in sorted(self._blocks):
            block = self._blocks[index]
            if block.kind == "text":
                any_text = True
                texts.extend(block.parts)
            elif block.kind == "tool_use":
                if not block.id or block.id in seen:
                    raise ProtocolError(
                        f"anthropic stream: content block {index} has an empty or repeated "
                        f"tool_use id {block.id!r}"
                    )
                seen.add(block.id)
                calls.append(self._call(block))
        # Cached prompt tokens are still prompt tokens, as in the unstreamed codec.
        prompt = (
            count(self._usage, "input_tokens")
            + count(self._usage, "cache_creation_input_tokens")
            + count(self._usage, "cache_read_input_tokens")
        )
        completion = count(self._usage, "output_tokens")
        return ModelReply(
            AssistantMessage("".join(texts) if any_text else None, tuple(calls)),
            Usage(prompt, completion, prompt + completion),
            self._model,
            self._stop_reason,
        )

    @staticmethod
    def _call(block: _Block) -> ToolCall:
        if block.parts:
            arguments, invalid = parse_arguments("".join(block.parts))
            return ToolCall(block.id, block.name, arguments, invalid)
        # No input_json_delta at all: the input is whatever content_block_start carried.
        if isinstance(block.start_input, dict):
            return ToolCall(block.id, block.name, block.start_input)
        return ToolCall(block.id, block.name, {}, json.dumps(block.start_input))


_NEEDS_START = frozenset(
    {
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    }
)
