"""What the Gemini codec and its stream decoder share: parts, usage, finish reasons, ids.

Rule of this module: pure readings of the Generative Language API's (v1beta) JSON, the same
for a whole reply and for a stream's gathered chunks, so that both decode to the same
message: a candidate's ``content.parts`` to an :class:`AssistantMessage`
(:func:`message_of`), ``usageMetadata`` to :class:`Usage`, a ``finishReason`` or a prompt's
``blockReason`` to a stop reason and, for a block, a refusal (:func:`outcome_of`).

Ids: a ``functionCall`` part may come without an ``id`` (Gemini 2 models never send one;
Gemini 3 models do). Such a call gets a local id, ``gcall_`` and 24 hex digits, derived from
the reply alone (:func:`local_call_id`), so decoding the same reply twice, streamed or not,
gives the same id; a local id is never sent to the API, which pairs those calls with their
``functionResponse`` parts by name and order instead.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any

from ..errors import ProtocolError
from ..messages import AssistantMessage, Reasoning, ToolCall, Usage
from ._common import count, field, obj, remember_wire_content

__all__ = (
    "BLOCKED",
    "STYLE",
    "gemini_usage",
    "is_local_id",
    "local_call_id",
    "merge_part",
    "message_of",
    "outcome_of",
    "prompt_refusal",
)

STYLE = "gemini"

# Finish reasons by which the provider withheld (part of) the answer: a refusal, never a
# failure of the run.
BLOCKED = frozenset(
    {
        "SAFETY",
        "RECITATION",
        "BLOCKLIST",
        "PROHIBITED_CONTENT",
        "SPII",
        "IMAGE_SAFETY",
        "IMAGE_PROHIBITED_CONTENT",
        "IMAGE_RECITATION",
        "LANGUAGE",
    }
)
# Our names for the finish reasons the loop acts on; any other is lower-cased.
_STOP = {"STOP": "stop", "MAX_TOKENS": "max_tokens"}
# A part with only these keys is said in full by the neutral transcript; any other key (a
# thoughtSignature, a server tool's toolCall/toolResponse, executableCode, inlineData...)
# makes the reply's parts worth keeping, to be sent back as they came.
_NEUTRAL = frozenset({"text", "thought", "functionCall"})
_LOCAL = re.compile(r"gcall_[0-9a-f]{24}")


def local_call_id(response_id: object, index: int, name: str, args: object) -> str:
    """The id of a call sent without one: from the reply's ``responseId``, the call's
    position among the reply's calls, its name and arguments."""
    seed = json.dumps([response_id, index, name, args], sort_keys=True, default=str)
    return "gcall_" + hashlib.sha256(seed.encode()).hexdigest()[:24]


def is_local_id(call_id: str) -> bool:
    """Whether ``call_id`` was made here (:func:`local_call_id`), not sent by the API."""
    return _LOCAL.fullmatch(call_id) is not None


def gemini_usage(meta: object) -> Usage:
    """``usageMetadata`` as Usage. Gemini counts thoughts apart from the candidates:
    they are added to the completion (and counted as reasoning), as the other styles do."""
    if not isinstance(meta, dict):
        return Usage()
    prompt = count(meta, "promptTokenCount") + count(meta, "toolUsePromptTokenCount")
    thoughts = count(meta, "thoughtsTokenCount")
    completion = count(meta, "candidatesTokenCount") + thoughts
    return Usage(
        prompt,
        completion,
        count(meta, "totalTokenCount") or prompt + completion,
        # cachedContentTokenCount is a part of promptTokenCount, as in the other styles.
        count(meta, "cachedContentTokenCount"),
        0,
        thoughts,
    )


def outcome_of(reason: object, candidate: dict[str, Any] | None) -> tuple[str | None, str | None]:
    """``(stop_reason, refusal)`` of a candidate's ``finishReason``: a block is the stop
    reason ``"refusal"`` with a sentence saying what withheld the reply."""
    if not isinstance(reason, str) or not reason:
        return None, None
    if reason not in BLOCKED:
        return _STOP.get(reason, reason.lower()), None
    said = f"Gemini withheld the reply (finishReason {reason})"
    blocked = _categories((candidate or {}).get("safetyRatings"))
    if blocked:
        said += f": {', '.join(blocked)}"
    message = (candidate or {}).get("finishMessage")
    if isinstance(message, str) and message:
        said += f". {message[:200]}"
    return "refusal", said


