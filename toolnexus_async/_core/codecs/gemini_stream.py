"""The Gemini stream decoder: ``streamGenerateContent?alt=sse`` chunks in, one reply at the end.

Rule of this module: only what is particular to Gemini's stream. Every event is a whole
``GenerateContentResponse`` holding the next parts of candidate 0; text arrives in pieces
(joined as :func:`~.gemini_parts.merge_part` says), a ``functionCall`` part whole. The
stream has no end marker: the provider closes it after the chunk that carries the
``finishReason`` (or a ``promptFeedback.blockReason``), so the reply is complete once one
of those arrived, and the last ``usageMetadata`` is the reply's. An ``error`` object in a
chunk raises :class:`~toolnexus_async.ProviderError` with the HTTP status it names. No I/O.
"""

from __future__ import annotations

from typing import Any

from ..errors import ProtocolError, ProviderError
from ..messages import ModelReply
from ._sse import SSEEvent
from ._stream import Delta, ReasoningDelta, TextDelta, _Decoder
from .gemini_parts import STYLE, gemini_usage, merge_part, message_of, outcome_of, prompt_refusal

__all__ = ("GeminiStreamDecoder",)


def _status(error: object) -> int:
    code = error.get("code") if isinstance(error, dict) else None
    # Google's error JSON carries the HTTP status as "code" (and its name as "status").
    if isinstance(code, int) and not isinstance(code, bool) and 400 <= code <= 599:
        return code
    return 500


class GeminiStreamDecoder(_Decoder):
    """Response chunks: candidate 0's parts in pieces, then one with its ``finishReason``."""

    style = STYLE
    end_marker = "a finishReason"

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self._parts: list[dict[str, Any]] = []
        self._usage: object = None
        self._model: str | None = None
        self._response_id: object = None
        self._reason: object = None
        self._candidate: dict[str, Any] | None = None  # the one that finished, for its ratings
        self._blocked: str | None = None  # a refusal of the prompt

    def finish(self) -> ModelReply:
        if (self._reason is not None or self._blocked is not None) and not self._failed:
            self._done = True
        return super().finish()

    def _feed(self, event: SSEEvent) -> list[Delta]:
        chunk = self._json(event)
        if chunk.get("error"):
            raise ProviderError(_status(chunk["error"]), event.data, self._url)
        model = chunk.get("modelVersion")
        if isinstance(model, str) and model:
            self._model = model
        if self._response_id is None:
            self._response_id = chunk.get("responseId")
        if "usageMetadata" in chunk:
            self._usage = chunk["usageMetadata"]  # running totals: the last one counts
        blocked = prompt_refusal(chunk.get("promptFeedback"))
        if blocked is not None:
            self._blocked = blocked
        candidates = chunk.get("candidates")
        if candidates is None:
            return []
        if not isinstance(candidates, list):
            raise self._bad(event, "candidates must be a list")
        deltas: list[Delta] = []
        for candidate in candidates:
            # With candidateCount > 1 the others interleave; the reply is candidate 0.
            if not isinstance(candidate, dict) or candidate.get("index", 0) != 0:
                continue
            deltas.extend(self._candidate_chunk(event, candidate))
        return deltas

    def _candidate_chunk(self, event: SSEEvent, candidate: dict[str, Any]) -> list[Delta]:
        reason = candidate.get("finishReason")
        if isinstance(reason, str) and reason:
            self._reason, self._candidate = reason, candidate
        content = candidate.get("content")
        if content is None:
            return []
        if not isinstance(content, dict):
            raise self._bad(event, "candidates[0].content must be an object")
        parts = content.get("parts")
        if parts is None:
            return []
        if not isinstance(parts, list):
            raise self._bad(event, "candidates[0].content.parts must be a list")
        out: list[Delta] = []
        for part in parts:
            if not isinstance(part, dict):
                raise self._bad(event, "a part must be an object")
            merge_part(self._parts, part)
            text = part.get("text")
            if type(text) is str and text and "functionCall" not in part:
                out.append(ReasoningDelta(text) if part.get("thought") is True else TextDelta(text))
        return out

    def _reply(self) -> ModelReply:
        stop: str | None
        if self._reason is None:
            stop, refusal = "refusal", self._blocked
        else:
            stop, refusal = outcome_of(self._reason, self._candidate)
        try:
            message = message_of(self._parts, self._response_id, "stream parts", refusal)
        except ProtocolError as exc:
            raise ProtocolError(str(exc).replace("gemini reply", "gemini stream")) from None
        return ModelReply(message, gemini_usage(self._usage), self._model, stop)
