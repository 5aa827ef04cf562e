"""The AI SDK's UI message stream for serve's runs, sans-IO: a chat request (``useChat``'s
body) in, decisions and stream parts out.

Rules of this module (docs/ui-protocols.md):

- A chat is a run: the chat's ``id`` is the run's id. A chat the store does not know
  starts a run with the last user message's text; a known one takes no new input.
- An approval request is sent as a ``tool-approval-request`` part (``approvalId``: the
  request's id) on its call; ``addToolApprovalResponse({id, approved, reason})`` comes back
  in the next request's messages, as the call's ``approval-responded`` state, and becomes
  the request's one :class:`Answer` (for one taken already, the same yes or no again is
  nothing). A request that is not an approval (a question) is answered with
  ``addToolOutput`` on its call, the output becoming the answer's data. Every open request
  is also sent as a ``data-toolnexus-request`` part (its prompt, kind, data and expiry), for
  a client to render.
- The SDK's approval has no edited arguments: a call's input edited in the client's
  messages, an approval field the SDK has not, a body's ``editedArgs`` are refused (an
  ``error`` part naming AG-UI and the inbox), never approved as the run asked.
- A denied call's result is a ``tool-output-denied`` part (``execution-denied`` to the
  model messages the AI SDK builds from it). An approval id the run never asked, an
  expired one, or a second, different answer to an answered one: an ``error`` part, and
  nothing is answered; the same answer again (a request re-sent) changes nothing.
- The stream never repeats what the client's messages hold (their tool calls, outputs and
  approvals; texts by content), and ends with ``finish`` once the run waits for people or
  ends, then ``[DONE]``.
- A reconnect (``resumeStream()``) is a replay, as the ``ai`` client's default transport
  takes it: the run's one reply message (:func:`reply_id`) whole, then the run followed
  (``Stream(replay=True)``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import attrs

from ..messages import AssistantMessage
from ..types import Answer
from .answers import CheckArguments, Refusal, Resume, Start, approval, reply, taken
from .runs import Asked, RunSnapshot, items

__all__ = (
    "DONE",
    "HEADERS",
    "ChatInput",
    "Resume",
    "Start",
    "Stream",
    "decide",
    "encode",
    "parse_chat",
    "reply_id",
)

Part = dict[str, Any]

# The stream's own header, which tells the client this is a UI message stream (version 1).
HEADERS = {"x-vercel-ai-ui-message-stream": "v1"}
DONE = b"data: [DONE]\n\n"

_OUTPUT_STATES = ("output-available", "output-error", "output-denied")


@attrs.frozen
class Response:
    """An ``addToolApprovalResponse`` found in the client's messages, with the ``input`` its
    call's part holds (None if none)."""

    approval_id: str
    approved: bool
    reason: str | None
    input: object = None


# What ai 7's UI message schema puts in a tool part's ``approval``; anything else (an
# ``editedArgs``, say) is not the SDK's, and is refused rather than dropped.
_APPROVAL_KEYS = frozenset(
    {"id", "approved", "reason", "descriptor", "requestReason", "isAutomatic", "signature"}
)
_NO_EDITS = (
    "the AI SDK's approval carries no edited arguments: approve the call as asked or decline "
    "it; to run it with other arguments, answer through AG-UI (resume payload 'editedArgs') "
    "or the inbox (POST /requests/{id}/answer)"
)


@attrs.frozen
class ChatInput:
    """What of a chat request a run needs."""

    chat_id: str
    prompt: str | None  # the last user message's text, if the last message is the user's
    users: int  # user messages sent
    responses: tuple[Response, ...]
    outputs: Mapping[str, object]  # tool call id -> the output the client added
    known: frozenset[tuple[str, str]]  # (kind, id): see runs.Item; ("approval", id) too
    texts: frozenset[str]


def parse_chat(body: Mapping[str, Any]) -> ChatInput:
    """Check a chat request's body; :class:`Refusal` says what is wrong."""
    chat_id = body.get("id")
    if not isinstance(chat_id, str) or not chat_id:
        raise Refusal("'id' must be a non-empty string (the chat's run id)")
    if body.get("trigger") == "regenerate-message":
        raise Refusal("a run cannot be regenerated; start a new chat")
    if "editedArgs" in body:
        raise Refusal(f"'editedArgs': {_NO_EDITS}")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise Refusal("'messages' must be a non-empty list of UI messages")
    prompt: str | None = None
    users = 0
    responses: list[Response] = []
    outputs: dict[str, object] = {}
    known: set[tuple[str, str]] = set()
    texts: set[str] = set()
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("parts"), list):
            raise Refusal(f"messages[{i}] must be an object with 'parts'")
        parts = [p for p in message["parts"] if isinstance(p, dict)]
        if message.get("role") == "user":
            users += 1
            prompt = "".join(str(p.get("text", "")) for p in parts if p.get("type") == "text")
            continue
        prompt = None
        for part in parts:
            kind = part.get("type")
            if kind == "text" and isinstance(part.get("text"), str):
                texts.add(part["text"])
            elif isinstance(kind, str) and (kind == "dynamic-tool" or kind.startswith("tool-")):
                _tool_part(part, known, responses, outputs)
    return ChatInput(
        chat_id, prompt, users, tuple(responses), outputs, frozenset(known), frozenset(texts)
    )