def prompt_refusal(feedback: object) -> str | None:
    """The refusal of a prompt Gemini blocked (``promptFeedback.blockReason``), or None."""
    if not isinstance(feedback, dict):
        return None
    reason = feedback.get("blockReason")
    if not isinstance(reason, str) or not reason:
        return None
    said = f"Gemini blocked the prompt (blockReason {reason})"
    blocked = _categories(feedback.get("safetyRatings"))
    return said + (f": {', '.join(blocked)}" if blocked else "")


def _categories(ratings: object) -> list[str]:
    if not isinstance(ratings, list):
        return []
    return [
        str(rating.get("category"))
        for rating in ratings
        if isinstance(rating, dict) and rating.get("blocked") is True
    ]


def merge_part(parts: list[dict[str, Any]], part: dict[str, Any]) -> None:
    """Add a streamed ``part`` to ``parts``: a piece of text joins the text part before it
    (of the same kind, thought or not), as the unstreamed reply holds it whole; a signature
    sent on a last empty piece goes with the text it ends."""
    text = part.get("text")
    if type(text) is str and parts and set(part) <= {"text", "thought", "thoughtSignature"}:
        last = parts[-1]
        if (
            type(last.get("text")) is str
            and set(last) <= {"text", "thought"}
            and bool(last.get("thought")) == bool(part.get("thought"))
        ):
            merged = {**last, "text": last["text"] + text}
            if "thoughtSignature" in part:
                merged["thoughtSignature"] = part["thoughtSignature"]
            parts[-1] = merged
            return
    if set(part) == {"text"} and text == "":
        return  # an empty piece says nothing
    parts.append(dict(part))


def message_of(
    parts: Sequence[object], response_id: object, where: str, refusal: str | None = None
) -> AssistantMessage:
    """The assistant message of a candidate's ``parts``.

    Text parts join to the text; ``thought`` parts are :class:`Reasoning` (style
    ``"gemini"``); ``functionCall`` parts are tool calls. When a part carries what the
    fields cannot say (a ``thoughtSignature``, which Gemini 3 requires back with its call,
    or a server tool's parts), the parts are kept to be sent back as they came; a blocked
    reply keeps its parts too (often none), so that what the model said is what goes back,
    not the refusal's sentence.
    """
    texts: list[str] = []
    calls: list[ToolCall] = []
    reasoning: list[Reasoning] = []
    seen: set[str] = set()
    keep = refusal is not None
    for i, raw in enumerate(parts):
        here = f"{where}[{i}]"
        part = obj(raw, here, STYLE)
        if not part.keys() <= _NEUTRAL:
            keep = True
        call = part.get("functionCall")
        if call is not None:
            calls.append(_call(call, f"{here}.functionCall", response_id, len(calls), seen))
            continue
        text = part.get("text")
        if text is None:
            continue
        if type(text) is not str:
            raise ProtocolError(f"gemini reply: {here}.text must be a string")
        if part.get("thought") is True:
            if text:
                reasoning.append(Reasoning(text, style=STYLE))
        else:
            texts.append(text)
    message = AssistantMessage("".join(texts) or None, tuple(calls), refusal, tuple(reasoning))
    if keep:
        remember_wire_content(
            message, STYLE, [p for p in parts if not (isinstance(p, dict) and p == {"text": ""})]
        )
    return message


def _call(raw: object, where: str, response_id: object, index: int, seen: set[str]) -> ToolCall:
    call = obj(raw, where, STYLE)
    name = field(call, "name", str, where, STYLE)
    args = call.get("args")
    call_id = call.get("id")
    if call_id is None or call_id == "":
        call_id = local_call_id(response_id, index, name, args)
    elif not isinstance(call_id, str):
        raise ProtocolError(f"gemini reply: {where}.id must be a string")
    if call_id in seen:
        raise ProtocolError(f"gemini reply: {where}.id {call_id!r} is repeated")
    seen.add(call_id)
    if args is None:
        return ToolCall(call_id, name, {})  # a call without arguments may leave args out
    if isinstance(args, dict):
        return ToolCall(call_id, name, args)
    return ToolCall(call_id, name, {}, json.dumps(args))
