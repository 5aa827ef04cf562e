"""A run as the front-end protocols see it, and what of it a client has already been sent.

Rules of this module:

- :class:`RunSnapshot` is all a protocol needs of a run, read whole from the store by the
  adapter each time the run may have changed: its transcript, the current turn's recorded
  results and every request it made with what became of it. A protocol never keeps a run's
  state of its own, so a stream can start on any worker, after a restart or a reconnect,
  and say the same thing.
- The things a client is shown (an assistant text, a tool call, a tool result) have ids
  derived from the run, never drawn at random (:func:`items`): a message is the run id
  and its place in the transcript, which only grows; a call keeps the model's id. So what a
  client already holds can be told from its own messages, and a stream sends only the
  rest, never a thing twice.
- A request is open while the store has it pending in the run's current turn and the run
  has not ended; the run waits for people (an interrupt) once it has open requests and
  every call of its turn has either a result or an open request: a call still running may
  ask for more.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import attrs

from ..messages import AssistantMessage, Message, ToolReturn
from ..types import Answer, Request

__all__ = ("Asked", "Item", "RunSnapshot", "Settled", "arguments_json", "items", "message_id")


@attrs.frozen
class Asked:
    """One request of a run: the call that raised it, its store status (``pending``,
    ``answered``, ``expired``, ...) and its answer, once it has one."""

    request: Request
    call_id: str
    turn: int
    status: str
    answer: Answer | None = None


@attrs.frozen
class Settled:
    """A call's result as the model is (or will be) given it; ``declined``: its request
    was refused or expired, so the tool did not run."""

    output: str
    is_error: bool
    declined: bool = False


@attrs.frozen
class RunSnapshot:
    """A run whole, as the store had it when it was read."""

    run_id: str
    status: str  # running | pending | done | incomplete | error
    prompt: str
    turn: int
    ended: bool
    messages: tuple[Message, ...]
    results: Mapping[str, Settled]  # the current turn's recorded results, by call id
    declined: frozenset[str]  # calls of earlier turns whose request had no yes
    asked: tuple[Asked, ...]
    text: str | None = None
    error: str | None = None

    def open_requests(self) -> list[Asked]:
        """The requests the run waits for now, in the order of their calls (expired ones
        included until the store records them: answering them is refused as expired)."""
        if self.ended:
            return []
        open_now = [a for a in self.asked if a.status == "pending" and a.turn == self.turn]
        # In the order of the turn's calls, not the order they asked in (they race).
        order = {call_id: i for i, call_id in enumerate(self.turn_calls())}
        return sorted(open_now, key=lambda a: order.get(a.call_id, len(order)))

    def turn_calls(self) -> tuple[str, ...]:
        """The ids of the current turn's calls (none once the run ended or between turns)."""
        last = self.messages[-1] if self.messages else None
        if self.ended or not self.turn or not isinstance(last, AssistantMessage):
            return ()
        return tuple(call.id for call in last.tool_calls)

    def waits(self) -> bool:
        """Whether the run now waits for people only: open requests, and every call of the
        turn settled or asking."""
        open_calls = {a.call_id for a in self.open_requests()}
        if not open_calls:
            return False
        return all(c in self.results or c in open_calls for c in self.turn_calls())

    def asked_by_id(self) -> dict[str, Asked]:
        return {a.request.id: a for a in self.asked}


@attrs.frozen
class Item:
    """One thing a client is shown: ``kind`` is ``"text"`` (``text``), ``"call"``
    (``name``, ``arguments``, ``parent``) or ``"result"`` (``output``, ``is_error``,
    ``declined``); ``id`` is the message id of a text, the call id of a call or result."""

    kind: str
    id: str
    text: str = ""
    name: str = ""
    arguments: Mapping[str, Any] = attrs.field(factory=dict)
    parent: str | None = None
    output: str = ""
    is_error: bool = False
    declined: bool = False


def message_id(run_id: str, index: int) -> str:
    """The id of the transcript's message at ``index``: stable, as the transcript only grows."""
    return f"{run_id}:{index}"


def arguments_json(arguments: Mapping[str, Any]) -> str:
    return json.dumps(dict(arguments), ensure_ascii=False, separators=(",", ":"))


def items(snapshot: RunSnapshot) -> Iterator[Item]:
    """What of ``snapshot`` a client is shown, in the order it happened: the assistant's
    texts and calls, and each call's result (from the transcript, or recorded in the current
    turn)."""
    given: set[str] = set()
    declined = snapshot.declined | {c for c, r in snapshot.results.items() if r.declined}
    for index, message in enumerate(snapshot.messages):
        if isinstance(message, AssistantMessage):
            mid = message_id(snapshot.run_id, index)
            if message.text:
                yield Item("text", mid, text=message.text)
            for call in message.tool_calls:
                yield Item("call", call.id, name=call.name, arguments=call.arguments, parent=mid)
        elif isinstance(message, ToolReturn):
            given.add(message.call_id)
            yield Item(
                "result",
                message.call_id,
                output=message.output,
                is_error=message.is_error,
                declined=message.call_id in declined,
            )
    for call_id in snapshot.turn_calls():
        settled = snapshot.results.get(call_id)
        if settled is not None and call_id not in given:
            yield Item(
                "result",
                call_id,
                output=settled.output,
                is_error=settled.is_error,
                declined=settled.declined,
            )
