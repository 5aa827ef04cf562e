"""The AG-UI protocol for serve's runs, sans-IO: a ``RunAgentInput`` in, decisions and
events out.

Rules of this module (docs/ui-protocols.md):

- A thread is a run: ``threadId`` is the run's id. A thread the store does not know starts
  a run with the last user message as its prompt; a known one takes no new input. Sent
  again without ``resume`` (a client that reconnects), it follows the run from where it is.
- A suspension ends the stream with ``RUN_FINISHED`` whose outcome is ``interrupt``,
  listing every open request of the run, after a ``MESSAGES_SNAPSHOT`` of the transcript
  (the state a resume needs). The ``resume[]`` of the next input must answer every open
  request; each entry becomes the one :class:`Answer` of its request (``.answers``); an
  entry the store has taken already, with the same answer, is a replay and changes
  nothing; an unknown or expired id, an answer that differs from the one taken, edited
  arguments the tool refuses, a resume that leaves a request open: ``RUN_ERROR``, and
  nothing at all is answered.
- The stream never repeats what the client holds: what it has is read from the
  ``messages`` it sends (:mod:`.runs` gives everything stable ids), and a tool-bound
  interrupt's call gets its ``TOOL_CALL_RESULT`` in the run that resumes it.
- Events are plain dicts with the protocol's camelCase keys; the adapter frames them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import attrs

from ..messages import AssistantMessage, SystemMessage, ToolReturn, UserMessage
from ..types import Answer
from .answers import (
    CheckArguments,
    Refusal,
    Resume,
    Start,
    approval,
    cancelled,
    reply,
    response_schema,
    taken,
)
from .runs import Asked, RunSnapshot, arguments_json, items, message_id

__all__ = (
    "Attach",
    "Decision",
    "Resume",
    "RunInput",
    "Start",
    "Stream",
    "decide",
    "interrupt_of",
    "parse_input",
)

Event = dict[str, Any]

# Request kinds and the interrupt reasons the protocol names for them; any other kind is
# namespaced (the protocol reserves bare words for its own).
_REASONS = {"approval": "tool_call", "question": "input_required", "input": "input_required"}


@attrs.frozen
class RunInput:
    """What of a ``RunAgentInput`` a run needs."""

    thread_id: str
    run_id: str
    prompt: str | None  # the last user message's text
    known: frozenset[tuple[str, str]]  # (kind, id) the client holds: see runs.Item
    resume: tuple[Mapping[str, Any], ...] | None


def parse_input(body: Mapping[str, Any]) -> RunInput:
    """Check a ``RunAgentInput``; :class:`Refusal` says what is wrong."""
    thread_id = body.get("threadId")
    run_id = body.get("runId")
    if not isinstance(thread_id, str) or not thread_id:
        raise Refusal("'threadId' must be a non-empty string (the run's id)")
    if not isinstance(run_id, str) or not run_id:
        raise Refusal("'runId' must be a non-empty string")
    messages = body.get("messages", [])
    if not isinstance(messages, list):
        raise Refusal("'messages' must be a list")
    prompt: str | None = None
    known: set[tuple[str, str]] = set()
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise Refusal(f"messages[{i}] must be an object with a 'role'")
        role = message["role"]
        if role == "user":
            prompt = _text(message.get("content"), i)
        elif role == "assistant":
            if isinstance(message.get("id"), str):
                known.add(("text", message["id"]))
            for call in message.get("toolCalls") or ():
                if isinstance(call, dict) and isinstance(call.get("id"), str):
                    known.add(("call", call["id"]))
        elif role == "tool" and isinstance(message.get("toolCallId"), str):
            known.add(("result", message["toolCallId"]))
    resume = body.get("resume")
    if resume is not None:
        if not isinstance(resume, list):
            raise Refusal("'resume' must be a list of {interruptId, status, payload}")
        for i, entry in enumerate(resume):
            if not isinstance(entry, dict) or not isinstance(entry.get("interruptId"), str):
                raise Refusal(f"resume[{i}] must be an object with a string 'interruptId'")
            if entry.get("status") not in ("resolved", "cancelled"):
                raise Refusal(f"resume[{i}].status must be 'resolved' or 'cancelled'")
        resume = tuple(resume)
    return RunInput(thread_id, run_id, prompt, frozenset(known), resume)


def _text(content: object, index: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # parts: the text ones, joined
        return "".join(
            p["text"]
            for p in content
            if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        )
    raise Refusal(f"messages[{index}].content must be text or a list of parts")


@attrs.frozen
class Attach:
    """Follow the run from where it is (a client that sent the same input again)."""


Decision = Start | Resume | Attach


def decide(
    given: RunInput,
    snapshot: RunSnapshot | None,
    *,
    check: CheckArguments | None = None,
    now: datetime | None = None,
) -> Decision:
    """What to do with ``given``, the thread's run being ``snapshot`` (None: no such run).
    :class:`Refusal` is a ``RUN_ERROR``: nothing is done."""
    if snapshot is None:
        if given.resume:
            raise Refusal(f"no run {given.thread_id!r} waits for an answer")
        if not given.prompt or not given.prompt.strip():
            raise Refusal("a new thread needs a user message with text (the prompt)")
        return Start(given.prompt)
    if given.resume is None:
        if snapshot.open_requests():
            ids = ", ".join(a.request.id for a in snapshot.open_requests())
            raise Refusal(
                f"run {snapshot.run_id!r} waits for answers ({ids}): send them as 'resume', "
                "before any new input"
            )
        if given.prompt is not None and given.prompt != snapshot.prompt:
            raise Refusal(
                f"run {snapshot.run_id!r} takes no new input; start a new thread for a new prompt"
            )
        return Attach()
    return Resume(_answers(given.resume, snapshot, check, now or datetime.now(UTC)))


def _answers(
    resume: Sequence[Mapping[str, Any]],
    snapshot: RunSnapshot,
    check: CheckArguments | None,
    now: datetime,
) -> tuple[Answer, ...]:
    asked = snapshot.asked_by_id()
    open_ids = {a.request.id for a in snapshot.open_requests()}
    seen: set[str] = set()
    answers: list[Answer] = []
    for entry in resume:
        rid = entry["interruptId"]
        if rid in seen:
            raise Refusal(f"resume answers interrupt {rid!r} twice")
        seen.add(rid)
        row = asked.get(rid)
        if row is None:
            raise Refusal(f"run {snapshot.run_id!r} has no interrupt {rid!r}")
        answer = taken(row, _answer(entry, row, check), open_ids, now)
        if answer is not None:
            answers.append(answer)
    if missing := sorted(open_ids - seen):
        raise Refusal(f"resume must answer every open interrupt; missing: {', '.join(missing)}")
    return tuple(answers)


def _answer(entry: Mapping[str, Any], row: Asked, check: CheckArguments | None) -> Answer:
    request = row.request
    if entry["status"] == "cancelled":
        return cancelled(request)
    payload = entry.get("payload")
    if request.kind != "approval":
        return reply(request, payload)
    if not isinstance(payload, dict) or not isinstance(payload.get("approved"), bool):
        raise Refusal(f"the payload for interrupt {request.id!r} must be {{'approved': bool}}")
    note = payload.get("reason")
    return approval(
        request,
        payload["approved"],
        edited=payload.get("editedArgs"),
        note=note if isinstance(note, str) else None,
        check=check,
    )


def interrupt_of(asked: Asked) -> Event:
    """The ``Interrupt`` of an open request."""
    request = asked.request
    reason = _REASONS.get(request.kind, f"toolnexus:{request.kind}")
    out: Event = {"id": request.id, "reason": reason, "message": request.prompt}
    if request.kind == "approval":
        out["toolCallId"] = asked.call_id
    schema = response_schema(request)
    if schema is not None:
        out["responseSchema"] = schema
    if request.expires_at is not None:
        out["expiresAt"] = request.expires_at
    metadata: Event = {"kind": request.kind, "toolCallId": asked.call_id}
    if request.data is not None:
        metadata["data"] = request.data
    if request.url is not None:
        metadata["url"] = request.url
    out["metadata"] = metadata
    return out


class Stream:
    """The events of one AG-UI run over a thread's run: :meth:`started`, then
    :meth:`advance` with each new snapshot until :attr:`over`."""

    def __init__(self, given: RunInput) -> None:
        self.thread_id = given.thread_id
        self.run_id = given.run_id
        self._sent = set(given.known)
        self.over = False

    def started(self) -> Event:
        return {"type": "RUN_STARTED", "threadId": self.thread_id, "runId": self.run_id}

    def error(self, message: str, code: str = "refused") -> Event:
        self.over = True
        return {"type": "RUN_ERROR", "message": message, "code": code}

    def advance(self, snapshot: RunSnapshot) -> list[Event]:
        """The events of what happened since the last call, and the end if it came."""
        events: list[Event] = []
        for item in items(snapshot):
            key = (item.kind, item.id)
            if key in self._sent:
                continue
            self._sent.add(key)
            if item.kind == "text":
                events += [
                    {"type": "TEXT_MESSAGE_START", "messageId": item.id, "role": "assistant"},
                    {"type": "TEXT_MESSAGE_CONTENT", "messageId": item.id, "delta": item.text},
                    {"type": "TEXT_MESSAGE_END", "messageId": item.id},
                ]
            elif item.kind == "call":
                start: Event = {
                    "type": "TOOL_CALL_START",
                    "toolCallId": item.id,
                    "toolCallName": item.name,
                    "parentMessageId": item.parent,
                }
                args = arguments_json(item.arguments)
                events += [
                    start,
                    {"type": "TOOL_CALL_ARGS", "toolCallId": item.id, "delta": args},
                    {"type": "TOOL_CALL_END", "toolCallId": item.id},
                ]
            else:
                events.append(
                    {
                        "type": "TOOL_CALL_RESULT",
                        "messageId": f"{snapshot.run_id}:result:{item.id}",
                        "toolCallId": item.id,
                        "content": item.output,
                        "role": "tool",
                    }
                )
        events += self._end(snapshot)
        return events

    def _end(self, snapshot: RunSnapshot) -> list[Event]:
        if snapshot.ended:
            self.over = True
            if snapshot.status == "error":
                return [self.error(snapshot.error or "the run failed", "run_failed")]
            result = {"status": snapshot.status, "text": snapshot.text}
            return [self._finished({"type": "success"}, result)]
        if snapshot.waits():
            self.over = True
            interrupts = [interrupt_of(a) for a in snapshot.open_requests()]
            return [
                {"type": "MESSAGES_SNAPSHOT", "messages": messages_of(snapshot)},
                self._finished({"type": "interrupt", "interrupts": interrupts}),
            ]
        return []

    def _finished(self, outcome: Event, result: object = None) -> Event:
        event: Event = {
            "type": "RUN_FINISHED",
            "threadId": self.thread_id,
            "runId": self.run_id,
            "outcome": outcome,
        }
        if result is not None:
            event["result"] = result
        return event


def messages_of(snapshot: RunSnapshot) -> list[Event]:
    """The run's transcript as AG-UI messages (with the current turn's results)."""
    out: list[Event] = []
    given: set[str] = set()
    for index, message in enumerate(snapshot.messages):
        mid = message_id(snapshot.run_id, index)
        if isinstance(message, UserMessage):
            out.append({"id": mid, "role": "user", "content": message.text})
        elif isinstance(message, SystemMessage):
            out.append({"id": mid, "role": "system", "content": message.text})
        elif isinstance(message, AssistantMessage):
            shown: Event = {"id": mid, "role": "assistant"}
            if message.text:
                shown["content"] = message.text
            if message.tool_calls:
                shown["toolCalls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": arguments_json(c.arguments)},
                    }
                    for c in message.tool_calls
                ]
            out.append(shown)
        elif isinstance(message, ToolReturn):
            given.add(message.call_id)
            out.append(_tool_message(snapshot.run_id, message.call_id, message.output))
    for call_id in snapshot.turn_calls():
        settled = snapshot.results.get(call_id)
        if settled is not None and call_id not in given:
            out.append(_tool_message(snapshot.run_id, call_id, settled.output))
    return out


def _tool_message(run_id: str, call_id: str, output: str) -> Event:
    return {
        "id": f"{run_id}:result:{call_id}",
        "role": "tool",
        "content": output,
        "toolCallId": call_id,
    }


def encode(event: Event) -> bytes:
    """One event as a server-sent event (the framing AG-UI's HTTP clients read)."""
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"
