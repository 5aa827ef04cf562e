"""The AI SDK's UI message stream over serve's runs, driven by the ``ai`` package's own chat
(``AbstractChat``, what ``useChat`` runs, with ``DefaultChatTransport``; in node:
tests/node/ai_chat.mjs), every part checked by the package's own chunk schema.

One chat: two approvals and a question asked at once (``tool-approval-request`` parts);
serve restarts before the answers; an approval id the run never asked is refused and
answers nothing, and so is one whose call's input the client edited (the SDK's approval has
no edited arguments); ``addToolApprovalResponse`` (a yes, a no) and ``addToolOutput`` (the
question) finish the run, the no as ``tool-output-denied``; the same request sent twice
more changes nothing; an expired approval's answer is refused; a reconnect to a run that
waits gets its message again.

And ``resumeStream()`` after a dropped stream: the client, cut off while a tool runs, gets
the reply message again whole (the ``ai`` client takes a reconnect as a replay of it), then
what the run does until it asks for approval, and answers it; the same after the run asked
while it was away, and after serve restarted; its messages end as a client's that never
dropped.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import anyio

from tests.ui_app import (
    EFFECTS,
    GATES,
    HOLD_SECONDS,
    TOKEN,
    Gate,
    NodeClients,
    Serving,
    driven,
    serving,
)


async def chat(node: NodeClients, api: str, chat_id: str, **given: Any) -> dict[str, Any]:
    out = await node.call("chat", {"api": api, "token": TOKEN, "chatId": chat_id, **given})
    assert out["invalid"] == []  # every part passed the AI SDK's own schema
    return out


def types(out: dict[str, Any]) -> list[str]:
    return [p["type"] for p in out["parts"]]


def tool_parts(out: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The last assistant message's tool parts, by call id."""
    last = out["messages"][-1]
    assert last["role"] == "assistant"
    return {p["toolCallId"]: p for p in last["parts"] if p["type"] == "dynamic-tool"}


async def test_approvals_a_question_a_restart_replays_refusals_and_an_expiry(tmp_path: Path):
    await scenario(serving, tmp_path / "runs.sqlite")


async def scenario(serving: Serving, path: Path) -> None:
    """The test, on the server ``serving`` starts (aiohttp here, ASGI in test_ui_asgi)."""
    await driven(shop, serving, path)


async def shop(node: NodeClients, serving: Serving, path: Path) -> None:
    async with serving(path) as base:
        api = base + "/ai-sdk/chat"
        first = await chat(node, api, "c-shop", prompt="shop")
        assert first["error"] is None and first["status"] == "ready"
        assert types(first)[0] == "start" and types(first)[-1] == "finish"
        asks = [p for p in first["parts"] if p["type"] == "tool-approval-request"]
        assert [p["toolCallId"] for p in asks] == ["c1", "c2"]
        requests = [p["data"] for p in first["parts"] if p["type"] == "data-toolnexus-request"]
        assert [r["kind"] for r in requests] == ["approval", "approval", "question"]
        parts = tool_parts(first)
        assert parts["c1"]["state"] == parts["c2"]["state"] == "approval-requested"
        assert parts["c3"]["state"] == "input-available"  # the question: addToolOutput
        assert parts["c1"]["approval"]["id"] == asks[0]["approvalId"]

    # serve restarts before the answers
    async with serving(path) as base:
        api = base + "/ai-sdk/chat"
        forged = copy.deepcopy(first["messages"])
        for part in forged[-1]["parts"]:
            if part.get("toolCallId") == "c1":
                part["state"] = "approval-responded"
                part["approval"] = {"id": "nope", "approved": True}
        refused = await chat(node, api, "c-shop", messages=forged)
        assert "asked for no approval 'nope'" in refused["error"]
        # arguments edited in the client's messages, then approved: refused, not run as asked
        edited = copy.deepcopy(first["messages"])
        for part in edited[-1]["parts"]:
            if part.get("toolCallId") == "c1":
                part["input"] = {"amount": 7}
        yes = {"id": asks[0]["approvalId"], "approved": True}
        smuggled = await chat(node, api, "c-shop", messages=edited, approvals=[yes])
        assert "has an input the run did not ask for" in smuggled["error"]
        assert "AG-UI" in smuggled["error"]
        assert EFFECTS == {}

        answers = {
            "approvals": [
                {"id": asks[0]["approvalId"], "approved": True},
                {"id": asks[1]["approvalId"], "approved": False, "reason": "not this one"},
            ],
            "outputs": [{"tool": "question", "toolCallId": "c3", "output": {"answers": ["yes"]}}],
        }
        done = await chat(node, api, "c-shop", messages=first["messages"], **answers)
        assert done["error"] is None, done["error"]
        assert types(done) == [
            "start",
            "tool-output-available",
            "tool-output-denied",
            "text-start",
            "text-delta",
            "text-end",
            "finish",
        ]
        parts = tool_parts(done)
        assert parts["c1"]["state"] == "output-available"
        assert parts["c1"]["output"] == "paid 5"
        assert parts["c2"]["state"] == "output-denied"
        [text] = [p for p in done["parts"] if p["type"] == "text-delta"]
        assert text["delta"].startswith("pay=paid 5 | refund=declined/expired: ")
        assert EFFECTS == {"pay:5": 1}

        # the same request, twice more: nothing changes
        for _ in range(2):
            again = await chat(node, api, "c-shop", messages=done["messages"])
            assert (again["error"], types(again)) == (None, ["start", "finish"])
        assert EFFECTS == {"pay:5": 1}
        # ... but another answer to an answered approval is refused
        other = copy.deepcopy(done["messages"])
        for part in other[-1]["parts"]:
            if part.get("toolCallId") == "c2":
                part["approval"]["approved"] = True
        changed = await chat(node, api, "c-shop", messages=other)
        assert "answered already" in changed["error"]

        # a reconnect to a run that waits: its message again, whole, as the client had it
        held = await chat(node, api, "c-hold", prompt="hold")
        [ask] = [p for p in held["parts"] if p["type"] == "tool-approval-request"]
        back = await chat(node, api, "c-hold", messages=held["messages"], reconnect=True)
        assert back["parts"][0] == {"type": "start", "messageId": "c-hold:reply"}
        assert (back["error"], shape(back["messages"])) == (None, shape(held["messages"]))
        # an expired approval's answer
        await anyio.sleep(HOLD_SECONDS)  # the expiry itself is what is waited for
        late = await chat(
            node,
            api,
            "c-hold",
            messages=held["messages"],
            approvals=[{"id": ask["approvalId"], "approved": True}],
        )
        assert "expired" in late["error"]


