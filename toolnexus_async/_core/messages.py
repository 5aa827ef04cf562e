"""The provider-neutral transcript and its versioned JSON form.

Rule of this module: a transcript says *what was said*, never *how a provider spells it*.
The wire styles (``_core/codecs/``) render these messages at call time and parse replies back
into them, so a conversation begun against one style can go on against another, and a
stored transcript outlives a change of provider.

Invariant the loop keeps (and :func:`unpaired_calls` checks): every tool call of an
assistant message has exactly one :class:`ToolReturn` before the next model request.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import attrs

from .errors import PayloadError
from .fastinit import builder, fast_init

__all__ = (
    "ZERO_USAGE",
    "AssistantMessage",
    "Message",
    "ModelReply",
    "Reasoning",
    "SystemMessage",
    "ToolCall",
    "ToolReturn",
    "Usage",
    "UserMessage",
    "messages_from_json",
    "messages_to_json",
)

TRANSCRIPT_VERSION = 2
# Version 1 is version 2 without reasoning: it reads unchanged.
_READS = (1, 2)


@fast_init
@attrs.frozen
class SystemMessage:
    """Instructions for the model."""

    text: str
    role: Literal["system"] = attrs.field(default="system", init=False, repr=False)


@fast_init
@attrs.frozen
class UserMessage:
    """What the user said."""

    text: str
    role: Literal["user"] = attrs.field(default="user", init=False, repr=False)


@fast_init
@attrs.frozen
class ToolCall:
    """One tool call the model asked for.

    ``arguments`` is the decoded JSON object. When the model sent arguments that are not a
    JSON object, ``arguments`` is empty and ``invalid_arguments`` keeps the raw text, so the
    loop can tell the model what was wrong and the transcript still renders what it sent.
    """

    id: str
    name: str
    arguments: dict[str, Any] = attrs.field(factory=dict)
    invalid_arguments: str | None = None
    # The provider's own JSON text of ``arguments``, when a codec decoded it: sent back as
    # is. Not an init argument, so ``attrs.evolve`` with new arguments drops it.
    _wire_arguments: str | None = attrs.field(default=None, init=False, eq=False, repr=False)


@fast_init
@attrs.frozen
class Reasoning:
    """The model's reasoning before it answered, kept as the provider sent it.

    ``style`` is the wire style that produced it: only that style sends it back (Anthropic
    requires its ``thinking`` blocks back, unchanged, with their ``signature``); another
    style drops it. ``redacted`` holds the opaque data of a block the provider encrypted
    (Anthropic's ``redacted_thinking``), whose ``text`` is empty.
    """

    text: str = ""
    signature: str | None = None
    redacted: str | None = None
    style: str = "anthropic"


@fast_init
@attrs.frozen
class AssistantMessage:
    """What the model said: text, tool calls, or both.

    ``refusal`` is the model's refusal (OpenAI's ``message.refusal``), when it declined to
    answer instead: a reply of its own kind, not text. ``reasoning`` is what the model
    thought first (Anthropic's ``thinking`` blocks), in order.
    """

    text: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    refusal: str | None = None
    reasoning: tuple[Reasoning, ...] = ()
    # (style, blocks): the provider's own content, when it holds blocks the fields above
    # cannot say (Anthropic's server tools and their results), sent back as it came. Not
    # an init argument, so ``attrs.evolve`` (a changed message) drops it.
    _wire_content: tuple[str, tuple[dict[str, Any], ...]] | None = attrs.field(
        default=None, init=False, eq=False, repr=False
    )
    role: Literal["assistant"] = attrs.field(default="assistant", init=False, repr=False)


@fast_init
@attrs.frozen
class ToolReturn:
    """The result of one tool call, as the model will see it."""

    call_id: str
    name: str
    output: str
    is_error: bool = False
    role: Literal["tool"] = attrs.field(default="tool", init=False, repr=False)


Message = SystemMessage | UserMessage | AssistantMessage | ToolReturn


@fast_init
@attrs.frozen
class Usage:
    """Tokens counted by the provider, summed over the turns of a run.

    Anthropic's ``input_tokens``/``output_tokens`` are mapped to the prompt/completion pair.
    The last three are parts of those, priced apart: ``cache_read_tokens`` (prompt tokens
    read from the provider's prompt cache: OpenAI's ``prompt_tokens_details.cached_tokens``,
    Anthropic's ``cache_read_input_tokens``), ``cache_write_tokens`` (prompt tokens written
    to it: Anthropic's ``cache_creation_input_tokens``) and ``reasoning_tokens`` (completion
    tokens spent reasoning: ``completion_tokens_details.reasoning_tokens``).
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        # Frozen values: a sum with nothing on one side is the other side, no new object.
        if self is ZERO_USAGE:
            return other  # a run's first reply: nothing to count on this side, for sure
        if not _counted(other):
            return self
        if not _counted(self):
            return other
        return _usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.total_tokens + other.total_tokens,
            self.cache_read_tokens + other.cache_read_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
            self.reasoning_tokens + other.reasoning_tokens,
        )

    def to_dict(self) -> dict[str, int]:
        """Every count under its field name, as plain ints."""
        # Spelled out: attrs.asdict is generic, and a durable run writes its usage with
        # every state it keeps.
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
            "cache_read_tokens": self.cache_read_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "reasoning_tokens": self.reasoning_tokens,
        }


