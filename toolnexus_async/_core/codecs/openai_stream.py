"""The OpenAI Chat Completions stream decoder: ``data:`` chunks in, one reply at ``[DONE]``.

Rule of this module: only what is particular to the OpenAI stream (chunk shapes, tool-call
fragments keyed by ``index``, the usage chunk, ``finish_reason`` as an end); the end and
failure bookkeeping, JSON parsing and :class:`~._stream.TextDelta` come from
:mod:`._stream`. No I/O: tests feed events by hand.
"""

from __future__ import annotations

from typing import Any

import attrs

from ..errors import ProtocolError, ProviderError
from ..messages import AssistantMessage, ModelReply, Reasoning, ToolCall, Usage
from ._common import (
    generated_call_id,
    openai_usage,
    parse_arguments,
    reasoning_of,
    remember_wire_arguments,
)
from ._sse import SSEEvent
from ._stream import ArgumentsDelta, Delta, ReasoningDelta, TextDelta, _Decoder, _int_index

__all__ = ("OpenAIStreamDecoder",)


@attrs.define
class _OpenAICall:
    id: str = ""
    name: str = ""
    arguments: list[object] = attrs.field(factory=list)


def _openai_status(error: object) -> int:
    if not isinstance(error, dict):
        return 500
    # Groq names the status the same error has as an HTTP reply ("status_code": 400 beside
    # "code": "tool_use_failed"); others put an HTTP status in "code".
    for key in ("status_code", "code"):
        code = error.get(key)
        if isinstance(code, str) and code.isascii() and code.isdigit():
            code = int(code)
        # Only a value that reads as an HTTP status is one; "rate_limit_exceeded" or 1234
        # is not.
        if isinstance(code, int) and not isinstance(code, bool) and 400 <= code <= 599:
            return code
    return 500


def _raw_arguments(pieces: list[object]) -> object:
    """A call's arguments as the unstreamed codec would be given them: the text of its
    fragments joined, or the one value some servers send whole instead (an object is
    accepted there; anything else is invalid arguments)."""
    texts = [piece for piece in pieces if isinstance(piece, str)]
    if len(texts) == len(pieces):
        return "".join(texts)
    sent = [piece for piece in pieces if piece != ""]
    # Text and values mixed, or several values, are no one JSON value: the list of them is
    # never an object, so it is reported as invalid, as it came.
    return sent[0] if len(sent) == 1 else sent