def shape(messages: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """A chat's messages less what differs between two runs of one prompt (ids)."""
    shown = ("type", "state", "text", "toolCallId", "toolName", "input", "output")
    out = []
    for message in messages:
        parts = []
        for part in message["parts"]:
            seen = {k: v for k, v in part.items() if k in shown}
            if "approval" in part:
                seen["approval"] = {k: v for k, v in part["approval"].items() if k != "id"}
            if part["type"].startswith("data-"):
                seen["data"] = {k: v for k, v in part["data"].items() if k != "id"}
            parts.append(seen)
        out.append((message["role"], parts))
    return out


DROP = '"type":"tool-input-available"'  # a client's stream is cut once it has the call


async def approve(
    node: NodeClients, api: str, chat_id: str, out: dict[str, Any], **given: Any
) -> dict[str, Any]:
    """The one approval ``out`` was asked for, given (``addToolApprovalResponse``) and sent."""
    [ask] = [p for p in out["parts"] if p["type"] == "tool-approval-request"]
    yes = {"id": ask["approvalId"], "approved": True}
    return await chat(node, api, chat_id, approvals=[yes], **given)


async def test_a_dropped_stream_is_replayed_on_reconnect_mid_run_and_after_a_restart(
    tmp_path: Path,
):
    await reconnects(serving, tmp_path / "runs.sqlite")


async def reconnects(serving: Serving, path: Path) -> None:
    """The test, on the server ``serving`` starts (aiohttp here, ASGI in test_ui_asgi)."""
    await driven(dropped, serving, path)


async def dropped(node: NodeClients, serving: Serving, path: Path) -> None:
    async with serving(path) as base:
        try:
            api = base + "/ai-sdk/chat"
            # what a client that never drops ends with
            ref = await chat(node, api, "c-ref", prompt="stock")
            asked = shape(ref["messages"])
            ref = await approve(node, api, "c-ref", ref, messages=ref["messages"])
            ended = shape(ref["messages"])

            # cut while its tool runs; back while it still runs, and follows it to the approval
            gate = GATES["c-live"] = Gate()
            cut = await chat(node, api, "c-live", session="live", prompt="stock", dropAfter=DROP)
            # (what was in flight when it was cut is lost, as on a network)
            assert (cut["error"], cut["status"]) == ("network error", "error")
            assert "tool-approval-request" not in types(cut)
            await gate.running.wait()
            await node.send("chat", {"session": "live", "reconnect": True})
            assert await node.progress() == "streaming"
            gate.release.set()
            back = await node.reply()
            assert back["invalid"] == [] and back["error"] is None and back["status"] == "ready"
            assert back["parts"][0] == {"type": "start", "messageId": "c-live:reply"}
            assert types(back)[1:] == [
                "text-start",
                "text-delta",
                "text-end",
                "tool-input-start",
                "tool-input-available",
                "data-toolnexus-request",
                "tool-approval-request",
                "finish",
            ]
            assert shape(back["messages"]) == asked  # nothing lost, nothing twice
            done = await approve(node, api, "c-live", back, session="live")
            assert done["error"] is None and shape(done["messages"]) == ended
            # a reconnect once it ended: the same message again, whole
            again = await chat(node, api, "c-live", session="live", reconnect=True)
            assert types(again)[-1] == "finish" and "tool-approval-response" in types(again)
            assert shape(again["messages"]) == ended

            # cut; the run asks before the client is back (a second client follows it there)
            gate = GATES["c-late"] = Gate()
            cut = await chat(node, api, "c-late", session="late", prompt="stock", dropAfter=DROP)
            assert cut["error"] == "network error"
            gate.release.set()
            other = await chat(node, api, "c-late", messages=cut["messages"])
            assert types(other)[-2:] == ["tool-approval-request", "finish"]
        finally:
            for gate in GATES.values():  # a failed test leaves no run waiting at one
                gate.release.set()

    # ... and serve restarts before the client reconnects
    async with serving(path) as base:
        api = base + "/ai-sdk/chat"
        back = await chat(node, api, "c-late", session="late", reconnect=True)
        assert back["error"] is None and shape(back["messages"]) == asked
        done = await approve(node, api, "c-late", back, session="late")
        assert done["error"] is None and shape(done["messages"]) == ended
        assert EFFECTS == {"stock:tea": 3}
        # no such chat: nothing to follow (204)
        none = await chat(node, api, "c-none", reconnect=True)
        assert (none["parts"], none["error"], none["status"]) == ([], None, "ready")
