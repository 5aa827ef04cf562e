"""AG-UI over serve's runs, driven by the protocol's own client (``@ag-ui/client``'s
``HttpAgent``, in node: tests/node/agui_client.mjs), every event it received validated by
the Python package ``ag-ui-protocol``.

One thread: two approvals and a question open at once (one interrupt outcome lists all
three); serve restarts between the interrupt and the resume; a resume whose edited
arguments the tool refuses, one that leaves a request open and one naming an unknown id
are ``RUN_ERROR`` and answer nothing; the resume (an edit, a decline, an answer) finishes
the run on the restarted server; the same resume sent twice more changes nothing; an
expired interrupt's answer is a ``RUN_ERROR``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
from ag_ui.core import Event
from pydantic import TypeAdapter

from tests.ui_app import (
    EFFECTS,
    HOLD_SECONDS,
    LIMIT,
    TOKEN,
    NodeClients,
    Serving,
    driven,
    node_clients,
    serving,
    serving_on,
    ui_toolkit,
)
from toolnexus_async.durable import PostgresRunStore

EVENTS: TypeAdapter[Any] = TypeAdapter(Event)


async def agui(node: NodeClients, url: str, thread: str, **given: Any) -> dict[str, Any]:
    """One run of the thread through HttpAgent; every event checked against the protocol."""
    out = await node.call("agui", {"url": url, "token": TOKEN, "threadId": thread, **given})
    for event in out["events"]:
        EVENTS.validate_python(event)
    return out


def kinds(out: dict[str, Any]) -> list[str]:
    return [e["type"] for e in out["events"]]


def finished(out: dict[str, Any]) -> dict[str, Any]:
    [end] = [e for e in out["events"] if e["type"] == "RUN_FINISHED"]
    assert isinstance(end, dict)
    return end


def error(out: dict[str, Any]) -> str:
    [end] = [e for e in out["events"] if e["type"] == "RUN_ERROR"]
    return str(end["message"])


def state(out: dict[str, Any]) -> dict[str, Any]:
    """What the client keeps between runs."""
    return {"messages": out["messages"], "pendingInterrupts": out["pendingInterrupts"]}


async def test_two_approvals_and_a_question_across_a_restart_replays_and_refusals(tmp_path: Path):
    await scenario(serving, tmp_path / "runs.sqlite")


async def scenario(serving: Serving, path: Path) -> None:
    """The test, on the server ``serving`` starts (aiohttp here, ASGI in test_ui_asgi)."""
    await driven(shop, serving, path)


async def shop(node: NodeClients, serving: Serving, path: Path) -> None:
    async with serving(path) as base:
        url = base + "/ag-ui"
        first = await agui(node, url, "t-shop", prompt="shop")
        assert kinds(first)[0] == "RUN_STARTED"
        assert kinds(first)[-2:] == ["MESSAGES_SNAPSHOT", "RUN_FINISHED"]
        outcome = finished(first)["outcome"]
        assert outcome["type"] == "interrupt"
        interrupts = outcome["interrupts"]
        assert [(i["reason"], i.get("toolCallId")) for i in interrupts] == [
            ("tool_call", "c1"),
            ("tool_call", "c2"),
            ("input_required", None),
        ]
        pay, refund, wrap = interrupts
        assert "editedArgs" in pay["responseSchema"]["properties"]
        assert wrap["responseSchema"]["properties"]["answers"]["minItems"] == 1
        assert [i["id"] for i in first["pendingInterrupts"]] == [i["id"] for i in interrupts]
        calls = [e["toolCallId"] for e in first["events"] if e["type"] == "TOOL_CALL_START"]
        assert calls == ["c1", "c2", "c3"]
        # New input while interrupts are open: refused by the client itself, and by
        # serve when a client without them sends it.
        blind = await agui(node, url, "t-shop", prompt="shop again")
        assert "waits for answers" in error(blind)

    # serve restarts between the interrupt and the resume
    async with serving(path) as base:
        url = base + "/ag-ui"
        good = [
            {
                "interruptId": pay["id"],
                "status": "resolved",
                "payload": {"approved": True, "editedArgs": {"amount": 7}},
            },
            {
                "interruptId": refund["id"],
                "status": "resolved",
                "payload": {"approved": False, "reason": "not this one"},
            },
            {
                "interruptId": wrap["id"],
                "status": "resolved",
                "payload": {"answers": ["yes"]},
            },
        ]
        bad_edit = [dict(good[0], payload={"approved": True, "editedArgs": {"amount": "x"}})]
        refused = await agui(node, url, "t-shop", **state(first), resume=bad_edit + good[1:])
        assert "edited arguments" in error(refused)
        partial = await agui(node, url, "t-shop", **state(first), resume=good[:2])
        assert "not addressed by resume" in partial["error"]  # HttpAgent's own check
        partial = await agui(node, url, "t-shop", messages=first["messages"], resume=good[:2])
        assert "must answer every open interrupt" in error(partial)
        unknown = await agui(
            node, url, "t-shop", resume=[*good, {**good[0], "interruptId": "nope"}]
        )
        assert "no interrupt 'nope'" in error(unknown)
        # nothing was answered by a refused resume: all three are still open
        still = error(await agui(node, url, "t-shop", messages=first["messages"]))
        assert all(i["id"] in still for i in interrupts), still
        assert EFFECTS == {}

        done = await agui(node, url, "t-shop", **state(first), resume=good)
        end = finished(done)
        assert end["outcome"] == {"type": "success"}
        assert end["result"]["text"].startswith("pay=paid 7 | refund=declined/expired: ")
        assert 'question={"answers": ["yes"]}' in end["result"]["text"]
        results = [e["toolCallId"] for e in done["events"] if e["type"] == "TOOL_CALL_RESULT"]
        assert sorted(results) == ["c1", "c2", "c3"]
        assert "TOOL_CALL_START" not in kinds(done)  # the calls were the first run's
        assert EFFECTS == {"pay:7": 1}

        # the same resume, twice more: nothing changes
        for _ in range(2):
            again = await agui(node, url, "t-shop", messages=done["messages"], resume=good)
            assert kinds(again) == ["RUN_STARTED", "RUN_FINISHED"]
            assert finished(again)["result"] == end["result"]
        assert EFFECTS == {"pay:7": 1}
        # ... but another answer to an answered interrupt is refused
        other = [dict(good[0], payload={"approved": False}), *good[1:]]
        assert "answered already" in error(
            await agui(node, url, "t-shop", messages=done["messages"], resume=other)
        )

        # an expired interrupt's answer
        held = await agui(node, url, "t-hold", prompt="hold")
        [hold] = finished(held)["outcome"]["interrupts"]
        assert hold["expiresAt"]
        await anyio.sleep(HOLD_SECONDS)  # the expiry itself is what is waited for
        late = [{"interruptId": hold["id"], "status": "resolved", "payload": {"approved": True}}]
        by_client = await agui(node, url, "t-hold", **state(held), resume=late)
        assert "expired" in by_client["error"]  # HttpAgent refuses to send it
        by_server = await agui(node, url, "t-hold", messages=held["messages"], resume=late)
        assert "expired" in error(by_server)


async def test_a_thread_interrupted_on_one_worker_is_resumed_on_another(pg_dsn: str):
    EFFECTS.clear()
    with anyio.fail_after(LIMIT * 2):
        async with (
            node_clients() as node,
            ui_toolkit() as toolkit,
            serving_on(PostgresRunStore(pg_dsn), toolkit) as base_a,
            serving_on(PostgresRunStore(pg_dsn), toolkit) as base_b,
        ):
            a, b = base_a + "/ag-ui", base_b + "/ag-ui"
            first = await agui(node, a, "t-pg", prompt="shop")
            pay, refund, wrap = finished(first)["outcome"]["interrupts"]
            resume = [
                {"interruptId": pay["id"], "status": "resolved", "payload": {"approved": True}},
                {"interruptId": refund["id"], "status": "cancelled"},
                {"interruptId": wrap["id"], "status": "resolved", "payload": {"answers": ["no"]}},
            ]
            done = await agui(node, b, "t-pg", **state(first), resume=resume)  # parked on A
            text = finished(done)["result"]["text"]
            assert text.startswith("pay=paid 5 | refund=declined/expired: ")
            again = await agui(node, a, "t-pg", messages=done["messages"], resume=resume)
            assert kinds(again) == ["RUN_STARTED", "RUN_FINISHED"]
            assert EFFECTS == {"pay:5": 1}
