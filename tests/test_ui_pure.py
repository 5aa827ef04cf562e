"""The front-end protocols' logic without a socket or a store (``toolnexus_async._core.ui``): runs
as snapshots in, decisions and events out; every AG-UI event validated by ``ag-ui-protocol``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from ag_ui.core import Event
from pydantic import TypeAdapter

from toolnexus_async import Answer, AssistantMessage, Request, ToolCall, UserMessage
from toolnexus_async._core.ui import agui, aisdk
from toolnexus_async._core.ui.answers import Refusal
from toolnexus_async._core.ui.runs import Asked, RunSnapshot, Settled

EVENTS: TypeAdapter[Any] = TypeAdapter(Event)
DIGEST = "sha256:abc"


def approval(rid: str, call: str, *, editable: bool = False, expires: str | None = None) -> Request:
    data: dict[str, Any] = {"tool": "pay", "arguments": {"amount": 5}, "digest": DIGEST}
    if editable:
        data["editable"] = True
    return Request(rid, "approval", f"Allow {call}?", data=data, expires_at=expires)


def run(
    *asked: Asked, results: dict[str, Settled] | None = None, calls: int = 2, ended: bool = False
) -> RunSnapshot:
    turn = AssistantMessage(
        "Working.", tuple(ToolCall(f"c{i}", "pay", {"amount": 5}) for i in range(1, calls + 1))
    )
    return RunSnapshot(
        run_id="t1",
        status="pending",
        prompt="shop",
        turn=1,
        ended=ended,
        messages=(UserMessage("shop"), turn),
        results=results or {},
        declined=frozenset(),
        asked=asked,
    )


def given(**body: Any) -> agui.RunInput:
    return agui.parse_input({"threadId": "t1", "runId": "r1", "messages": [], **body})


def test_a_run_waits_only_once_every_call_of_its_turn_is_settled_or_asking():
    one = Asked(approval("q1", "c1"), "c1", 1, "pending")
    stream = agui.Stream(given())
    events = stream.advance(run(one))  # c2 still runs: it may ask too
    assert [e["type"] for e in events][-1] == "TOOL_CALL_END"
    was_over = stream.over
    two = Asked(approval("q2", "c2"), "c2", 1, "pending")
    events = stream.advance(run(one, two))
    assert [e["type"] for e in events] == ["MESSAGES_SNAPSHOT", "RUN_FINISHED"]
    assert [i["id"] for i in events[-1]["outcome"]["interrupts"]] == ["q1", "q2"]
    assert (was_over, stream.over) == (False, True)
    for event in [stream.started(), *events]:
        EVENTS.validate_python(event)


def test_what_the_client_holds_is_not_sent_again():
    known = given(
        messages=[
            {"id": "t1:1", "role": "assistant", "content": "Working.", "toolCalls": [{"id": "c1"}]},
            {"id": "x", "role": "tool", "toolCallId": "c1", "content": "paid 5"},
        ]
    )
    snapshot = run(results={"c1": Settled("paid 5", False), "c2": Settled("paid 5", False)})
    events = agui.Stream(known).advance(snapshot)
    assert [(e["type"], e.get("toolCallId")) for e in events] == [
        ("TOOL_CALL_START", "c2"),
        ("TOOL_CALL_ARGS", "c2"),
        ("TOOL_CALL_END", "c2"),
        ("TOOL_CALL_RESULT", "c2"),
    ]


def test_resume_answers_edits_cancels_and_refuses_before_taking_anything():
    pay = Asked(approval("q1", "c1", editable=True), "c1", 1, "pending")
    other = Asked(approval("q2", "c2"), "c2", 1, "pending")
    snapshot = run(pay, other)
    checked: list[tuple[str, dict[str, Any]]] = []

    def check(tool: str, args: dict[str, Any]) -> str | None:
        checked.append((tool, args))
        return None if isinstance(args.get("amount"), int) else "amount must be an integer"

    edit = {
        "interruptId": "q1",
        "status": "resolved",
        "payload": {"approved": True, "editedArgs": {"amount": 7}},
    }
    cancel = {"interruptId": "q2", "status": "cancelled"}
    decision = agui.decide(given(resume=[edit, cancel]), snapshot, check=check)
    assert decision == agui.Resume(
        (
            Answer("q1", True, {"digest": DIGEST, "arguments": {"amount": 7}}),
            Answer("q2", False, reason="cancelled"),
        )
    )
    assert checked == [("pay", {"amount": 7})]
    refusals = {
        "must answer every open interrupt": [edit],
        "twice": [edit, edit, cancel],
        "amount must be an integer": [
            {**edit, "payload": {"approved": True, "editedArgs": {"amount": "x"}}},
            cancel,
        ],
        "does not take edited arguments": [
            edit,
            {
                "interruptId": "q2",
                "status": "resolved",
                "payload": {"approved": True, "editedArgs": {}},
            },
        ],
        "must be {'approved': bool}": [edit, {"interruptId": "q2", "status": "resolved"}],
        "no interrupt 'q9'": [edit, cancel, {"interruptId": "q9", "status": "cancelled"}],
    }
    for why, resume in refusals.items():
        with pytest.raises(Refusal, match=why):
            agui.decide(given(resume=resume), snapshot, check=check)
    with pytest.raises(Refusal, match="waits for answers"):
        agui.decide(given(), snapshot)


def test_a_replay_is_nothing_another_answer_and_an_expired_one_are_refused():
    taken = Answer("q1", True, {"digest": DIGEST})
    snapshot = run(Asked(approval("q1", "c1"), "c1", 1, "answered", taken), calls=1)
    yes = {"interruptId": "q1", "status": "resolved", "payload": {"approved": True}}
    assert agui.decide(given(resume=[yes]), snapshot) == agui.Resume(())
    no = {"interruptId": "q1", "status": "resolved", "payload": {"approved": False}}
    with pytest.raises(Refusal, match="answered already"):
        agui.decide(given(resume=[no]), snapshot)
    past = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
    stale = run(Asked(approval("q1", "c1", expires=past), "c1", 1, "pending"), calls=1)
    with pytest.raises(Refusal, match="expired"):
        agui.decide(given(resume=[yes]), stale)


def test_a_new_thread_starts_a_run_and_a_known_one_takes_no_new_input():
    ask = [{"id": "u", "role": "user", "content": [{"type": "text", "text": "shop"}]}]
    assert agui.decide(given(messages=ask), None) == agui.Start("shop")
    ended = run(ended=True)
    assert agui.decide(given(messages=ask), ended) == agui.Attach()
    other = [{"id": "u", "role": "user", "content": "more"}]
    with pytest.raises(Refusal, match="takes no new input"):
        agui.decide(given(messages=other), ended)
    for body, why in (
        ({"threadId": "", "runId": "r"}, "threadId"),
        ({"threadId": "t", "runId": "r", "messages": {}}, "messages"),
        ({"threadId": "t", "runId": "r", "resume": [{"interruptId": "q"}]}, "status"),
    ):
        with pytest.raises(Refusal, match=why):
            agui.parse_input(body)


def chat(*parts: dict[str, Any]) -> aisdk.ChatInput:
    return aisdk.parse_chat(
        {
            "id": "t1",
            "messages": [
                {"id": "u", "role": "user", "parts": [{"type": "text", "text": "shop"}]},
                {"id": "a", "role": "assistant", "parts": list(parts)},
            ],
        }
    )


def test_the_ai_sdk_answers_approvals_and_questions_and_refuses_unknown_ids():
    pay = Asked(approval("q1", "c1"), "c1", 1, "pending")
    wrap = Asked(
        Request("q2", "question", "Wrap?", data={"questions": [{"question": "Wrap?"}]}),
        "c2",
        1,
        "pending",
    )
    snapshot = run(pay, wrap)
    parts = aisdk.Stream(frozenset(), frozenset()).advance(snapshot)
    assert [p["type"] for p in parts][-4:] == [
        "data-toolnexus-request",
        "tool-approval-request",
        "data-toolnexus-request",
        "finish",
    ]
    asks = [p for p in parts if p["type"] == "tool-approval-request"]
    assert asks == [{"type": "tool-approval-request", "approvalId": "q1", "toolCallId": "c1"}]
    responded = {
        "type": "dynamic-tool",
        "toolCallId": "c1",
        "toolName": "pay",
        "state": "approval-responded",
        "approval": {"id": "q1", "approved": False, "reason": "no"},
    }
    output = {
        "type": "dynamic-tool",
        "toolCallId": "c2",
        "toolName": "question",
        "state": "output-available",
        "output": {"answers": ["yes"]},
    }
    assert aisdk.decide(chat(responded, output), snapshot) == aisdk.Resume(
        (Answer("q1", False, {"note": "no"}, "declined"), Answer("q2", True, {"answers": ["yes"]}))
    )
    forged = {**responded, "approval": {"id": "q9", "approved": True}}
    with pytest.raises(Refusal, match="no approval 'q9'"):
        aisdk.decide(chat(forged), snapshot)
    # Arguments smuggled in are refused, never approved as asked: an edited input, an
    # approval field the SDK has not, an AG-UI style body field.
    approved = {**responded, "input": {"amount": 5}, "approval": {"id": "q1", "approved": True}}
    taken = aisdk.decide(chat(approved), snapshot)
    assert isinstance(taken, aisdk.Resume) and taken.answers[0].ok
    with pytest.raises(Refusal, match="'c1' has an input the run did not ask for"):
        aisdk.decide(chat({**approved, "input": {"amount": 7}}), snapshot)
    smuggled = {"id": "q1", "approved": True, "editedArgs": {"amount": 7}}
    with pytest.raises(Refusal, match="has editedArgs: the AI SDK's approval carries no edited"):
        chat({**approved, "approval": smuggled})
    body = {"id": "t1", "messages": [{"role": "user", "parts": []}], "editedArgs": {}}
    with pytest.raises(Refusal, match="AG-UI"):
        aisdk.parse_chat(body)
    denied = aisdk.Stream(frozenset({("call", "c1")}), frozenset()).advance(
        run(results={"c1": Settled("declined/expired: Allow c1?", True, True)}, calls=1)
    )
    assert {"type": "tool-output-denied", "toolCallId": "c1"} in denied


def test_a_reconnect_replays_the_reply_message_whole_answers_where_the_client_saw_them():
    edited = Answer("q1", True, {"digest": DIGEST, "arguments": {"amount": 7}})  # by AG-UI
    paid = Asked(approval("q1", "c1", editable=True), "c1", 1, "answered", edited)
    late = Asked(approval("q2", "c2"), "c2", 1, "expired")
    snapshot = run(paid, late, results={"c2": Settled("declined/expired: Allow c2?", True, True)})
    stream = aisdk.Stream(replay=True)
    parts = stream.advance(snapshot)
    assert [(p["type"], p.get("toolCallId") or p.get("approvalId")) for p in parts] == [
        ("text-start", None),
        ("text-delta", None),
        ("text-end", None),
        ("tool-input-start", "c1"),
        ("tool-input-available", "c1"),
        ("tool-input-start", "c2"),
        ("tool-input-available", "c2"),
        # each settled request where the client saw it: after its turn's calls
        ("data-toolnexus-request", None),
        ("tool-approval-request", "c1"),
        ("tool-approval-response", "q1"),
        ("data-toolnexus-request", None),
        ("tool-approval-request", "c2"),
        ("tool-output-denied", "c2"),
    ]
    assert parts[9]["approved"] is True and not stream.over
    assert stream.advance(snapshot) == []  # followed on: nothing twice
    # The replayed yes comes back with the client's next request: nothing to do, though
    # the answer it stands for had AG-UI's edits; a no to it is another answer, refused.
    held = {
        "type": "dynamic-tool",
        "toolCallId": "c1",
        "toolName": "pay",
        "state": "approval-responded",
        "input": {"amount": 5},
        "approval": {"id": "q1", "approved": True},
    }
    assert aisdk.decide(chat(held), snapshot) == aisdk.Resume(())
    with pytest.raises(Refusal, match="answered already"):
        aisdk.decide(chat({**held, "approval": {"id": "q1", "approved": False}}), snapshot)
