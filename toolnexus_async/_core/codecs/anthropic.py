"""The Anthropic Messages wire style.

Request: ``POST {base_url}/v1/messages`` (just ``/messages`` when the base URL already ends
in ``/v1``) with ``x-api-key`` and ``anthropic-version: 2023-06-01``; ``max_tokens`` is
required by the API, so a default is always sent. System messages become the top-level
``system``; the results of one turn's tool calls travel as ``tool_result`` blocks in a
single user message, with ``is_error`` set for errors. Reply: ``content`` blocks of type
``text`` and ``tool_use``, and ``thinking`` / ``redacted_thinking``, kept as
:class:`Reasoning` and sent back unchanged, first in their assistant turn;
``input_tokens``/``output_tokens`` map to prompt/completion.
Streamed (``stream=True``): ``"stream": true``, and the events go to
:class:`~.anthropic_stream.AnthropicStreamDecoder`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..errors import ProtocolError
from ..messages import (
    AssistantMessage,
    Message,
    ModelReply,
    Reasoning,
    SystemMessage,
    ToolCall,
    ToolReturn,
    Usage,
)
from ..output import OutputSpec
from ._common import (
    NEUTRAL_BLOCKS,
    anthropic_usage,
    field,
    obj,
    provider_error_message,
    remember_wire_content,
)
from ._tools import ToolSpec, render_anthropic
from .anthropic_stream import AnthropicStreamDecoder

__all__ = ("AnthropicCodec",)

STYLE = "anthropic"
API_VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 4096


def _reasoning_block(reasoning: Reasoning) -> dict[str, Any] | None:
    if reasoning.style != STYLE:
        return None  # another style's reasoning: dropped when the conversation switches
    if reasoning.redacted is not None:
        return {"type": "redacted_thinking", "data": reasoning.redacted}
    if reasoning.signature is None:
        return None  # the API refuses a thinking block without its signature
    return {"type": "thinking", "thinking": reasoning.text, "signature": reasoning.signature}


def _assistant_blocks(message: AssistantMessage) -> list[dict[str, Any]]:
    wire = message._wire_content
    if wire is not None and wire[0] == STYLE:
        # Server tool blocks, in their order: what the API asks back (after a pause_turn,
        # or a client call that follows a server tool), as it came.
        return list(wire[1])
    # The API requires the thinking blocks back, unchanged and first, before tool_use.
    blocks: list[dict[str, Any]] = [
        block for block in map(_reasoning_block, message.reasoning) if block is not None
    ]
    if message.text:
        blocks.append({"type": "text", "text": message.text})
    elif message.refusal:
        # The Messages API has no refusal field: what the model said is sent as its text.
        blocks.append({"type": "text", "text": message.refusal})
    blocks.extend(
        {"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments}
        for call in message.tool_calls
    )
    return blocks


def _render(messages: Sequence[Message]) -> tuple[str | None, list[dict[str, Any]]]:
    system: list[str] = []
    out: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for message in messages:
        if isinstance(message, ToolReturn):
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": message.call_id,
                "content": message.output,
            }
            if message.is_error:
                block["is_error"] = True
            results.append(block)
            continue
        if results:
            out.append({"role": "user", "content": results})
            results = []
        if isinstance(message, SystemMessage):
            system.append(message.text)
        elif isinstance(message, AssistantMessage):
            blocks = _assistant_blocks(message)
            if blocks:  # an empty assistant turn carries nothing, and the API rejects it
                out.append({"role": "assistant", "content": blocks})
        else:
            out.append({"role": "user", "content": message.text})
    if results:
        out.append({"role": "user", "content": results})
    return ("\n\n".join(system) if system else None), out


class AnthropicCodec:
    """Encode and decode Messages API requests and replies."""

    style = STYLE
    key_env = "ANTHROPIC_API_KEY"
    default_base_url = "https://api.anthropic.com"

    def endpoint(self, base_url: str) -> str:
        base = base_url.rstrip("/")
        return base + ("/messages" if base.endswith("/v1") else "/v1/messages")

    def url(self, endpoint: str, model: str, stream: bool) -> str:
        return endpoint  # one endpoint for every model, streamed or not

    def headers(self, api_key: str | None) -> dict[str, str]:
        headers = {"anthropic-version": API_VERSION}
        if api_key:
            headers["x-api-key"] = api_key
        return headers

    def encode(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        *,
        model: str,
        max_tokens: int | None,
        extra: dict[str, Any] | None = None,
        stream: bool = False,
        max_tokens_field: str | None = None,  # the Messages API has one name: max_tokens
        output: OutputSpec | None = None,
    ) -> dict[str, Any]:
        system, rendered = _render(messages)
        body: dict[str, Any] = {
            "model": model,
            "max_tokens": DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
            "messages": rendered,
        }
        if system is not None:
            body["system"] = system
        if tools:
            body["tools"] = render_anthropic(tools)
        if stream:
            body["stream"] = True
        if output is not None and output.method == "native":
            # Structured outputs: the reply's text is JSON of this schema (models that
            # support it; the output tool, the default, works with every model).
            body["output_config"] = {"format": {"type": "json_schema", "schema": output.wire}}
        elif output is not None and output.method == "tool" and not (extra and "thinking" in extra):
            # A tool must be called, the output tool ending the run. Not with extended
            # thinking, which the API refuses with a forced tool choice: the model is then
            # asked again if it answers in text.
            body["tool_choice"] = {"type": "any"}
        if extra:
            body.update(extra)
        return body

    def stream_decoder(self, url: str) -> AnthropicStreamDecoder:
        """A fresh decoder for one streamed reply from ``url`` (named in its errors)."""
        return AnthropicStreamDecoder(url)

    def decode(self, payload: object) -> ModelReply:
        payload = obj(payload, "the body", STYLE)
        content = payload.get("content")
        if not isinstance(content, list):
            raise ProtocolError(
                "anthropic reply has no 'content' list" + provider_error_message(payload)
            )
        texts: list[str] = []
        calls: list[ToolCall] = []
        reasoning: list[Reasoning] = []
        seen: set[str] = set()
        for i, raw in enumerate(content):
            where = f"content[{i}]"
            block = obj(raw, where, STYLE)
            kind = block.get("type")
            if kind == "text":
                texts.append(field(block, "text", str, where, STYLE))
            elif kind == "tool_use":
                call_id = field(block, "id", str, where, STYLE)
                if not call_id or call_id in seen:
                    raise ProtocolError(
                        f"anthropic reply: {where}.id {call_id!r} is empty or repeated"
                    )
                seen.add(call_id)
                name = field(block, "name", str, where, STYLE)
                arguments = block.get("input", {})
                if isinstance(arguments, dict):
                    calls.append(ToolCall(call_id, name, arguments))
                else:
                    calls.append(ToolCall(call_id, name, {}, json.dumps(arguments)))
            elif kind == "thinking":
                thought = field(block, "thinking", str, where, STYLE)
                signature = block.get("signature")
                reasoning.append(Reasoning(thought, signature if type(signature) is str else None))
            elif kind == "redacted_thinking":
                reasoning.append(Reasoning("", redacted=field(block, "data", str, where, STYLE)))
            # Other block types (server tools and their results) carry nothing the loop acts on.
        usage = payload.get("usage")
        totals = anthropic_usage(usage) if isinstance(usage, dict) else Usage()
        model = payload.get("model")
        reason = payload.get("stop_reason")
        assistant = AssistantMessage(
            "".join(texts) if texts else None, tuple(calls), reasoning=tuple(reasoning)
        )
        if any(block.get("type") not in NEUTRAL_BLOCKS for block in content):
            remember_wire_content(assistant, STYLE, content)
        return ModelReply(
            assistant,
            totals,
            model if isinstance(model, str) else None,
            reason if isinstance(reason, str) else None,
            raw=payload,
        )
