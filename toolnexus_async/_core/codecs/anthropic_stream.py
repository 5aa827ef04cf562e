"""The Anthropic Messages stream decoder: typed events in, one reply at ``message_stop``.

Rule of this module: only what is particular to the Anthropic stream (``message_start``,
content blocks, ``message_delta``, in-stream ``error`` events and their HTTP statuses); the
end and failure bookkeeping, JSON parsing and :class:`~._stream.TextDelta` come from
:mod:`._stream`. No I/O: tests feed events by hand.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from ..errors import ProtocolError, ProviderError
from ..messages import AssistantMessage, ModelReply, Reasoning, ToolCall
from ._common import NEUTRAL_BLOCKS, anthropic_usage, parse_arguments, remember_wire_content
from ._sse import SSEEvent
from ._stream import ArgumentsDelta, Delta, ReasoningDelta, TextDelta, _Decoder, _int_index

__all__ = ("ANTHROPIC_ERROR_STATUS", "AnthropicStreamDecoder")

# The status each Anthropic error type has as an HTTP reply, so that a retry policy treats
# an error that arrives mid-stream like the same error arriving as a status line.
ANTHROPIC_ERROR_STATUS: dict[str, int] = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "billing_error": 402,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}


@attrs.define
class _Block:
    # "text", "tool_use", or another type whose deltas carry nothing for us: thinking,
    # server tools (server_tool_use, mcp_tool_use) and their results (web_search_tool_result,
    # code_execution_tool_result, mcp_tool_result, ...), which the provider runs itself
    kind: str
    id: str = ""
    name: str = ""
    start_input: object = None
    parts: list[str] = attrs.field(factory=list)
    stopped: bool = False
    signature: str | None = None  # a thinking block's, from its signature_delta
    # The block as content_block_start sent it, grown by its deltas into the block the
    # unstreamed reply would hold (kept when the reply has server tool blocks).
    raw: dict[str, Any] = attrs.field(factory=dict)
    citations: list[object] = attrs.field(factory=list)


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

    def _feed(self, event: SSEEvent) -> list[Delta]:
        payload = self._json(event)
        kind = payload.get("type", event.event)
        if kind == "error" or event.event == "error":
            error = payload.get("error")
            error_type = error.get("type") if isinstance(error, dict) else None
            if error_type is not None and not isinstance(error_type, str):
                # Not a name to look up (a list is not even hashable): the event is malformed.
                raise self._bad(
                    event, f"error.type must be a string, got {type(error_type).__name__}"
                )
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

    def _message_start(self, event: SSEEvent, payload: dict[str, Any]) -> list[Delta]:
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

    def _block_start(self, event: SSEEvent, payload: dict[str, Any]) -> list[Delta]:
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
            self._blocks[index] = _Block(
                "tool_use", call_id, name, block.get("input", {}), raw=dict(block)
            )
            return []
        self._blocks[index] = _Block(kind if isinstance(kind, str) else "", raw=dict(block))
        if kind == "redacted_thinking":
            self._blocks[index].start_input = block.get("data")
        elif kind == "thinking":
            thought, signature = block.get("thinking"), block.get("signature")
            if isinstance(thought, str) and thought:
                self._blocks[index].parts.append(thought)
            if isinstance(signature, str) and signature:
                self._blocks[index].signature = signature
        text = block.get("text") if kind == "text" else None
        if isinstance(text, str) and text:
            self._blocks[index].parts.append(text)
            return [TextDelta(text)]
        return []

    def _block_delta(self, event: SSEEvent, payload: dict[str, Any]) -> list[Delta]:
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
            if block.kind == "text" or not isinstance(partial, str):
                raise self._bad(event, "an input_json_delta needs a tool block and a string")
            # A server tool's input (server_tool_use, mcp_tool_use) is kept for its block
            # alone: the provider runs it, and the unstreamed codec skips it too.
            block.parts.append(partial)
            if block.kind == "tool_use" and partial:
                return [ArgumentsDelta(block.name, partial, payload["index"])]
        elif kind == "thinking_delta" and block.kind == "thinking":
            thought = delta.get("thinking")
            if isinstance(thought, str) and thought:
                block.parts.append(thought)
                return [ReasoningDelta(thought)]
        elif kind == "signature_delta" and block.kind == "thinking":
            signature = delta.get("signature")
            if isinstance(signature, str):
                block.signature = (block.signature or "") + signature
        elif kind == "citations_delta":
            block.citations.append(delta.get("citation"))
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
        reasoning: list[Reasoning] = []
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
            elif block.kind == "thinking":
                reasoning.append(Reasoning("".join(block.parts), block.signature))
            elif block.kind == "redacted_thinking" and isinstance(block.start_input, str):
                reasoning.append(Reasoning("", redacted=block.start_input))
        message = AssistantMessage(
            "".join(texts) if any_text else None, tuple(calls), reasoning=tuple(reasoning)
        )
        if any(block.kind not in NEUTRAL_BLOCKS for block in self._blocks.values()):
            blocks = [_whole(self._blocks[index]) for index in sorted(self._blocks)]
            remember_wire_content(message, "anthropic", blocks)
        return ModelReply(
            message,
            anthropic_usage(self._usage),  # as the unstreamed codec counts it
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


def _whole(block: _Block) -> dict[str, Any]:
    """The block as the unstreamed reply would hold it: its start, grown by its deltas."""
    out = dict(block.raw)
    if block.kind == "text":
        out["text"] = "".join(block.parts)
        if block.citations:
            out["citations"] = [*(out.get("citations") or ()), *block.citations]
    elif block.kind == "thinking":
        out["thinking"] = "".join(block.parts)
        if block.signature is not None:
            out["signature"] = block.signature
    elif block.parts:
        arguments, invalid = parse_arguments("".join(block.parts))
        if invalid is None:
            out["input"] = arguments
    return out


_NEEDS_START = frozenset(
    {
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    }
)