def _counted(usage: Usage) -> bool:
    return bool(
        usage.prompt_tokens
        or usage.completion_tokens
        or usage.total_tokens
        or usage.cache_read_tokens
        or usage.cache_write_tokens
        or usage.reasoning_tokens
    )


# Frozen, so one shared zero does for every run that has not counted tokens yet.
ZERO_USAGE = Usage()

# A sum of two counted usages (a run's second reply on), built by its fast_init builder:
# no type.__call__, no move to the twin in __init__ (issue 41, park41h in performance.md).
_usage = builder(Usage)


@fast_init
@attrs.frozen
class ModelReply:
    """One decoded model reply, whatever the wire style."""

    message: AssistantMessage
    usage: Usage = ZERO_USAGE
    model: str | None = None
    stop_reason: str | None = None
    # What the provider sent, decoded: handed to after_llm hooks, not part of the public
    # value (nor of equality or the repr).
    _raw: Any = attrs.field(default=None, eq=False, repr=False, alias="raw")


def raw_of(reply: ModelReply) -> Any:
    """What the provider sent for ``reply``, decoded (what ``after_llm`` hooks are given)."""
    return reply._raw


def unpaired_calls(messages: Sequence[Message]) -> list[ToolCall]:
    """Every tool call in ``messages`` that has no :class:`ToolReturn`, in order."""
    answered = {m.call_id for m in messages if isinstance(m, ToolReturn)}
    return [
        call
        for m in messages
        if isinstance(m, AssistantMessage)
        for call in m.tool_calls
        if call.id not in answered
    ]


def call_to_json(call: ToolCall) -> dict[str, Any]:
    """One tool call as a plain JSON object."""
    out: dict[str, Any] = {"id": call.id, "name": call.name, "arguments": call.arguments}
    if call.invalid_arguments is not None:
        out["invalid_arguments"] = call.invalid_arguments
    return out


def message_to_json(message: Message) -> dict[str, Any]:
    """One message as a plain JSON object (the keys of the versioned transcript form)."""
    match message:
        case SystemMessage(text=text) | UserMessage(text=text):
            return {"role": message.role, "text": text}
        case AssistantMessage(text=text, tool_calls=calls):
            out: dict[str, Any] = {"role": "assistant", "text": text}
            if calls:
                out["tool_calls"] = [call_to_json(c) for c in calls]
            if message.refusal is not None:
                out["refusal"] = message.refusal
            if message.reasoning:
                out["reasoning"] = [_reasoning_to_json(r) for r in message.reasoning]
            if message._wire_content is not None:
                style, blocks = message._wire_content
                # Kept as the provider sent them: a run resumed from storage must send
                # them back as they came (Anthropic's server tool blocks).
                out["provider_content"] = {"style": style, "blocks": list(blocks)}
            return out
        case ToolReturn():
            return {
                "role": "tool",
                "call_id": message.call_id,
                "name": message.name,
                "output": message.output,
                "is_error": message.is_error,
            }
    raise TypeError(f"not a transcript message: {message!r}")  # pragma: no cover


def _provider_content(raw: object, where: str) -> tuple[str, tuple[dict[str, Any], ...]]:
    """``{"style": str, "blocks": [object, ...]}``: a reply's content as its provider sent it."""
    if not isinstance(raw, Mapping):
        raise PayloadError(f"{where} must be a JSON object, got {type(raw).__name__}")
    style, blocks = raw.get("style"), raw.get("blocks")
    if not isinstance(style, str) or not style:
        raise PayloadError(f"{where}: 'style' must be a non-empty string")
    if not isinstance(blocks, list) or not all(isinstance(b, Mapping) for b in blocks):
        raise PayloadError(f"{where}: 'blocks' must be a list of JSON objects")
    return style, tuple(dict(b) for b in blocks)


def _reasoning_to_json(reasoning: Reasoning) -> dict[str, Any]:
    out: dict[str, Any] = {"style": reasoning.style, "text": reasoning.text}
    if reasoning.signature is not None:
        out["signature"] = reasoning.signature
    if reasoning.redacted is not None:
        out["redacted"] = reasoning.redacted
    return out