def _tool_part(
    part: Part,
    known: set[tuple[str, str]],
    responses: list[Response],
    outputs: dict[str, object],
) -> None:
    call_id = part.get("toolCallId")
    if not isinstance(call_id, str):
        return
    known.add(("call", call_id))
    state = part.get("state")
    if state in _OUTPUT_STATES:
        known.add(("result", call_id))
    if state == "output-available":
        outputs[call_id] = part.get("output")
    given = part.get("approval")
    if isinstance(given, dict) and isinstance(given.get("id"), str):
        known.add(("approval", given["id"]))
        if isinstance(given.get("approved"), bool):
            extra = sorted(set(given) - _APPROVAL_KEYS)
            if extra:
                raise Refusal(f"approval {given['id']!r} has {', '.join(extra)}: {_NO_EDITS}")
            reason = given.get("reason")
            responses.append(
                Response(
                    given["id"],
                    given["approved"],
                    reason if isinstance(reason, str) else None,
                    part.get("input"),
                )
            )


Decision = Start | Resume


def decide(
    given: ChatInput,
    snapshot: RunSnapshot | None,
    *,
    check: CheckArguments | None = None,
    now: datetime | None = None,
) -> Decision:
    """What to do with ``given``, the chat's run being ``snapshot`` (None: no such run).
    :class:`Refusal` is an ``error`` part: nothing is done."""
    if snapshot is None:
        if given.responses:
            raise Refusal(f"no run {given.chat_id!r} asked for approval")
        if not given.prompt or not given.prompt.strip():
            raise Refusal("a new chat needs a user message with text (the prompt)")
        return Start(given.prompt)
    if given.prompt is not None and (given.users > 1 or given.prompt != snapshot.prompt):
        raise Refusal(f"run {snapshot.run_id!r} takes no new input; start a new chat")
    when = now or datetime.now(UTC)
    asked = snapshot.asked_by_id()
    open_rows = {a.request.id: a for a in snapshot.open_requests()}
    open_ids = set(open_rows)
    answers: list[Answer] = []
    calls = {
        c.id: c for m in snapshot.messages if isinstance(m, AssistantMessage) for c in m.tool_calls
    }
    for response in given.responses:
        row = asked.get(response.approval_id)
        if row is None or row.request.kind != "approval":
            raise Refusal(f"run {snapshot.run_id!r} asked for no approval {response.approval_id!r}")
        call = calls.get(row.call_id)
        if (
            response.input is not None
            and call is not None
            and response.input != dict(call.arguments)
        ):
            # An input edited in the client's messages would otherwise be approved as the
            # run asked: refused, so that nobody believes their edit ran.
            raise Refusal(f"call {row.call_id!r} has an input the run did not ask for: {_NO_EDITS}")
        if row.answer is not None and row.answer.ok is response.approved:
            # Taken already, and the client says the same yes or no: all a response of the
            # SDK can say (a replayed message holds the answer however it was given: with
            # AG-UI's edits, from the inbox).
            continue
        answer = approval(row.request, response.approved, note=response.reason, check=check)
        if (new := taken(row, answer, open_ids, when)) is not None:
            answers.append(new)
    by_call = {a.call_id: a for a in open_rows.values() if a.request.kind != "approval"}
    for call_id, output in given.outputs.items():
        row = by_call.get(call_id)
        if row is not None:  # an answer; any other output is the run's own result, echoed
            if row.request.expired(when):
                raise Refusal(f"request {row.request.id!r} expired at {row.request.expires_at}")
            answers.append(reply(row.request, output))
    return Resume(tuple(answers))


def reply_id(chat_id: str) -> str:
    """The id of the one assistant message a chat's run is shown as (it grows, turn by turn)."""
    return f"{chat_id}:reply"


