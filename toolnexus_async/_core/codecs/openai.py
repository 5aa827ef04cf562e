"""The OpenAI Chat Completions wire style (also spoken by most local and proxy servers).

Request: ``POST {base_url}/chat/completions`` with ``Authorization: Bearer <key>``; the
base URL carries any ``/v1``. Tools are ``function`` tools; a tool result is a
``{"role": "tool", "tool_call_id", "content"}`` message whose content is the result's
output, unchanged. Reply: ``choices[0].message`` with ``content`` and ``tool_calls``.
Streamed (``stream=True``): ``"stream": true`` with ``stream_options.include_usage``, and
the chunks go to :class:`~.openai_stream.OpenAIStreamDecoder`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..errors import ProtocolError
from ..fastinit import builder
from ..hotjson import loads
from ..messages import (
    ZERO_USAGE,
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
    field,
    generated_call_id,
    obj,
    openai_usage,
    parse_arguments,
    provider_error_message,
    reasoning_of,
    remember_wire_arguments,
    wire_arguments,
)
from ._tools import ToolSpec, render_openai
from .openai_stream import OpenAIStreamDecoder

__all__ = ("OpenAICodec",)

STYLE = "openai"

# The values a reply decodes to, built by their fast_init builders (every field by
# position): no type.__call__, no keyword dict, no move to the twin in __init__ and, for
# a call, no second store of its wire text (callgrind, 3.11.7: a ToolCall and its text
# 6,347 instructions through ToolCall() and remember_wire_arguments, 3,205 this way).
_tool_call: Callable[[str, str, dict[str, Any], str | None, str | None], ToolCall]
_tool_call = builder(ToolCall)
_assistant: Callable[
    [str | None, tuple[ToolCall, ...], str | None, tuple[Reasoning, ...], None, str],
    AssistantMessage,
]
_assistant = builder(AssistantMessage)
_model_reply: Callable[
    [AssistantMessage, Usage, str | None, str | None, dict[str, Any]], ModelReply
]
_model_reply = builder(ModelReply)


def _render(message: Message) -> dict[str, Any]:
    if isinstance(message, ToolReturn):
        return {"role": "tool", "tool_call_id": message.call_id, "content": message.output}
    if isinstance(message, AssistantMessage):
        out: dict[str, Any] = {"role": "assistant", "content": message.text}
        if message.refusal is not None:
            out["refusal"] = message.refusal
        if message.tool_calls:
            # A loop, not a comprehension: on 3.11 a comprehension is a function made per call.
            calls = []
            for call in message.tool_calls:
                calls.append(  # noqa: PERF401
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": wire_arguments(call)},
                    }
                )
            out["tool_calls"] = calls
        return out
    role = "system" if isinstance(message, SystemMessage) else "user"
    return {"role": role, "content": message.text}


def _text(content: object) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        # Some servers send content parts: [{"type": "text", "text": ...}, ...].
        parts = [
            p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        ]
        return "".join(parts)
    raise ProtocolError(
        f"openai reply: choices[0].message.content must be a string or null, "
        f"got {type(content).__name__}"
    )


def _calls(raw_calls: object, payload: dict[str, Any]) -> tuple[ToolCall, ...]:
    if raw_calls is None:
        return ()
    if not isinstance(raw_calls, list):
        raise ProtocolError("openai reply: choices[0].message.tool_calls must be a list")
    calls = []
    seen: set[str] = set()
    i = -1  # counted by hand: an enumerate() is one more object the collector tracks
    for raw in raw_calls:
        i += 1
        # The shape every provider sends, checked inline; anything else goes through
        # _checked_call, which names what is wrong.
        # Any, not narrowed by an assert: an assert is bytecode that runs on every call.
        function: Any = raw.get("function") if type(raw) is dict else None
        call_id = raw.get("id") if function is not None else None
        name = function.get("name") if type(function) is dict else None
        if not (type(call_id) is str and call_id and call_id not in seen and type(name) is str):
            call_id, function, name = _checked_call(raw, i, seen, payload)
        seen.add(call_id)
        text = function.get("arguments", "")
        if type(text) is str and text[:1] == "{":
            # The usual arguments, a JSON object's text: parse_arguments' steps for it,
            # inline; text it would not take as an object goes to it below.
            try:
                value = loads(text)
            except (ValueError, RecursionError):
                value = None
            if type(value) is dict:
                # Its text kept to be sent back verbatim (remember_wire_arguments, below).
                calls.append(_tool_call(call_id, name, value, None, text))
                continue
        arguments, invalid = parse_arguments(text)
        call = ToolCall(call_id, name, arguments, invalid)
        if invalid is None and type(text) is str and text:
            # Sent back verbatim next turn instead of being encoded again.
            remember_wire_arguments(call, text)
        calls.append(call)
    return tuple(calls)


def _checked_call(
    raw: object, i: int, seen: set[str], payload: dict[str, Any]
) -> tuple[str, dict[str, Any], str]:
    where = f"choices[0].message.tool_calls[{i}]"
    raw = obj(raw, where, STYLE)
    function = obj(raw.get("function"), f"{where}.function", STYLE)
    name = field(function, "name", str, f"{where}.function", STYLE)
    if raw.get("id") in ("", None):
        # Gemini's OpenAI-compatible endpoint sends "id": "" (others omit it): the call is
        # still usable, and the follow-up needs an id to pair its result with.
        text = function.get("arguments", "")
        call_id = generated_call_id(
            payload.get("id"), payload.get("created"), i, name, text if type(text) is str else ""
        )
    else:
        call_id = field(raw, "id", str, where, STYLE)
    if call_id in seen:
        raise ProtocolError(f"openai reply: {where}.id {call_id!r} is repeated")
    return call_id, function, name


class OpenAICodec:
    """Encode and decode Chat Completions requests and replies."""

    style = STYLE
    key_env = "OPENAI_API_KEY"
    default_base_url = "https://api.openai.com/v1"

    def endpoint(self, base_url: str) -> str:
        return base_url.rstrip("/") + "/chat/completions"

    def url(self, endpoint: str, model: str, stream: bool) -> str:
        return endpoint  # one endpoint for every model, streamed or not

    def headers(self, api_key: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {api_key}"} if api_key else {}

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
    ) -> dict[str, Any]:
        # A loop, not a comprehension: on 3.11 a comprehension is a function made per call.
        rendered = []
        for message in messages:
            rendered.append(_render(message))  # noqa: PERF401
        body: dict[str, Any] = {"model": model, "messages": rendered}
        if tools:
            body["tools"] = render_openai(tools)
        if max_tokens is not None:
            # max_tokens is deprecated, and refused by reasoning models; servers that know
            # only the old name are served through ModelSettings.max_tokens_field.
            body[max_tokens_field or "max_completion_tokens"] = max_tokens
        if stream:
            # Without include_usage a streamed reply carries no token counts at all.
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        if output is not None:
            _ask_output(body, output)
        if extra:
            body.update(extra)
        return body

    def stream_decoder(self, url: str) -> OpenAIStreamDecoder:
        """A fresh decoder for one streamed reply from ``url`` (named in its errors)."""
        return OpenAIStreamDecoder(url)

    def decode(self, payload: object) -> ModelReply:
        # The usual shape, checked inline; anything else goes through _checked_reply, which
        # names what is missing. (Typed Any, not narrowed by asserts: an assert is bytecode
        # that runs on every reply.)
        body: Any = payload
        choices = body.get("choices") if type(body) is dict else None
        choice: Any = choices[0] if type(choices) is list and choices else None
        message = choice.get("message") if type(choice) is dict else None
        if type(message) is not dict:
            body, choice, message = _checked_reply(body)
        content = message.get("content")
        refusal = message.get("refusal")
        # Most replies carry no reasoning and no calls: two calls fewer when they do not.
        thought = (
            reasoning_of(message)
            if "reasoning" in message or "reasoning_content" in message
            else ""
        )
        raw_calls = message.get("tool_calls")
        assistant = _assistant(
            content if content is None or type(content) is str else _text(content),
            () if raw_calls is None else _calls(raw_calls, body),
            # A refusal replaces the answer (content is null): kept, never silently lost.
            refusal if type(refusal) is str and refusal else None,
            # Kept in the transcript; servers do not ask for it back, so it is not sent.
            (Reasoning(thought, style=STYLE),) if thought else (),
            None,  # no provider blocks to keep
            "assistant",
        )
        usage = body.get("usage")
        totals = openai_usage(usage) if type(usage) is dict else _usage(usage)
        model = body.get("model")
        reason = choice.get("finish_reason")
        return _model_reply(
            assistant,
            totals,
            model if isinstance(model, str) else None,
            reason if isinstance(reason, str) else None,
            body,
        )


def _ask_output(body: dict[str, Any], output: OutputSpec) -> None:
    if output.method == "native":
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {
                "name": output.wire_name,
                "schema": output.wire,
                # Strict decoding only where OpenAI allows it: every object closed and all
                # of its fields required; otherwise the schema guides and we validate.
                "strict": output.strict,
            },
        }
    elif output.method == "tool":
        body["tool_choice"] = "required"  # a tool must be called: the output tool ends it


def _checked_reply(payload: object) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    payload = obj(payload, "the body", STYLE)
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices:
        raise ProtocolError("openai reply has no choices[0]" + provider_error_message(payload))
    choice = obj(choices[0], "choices[0]", STYLE)
    return payload, choice, obj(choice.get("message"), "choices[0].message", STYLE)


def _usage(usage: object) -> Usage:
    return openai_usage(usage) if isinstance(usage, dict) else ZERO_USAGE