def _reasoning_from_json(raw: object, where: str) -> Reasoning:
    if not isinstance(raw, Mapping):
        raise PayloadError(f"{where} must be a JSON object")
    return Reasoning(
        _str(raw, "text", where),
        _str(raw, "signature", where, optional=True),
        _str(raw, "redacted", where, optional=True),
        _str(raw, "style", where),
    )


def _str(item: Mapping[str, Any], key: str, where: str, *, optional: bool = False) -> Any:
    value = item.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise PayloadError(f"{where}: {key!r} must be a string, got {type(value).__name__}")
    return value


def call_from_json(raw: object, at: str = "tool call") -> ToolCall:
    """Parse one tool call of the JSON form; :class:`PayloadError` names what is wrong."""
    if not isinstance(raw, Mapping):
        raise PayloadError(f"{at} must be a JSON object")
    arguments = raw.get("arguments", {})
    if not isinstance(arguments, dict):
        raise PayloadError(f"{at}: 'arguments' must be an object")
    return ToolCall(
        _str(raw, "id", at),
        _str(raw, "name", at),
        arguments,
        _str(raw, "invalid_arguments", at, optional=True),
    )


def message_from_json(item: object, where: str = "message") -> Message:
    """Parse one message of the JSON form; :class:`PayloadError` names what is wrong."""
    if not isinstance(item, Mapping):
        raise PayloadError(f"{where} must be a JSON object, got {type(item).__name__}")
    role = item.get("role")
    if role == "system":
        return SystemMessage(_str(item, "text", where))
    if role == "user":
        return UserMessage(_str(item, "text", where))
    if role == "assistant":
        raw_calls = item.get("tool_calls", [])
        if not isinstance(raw_calls, list):
            raise PayloadError(f"{where}: 'tool_calls' must be a list")
        calls = tuple(
            call_from_json(raw, f"{where}.tool_calls[{j}]") for j, raw in enumerate(raw_calls)
        )
        raw_reasoning = item.get("reasoning", [])
        if not isinstance(raw_reasoning, list):
            raise PayloadError(f"{where}: 'reasoning' must be a list")
        message = AssistantMessage(
            _str(item, "text", where, optional=True),
            calls,
            _str(item, "refusal", where, optional=True),
            tuple(
                _reasoning_from_json(raw, f"{where}.reasoning[{j}]")
                for j, raw in enumerate(raw_reasoning)
            ),
        )
        if "provider_content" in item:
            content = _provider_content(item["provider_content"], f"{where}.provider_content")
            object.__setattr__(message, "_wire_content", content)
        return message
    if role == "tool":
        is_error = item.get("is_error", False)
        if not isinstance(is_error, bool):
            raise PayloadError(f"{where}: 'is_error' must be a bool")
        return ToolReturn(
            _str(item, "call_id", where),
            _str(item, "name", where),
            _str(item, "output", where),
            is_error,
        )
    raise PayloadError(f"{where}: unknown role {role!r}")


def messages_to_json(messages: Iterable[Message]) -> dict[str, Any]:
    """The versioned JSON form of a transcript: ``{"version": 2, "messages": [...]}``.

    >>> messages_to_json([UserMessage("hi")])
    {'version': 2, 'messages': [{'role': 'user', 'text': 'hi'}]}
    """
    return {"version": TRANSCRIPT_VERSION, "messages": [message_to_json(m) for m in messages]}


def messages_from_json(payload: object) -> list[Message]:
    """Parse the versioned form (a dict, or its JSON text) back into messages; version 1,
    which had no reasoning, reads as it was written.

    >>> messages_from_json('{"version": 1, "messages": [{"role": "user", "text": "hi"}]}')
    [UserMessage(text='hi')]
    """
    if isinstance(payload, str | bytes):
        try:
            payload = json.loads(payload)
        except ValueError as exc:
            raise PayloadError(f"transcript is not valid JSON: {exc}") from None
        except RecursionError:
            raise PayloadError("transcript JSON is nested too deeply to read") from None
    if not isinstance(payload, Mapping):
        raise PayloadError("transcript must be a JSON object with 'version' and 'messages'")
    version = payload.get("version")
    if isinstance(version, bool) or version not in _READS:
        raise PayloadError(
            f"transcript version {version!r} is not supported (this release reads "
            f"versions {' and '.join(map(str, _READS))})"
        )
    items = payload.get("messages")
    if not isinstance(items, list):
        raise PayloadError("transcript 'messages' must be a list")
    return [message_from_json(item, f"messages[{i}]") for i, item in enumerate(items)]