class OpenAIStreamDecoder(_Decoder):
    """Chat Completions chunks: ``choices[0].delta`` pieces, then ``data: [DONE]``.

    Tool calls arrive as fragments keyed by ``index``: the first fragment of an index
    carries ``id`` and ``function.name``, every fragment may add to ``function.arguments``.
    A fragment with another ``id`` at an index in use starts a new call there.
    With ``stream_options.include_usage`` a last chunk with empty ``choices`` carries the
    usage. The stream is complete once ``[DONE]`` or a ``finish_reason`` arrived.
    """

    style = "openai"
    end_marker = "[DONE]"

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self._text: list[str] | None = None  # None until the model sends any content
        self._refusal: list[str] = []  # refusal deltas: a refusal replaces the answer
        self._reasoning: list[str] = []  # reasoning deltas, never part of the text
        # Every call with its index, in the order they started; and the call each index
        # is filling now.
        self._calls: list[tuple[int, _OpenAICall]] = []
        self._open: dict[int, _OpenAICall] = {}
        self._usage: dict[str, Any] | None = None
        self._model: str | None = None
        self._finish_reason: str | None = None
        # The reply's id and creation time (the same on every chunk), to derive an id for a
        # tool call sent without one, as the unstreamed codec does.
        self._reply_id: object = None
        self._created: object = None

    def finish(self) -> ModelReply:
        # A finish_reason is the model's own end; a proxy that drops [DONE] (or a usage
        # chunk) after it has not truncated the reply.
        if self._finish_reason is not None and not self._failed:
            self._done = True
        return super().finish()

    def _feed(self, event: SSEEvent) -> list[Delta]:
        if event.data.strip() == "[DONE]":
            self._done = True
            return []
        chunk = self._json(event)
        if chunk.get("error"):
            raise ProviderError(_openai_status(chunk["error"]), event.data, self._url)
        model = chunk.get("model")
        if isinstance(model, str) and model:
            self._model = model
        if self._reply_id is None:
            self._reply_id, self._created = chunk.get("id"), chunk.get("created")
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            # Servers that repeat usage on every chunk send running totals: keep the last.
            self._usage = usage
        choices = chunk.get("choices")
        if choices is None:
            return []  # vLLM's usage-only chunk has "choices": null
        if not isinstance(choices, list):
            raise self._bad(event, "choices must be a list")
        deltas: list[Delta] = []
        for choice in choices:
            # With n > 1 the other choices interleave; the reply is choice 0, as unstreamed.
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            deltas.extend(self._choice(event, choice))
        return deltas

    def _choice(self, event: SSEEvent, choice: dict[str, Any]) -> list[Delta]:
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
        out: list[Delta] = []
        for fragment in fragments or ():
            piece = self._fragment(event, fragment)
            if piece is not None:
                out.append(piece)
        refusal = delta.get("refusal")
        if isinstance(refusal, str):
            self._refusal.append(refusal)
        thought = reasoning_of(delta)
        if thought:
            self._reasoning.append(thought)
            out.append(ReasoningDelta(thought))
        content = delta.get("content")
        if content is None:
            return out
        if not isinstance(content, str):
            raise self._bad(event, "choices[0].delta.content must be a string or null")
        if self._text is None:
            self._text = []
        if content:
            self._text.append(content)
            out.append(TextDelta(content))
        return out

    def _fragment(self, event: SSEEvent, fragment: object) -> ArgumentsDelta | None:
        if not isinstance(fragment, dict):
            raise self._bad(event, "a tool_calls fragment must be an object")
        index = _int_index(fragment.get("index"))
        if index is None:
            raise self._bad(event, "a tool_calls fragment has no integer 'index'")
        call = self._open.get(index)
        call_id = fragment.get("id")
        if call is None or (isinstance(call_id, str) and call_id and call.id not in ("", call_id)):
            # Ollama (and some vLLM builds) send every call of a parallel batch whole at
            # index 0: another id there is the next call, not more of the one before.
            call = self._open[index] = _OpenAICall()
            self._calls.append((index, call))
        if isinstance(call_id, str) and call_id and not call.id:
            call.id = call_id
        function = fragment.get("function")
        if not isinstance(function, dict):
            return None
        name = function.get("name")
        if isinstance(name, str) and name and not call.name:
            call.name = name
        arguments = function.get("arguments")
        # null is a fragment without a piece of the arguments; any other value is kept, to
        # be judged as the unstreamed codec judges it.
        if arguments is not None:
            call.arguments.append(arguments)
            if isinstance(arguments, str) and arguments and call.name:
                return ArgumentsDelta(call.name, arguments, index)
        return None

    def _reply(self) -> ModelReply:
        calls: list[ToolCall] = []
        seen: set[str] = set()
        # By index, and the calls of one index in the order they came (the sort is stable).
        ordered = sorted(self._calls, key=lambda entry: entry[0])
        for position, (index, call) in enumerate(ordered):
            where = f"openai stream: tool call at index {index}"
            if not call.name:
                raise ProtocolError(f"{where} has no function name")
            raw = _raw_arguments(call.arguments)
            raw_text = raw if type(raw) is str else ""
            # Gemini sends "id": "": derived from the reply, as the unstreamed codec does,
            # from the call's position in the reply's list (its index while the indices run
            # 0, 1, 2, ... with one call each).
            call_id = call.id or generated_call_id(
                self._reply_id, self._created, position, call.name, raw_text
            )
            if call_id in seen:
                raise ProtocolError(f"{where} has a repeated id {call_id!r}")
            seen.add(call_id)
            arguments, invalid = parse_arguments(raw)
            decoded = ToolCall(call_id, call.name, arguments, invalid)
            if invalid is None and raw_text:
                # Sent back verbatim next turn, as the unstreamed codec does.
                remember_wire_arguments(decoded, raw_text)
            calls.append(decoded)
        totals = Usage() if self._usage is None else openai_usage(self._usage)
        text = None if self._text is None else "".join(self._text)
        refusal = "".join(self._refusal) or None
        thought = "".join(self._reasoning)
        reasoning = (Reasoning(thought, style="openai"),) if thought else ()
        return ModelReply(
            AssistantMessage(text, tuple(calls), refusal, reasoning),
            totals,
            self._model,
            self._finish_reason,
        )
