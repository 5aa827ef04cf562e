"""Small checks shared by the codecs: each names the path of what is missing or wrong."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from ..errors import ProtocolError
from ..fastinit import builder
from ..hotjson import loads
from ..messages import AssistantMessage, ToolCall, Usage

# Usage by its fast_init builder (every field by position), as the codecs build a reply's
# other values: one per model reply.
_usage: Callable[[int, int, int, int, int, int], Usage] = builder(Usage)


def obj(value: object, where: str, style: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProtocolError(f"{style} reply: {where} must be an object, got {_kind(value)}")
    return value


def field(parent: dict[str, Any], key: str, kind: type, where: str, style: str) -> Any:
    if key not in parent:
        raise ProtocolError(f"{style} reply: {where} has no {key!r}")
    value = parent[key]
    if not isinstance(value, kind):
        raise ProtocolError(
            f"{style} reply: {where}.{key} must be {kind.__name__}, got {_kind(value)}"
        )
    return value


def count(usage: dict[str, Any], key: str) -> int:
    value = usage.get(key, 0)
    # A provider may omit or null a counter; usage is advisory, never a reason to fail a run.
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def openai_usage(usage: dict[str, Any]) -> Usage:
    """A Chat Completions ``usage`` object (whole reply or last stream chunk) as Usage."""
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    total = usage.get("total_tokens")
    if (
        type(prompt) is int
        and type(completion) is int
        and type(total) is int
        and "prompt_tokens_details" not in usage
        and "completion_tokens_details" not in usage
    ):
        # The usual reply, checked in one expression: what count() would make of it.
        return _usage(prompt, completion, total or prompt + completion, 0, 0, 0)
    prompt, completion = count(usage, "prompt_tokens"), count(usage, "completion_tokens")
    prompt_details = usage.get("prompt_tokens_details")
    completion_details = usage.get("completion_tokens_details")
    return Usage(
        prompt,
        completion,
        count(usage, "total_tokens") or prompt + completion,
        # Cached tokens are already among prompt_tokens: counted apart, not added.
        count(prompt_details, "cached_tokens") if isinstance(prompt_details, dict) else 0,
        0,
        count(completion_details, "reasoning_tokens")
        if isinstance(completion_details, dict)
        else 0,
    )


def anthropic_usage(usage: dict[str, Any]) -> Usage:
    """A Messages API ``usage`` object (the reply's, or a stream's merged one) as Usage."""
    read = count(usage, "cache_read_input_tokens")
    written = count(usage, "cache_creation_input_tokens")
    # Cached prompt tokens are still prompt tokens; Anthropic counts them apart.
    prompt = count(usage, "input_tokens") + written + read
    completion = count(usage, "output_tokens")
    return Usage(prompt, completion, prompt + completion, read, written)


def reasoning_of(message: dict[str, Any]) -> str:
    """The reasoning text an OpenAI-compatible server put beside the content (Groq,
    OpenRouter, Cerebras: ``reasoning``; vLLM, DeepSeek: ``reasoning_content``), or ""."""
    value = message.get("reasoning")
    if type(value) is str and value:
        return value
    value = message.get("reasoning_content")
    return value if type(value) is str else ""


def parse_arguments(raw: object) -> tuple[dict[str, Any], str | None]:
    """Decoded tool arguments, or ``({}, raw_text)`` when they are not a JSON object."""
    if type(raw) is not str:  # the usual arguments are a JSON object's text: one check
        if isinstance(raw, dict):
            return raw, None
        if not isinstance(raw, str):
            return {}, json.dumps(raw)
    if raw[:1] != "{" and raw.strip() == "":
        # Models send "" for a call without arguments.
        return {}, None
    try:
        value = loads(raw)
    except (ValueError, RecursionError):  # nested too deeply is as unusable as malformed
        return {}, raw
    return (value, None) if isinstance(value, dict) else ({}, raw)


def provider_error_message(payload: dict[str, Any]) -> str:
    error = payload.get("error")
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return f" (it carries an error: {error['message'][:200]})"
    return ""


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


# The Anthropic content blocks the neutral transcript says in full; any other block (a
# server tool's use or result) makes a reply's content worth keeping as it came.
NEUTRAL_BLOCKS = frozenset({"text", "tool_use", "thinking", "redacted_thinking"})


def remember_wire_content(message: AssistantMessage, style: str, blocks: list[Any]) -> None:
    """Record the provider's content blocks of ``message``, to send them back verbatim."""
    object.__setattr__(message, "_wire_content", (style, tuple(blocks)))


def remember_wire_arguments(call: ToolCall, text: str) -> None:
    """Record the JSON text ``call.arguments`` was decoded from, to send it back verbatim."""
    object.__setattr__(call, "_wire_arguments", text)


def wire_arguments(call: ToolCall) -> str:
    """``call``'s arguments as JSON text: what the model sent, or an encoding of them."""
    if call.invalid_arguments is not None:
        return call.invalid_arguments
    if call._wire_arguments is not None:
        return call._wire_arguments
    return json.dumps(call.arguments)


def generated_call_id(reply_id: object, created: object, index: int, name: str, text: str) -> str:
    """A stable id for a tool call the provider sent without one (Gemini sends ``""``).

    Derived from the reply alone: the reply's own ``id`` and ``created`` (which servers make
    distinct per reply), the call's position, name and argument text. Decoding the same
    reply twice gives the same id, streamed or not; two calls of one reply never share one.
    """
    seed = json.dumps([reply_id, created, index, name, text], default=str)
    return "call_" + hashlib.sha256(seed.encode()).hexdigest()[:24]