class Stream:
    """The parts of one response over a chat's run: :meth:`started`, then :meth:`advance`
    with each new snapshot until :attr:`over`.

    A ``replay`` is a reconnect's stream: the client (``resumeStream()``, whose default
    transport takes a reconnect as a replay) starts the reply message afresh at its
    ``start``, so the stream sends it whole: every part so far, each request already
    settled where the client saw it (after its turn's calls, its answer too), then what the
    run does next."""

    def __init__(
        self,
        known: frozenset[tuple[str, str]] = frozenset(),
        texts: frozenset[str] = frozenset(),
        *,
        replay: bool = False,
    ) -> None:
        self._sent = set(known)
        self._texts = set(texts)
        self._replay = replay
        self.over = False

    def started(self, message_id: str | None = None) -> Part:
        return {"type": "start", "messageId": message_id} if message_id else {"type": "start"}

    def error(self, message: str, code: str = "refused") -> Part:
        self.over = True
        return {"type": "error", "errorText": message}

    def advance(self, snapshot: RunSnapshot) -> list[Part]:
        parts: list[Part] = []
        settled = self._settled_by_call(snapshot) if self._replay else {}
        held: list[Part] = []  # a turn's settled requests, after all of its calls
        parent: str | None = None
        for item in items(snapshot):
            if held and (item.kind != "call" or item.parent != parent):
                parts += held
                held = []
            parent = item.parent
            key = (item.kind, item.id)
            if key in self._sent or (item.kind == "text" and item.text in self._texts):
                continue
            self._sent.add(key)
            if item.kind == "text":
                parts += [
                    {"type": "text-start", "id": item.id},
                    {"type": "text-delta", "id": item.id, "delta": item.text},
                    {"type": "text-end", "id": item.id},
                ]
            elif item.kind == "call":
                call = {"toolCallId": item.id, "toolName": item.name, "dynamic": True}
                parts += [
                    {"type": "tool-input-start", **call},
                    {"type": "tool-input-available", **call, "input": dict(item.arguments)},
                ]
                for asked in settled.get(item.id, ()):
                    held += self._request(asked)
            elif item.declined:
                parts.append({"type": "tool-output-denied", "toolCallId": item.id})
            elif item.is_error:
                parts.append(
                    {"type": "tool-output-error", "toolCallId": item.id, "errorText": item.output}
                )
            else:
                parts.append(
                    {
                        "type": "tool-output-available",
                        "toolCallId": item.id,
                        "output": item.output,
                        "dynamic": True,
                    }
                )
        return parts + held + self._end(snapshot)

    @staticmethod
    def _settled_by_call(snapshot: RunSnapshot) -> dict[str, list[Asked]]:
        """The requests no longer open, by call, in the order they were asked."""
        open_ids = {a.request.id for a in snapshot.open_requests()}
        by_call: dict[str, list[Asked]] = {}
        for asked in snapshot.asked:
            if asked.request.id not in open_ids:
                by_call.setdefault(asked.call_id, []).append(asked)
        return by_call

    def _request(self, asked: Asked) -> list[Part]:
        """A request as the client is shown it: its data part and, for an approval, the
        approval asked (and, replayed, the answer it got)."""
        request = asked.request
        parts: list[Part] = [
            {
                "type": "data-toolnexus-request",
                "id": request.id,
                "data": {**request.to_dict(), "toolCallId": asked.call_id},
            }
        ]
        if request.kind != "approval" or ("approval", request.id) in self._sent:
            return parts
        self._sent.add(("approval", request.id))
        parts.append(
            {"type": "tool-approval-request", "approvalId": request.id, "toolCallId": asked.call_id}
        )
        answer = asked.answer
        if answer is not None:
            note = (answer.data or {}).get("note")
            parts.append(
                {"type": "tool-approval-response", "approvalId": request.id, "approved": answer.ok}
                | ({"reason": note} if isinstance(note, str) else {})
            )
        return parts

    def _end(self, snapshot: RunSnapshot) -> list[Part]:
        if snapshot.ended:
            self.over = True
            if snapshot.status == "error":
                return [self.error(snapshot.error or "the run failed")]
            reason = "stop" if snapshot.status == "done" else "other"
            return [{"type": "finish", "finishReason": reason}]
        if not snapshot.waits():
            return []
        self.over = True
        parts: list[Part] = []
        for asked in snapshot.open_requests():
            parts += self._request(asked)
        return [*parts, {"type": "finish", "finishReason": "tool-calls"}]


def encode(part: Part) -> bytes:
    """One part as a server-sent event."""
    return b"data: " + json.dumps(part, separators=(",", ":")).encode() + b"\n\n"
