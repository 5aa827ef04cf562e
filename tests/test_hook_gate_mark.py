"""A host's own ``before_tool`` hook that asks: its request is a gate's across a halt too.

In memory, the answer to a hook's request goes to the hook and never to the tool (DESIGN
§3 as refined by ``suspension.py``'s rule 7). A run halted on such a request and resumed
later only has the request to go by; require_approval's requests were marked, a host's
hook's were not, so a resumed tool took the hook's answer as its own: a tool that asks
its own confirmation paid unasked. Every hook's request is now marked
``data["gate"] = "before_tool"`` when it is raised.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio

from tests.test_host import LIMIT, until
from toolnexus_async import (
    Answer,
    Hooks,
    Inbox,
    LlmClient,
    Message,
    Request,
    RunResult,
    ToolContext,
    Toolkit,
    ToolResult,
    ToolReturn,
    define_tool,
)
from toolnexus_async.durable import DurableHost, SqliteRunStore
from toolnexus_async.testing import ScriptedModel, reply, tool_call


def scenario() -> tuple[list[int], Any, Hooks]:
    """A tool that asks its own confirmation, behind a hook that asks a manager first."""
    paid: list[int] = []

    @define_tool
    async def pay(amount: int, ctx: ToolContext) -> str | ToolResult:
        """Pay the invoice, once the card holder confirmed.

        Args:
            amount: euros.
        """
        if ctx.answer is None:
            return ToolResult.pending(Request("", "approval", f"Charge {amount} EUR?"))
        paid.append(amount)
        return f"paid {amount} EUR"

    def manager(name: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult | None:
        if ctx.answer is None:
            return ToolResult.pending(
                Request("", "approval", "Manager: allow this payment?", data={"team": "ops"})
            )
        return None

    return paid, pay, Hooks(before_tool=manager)


def model() -> ScriptedModel:
    return ScriptedModel(reply(None, tool_call("pay", {"amount": 30})), "Paid.")


async def test_resumed_from_the_hooks_question_the_tool_still_asks_its_own() -> None:
    paid, pay, hooks = scenario()
    async with Toolkit.create(builtins=False, extra_tools=[pay]) as toolkit:
        async with LlmClient.in_process(model(), hooks=hooks) as client:
            halted = await client.run("Pay the invoice", toolkit)
        assert halted.status == "pending" and halted.pending is not None
        assert halted.pending.prompt == "Manager: allow this payment?"
        # The host's data is kept; the mark is added beside it.
        assert halted.pending.data == {"team": "ops", "gate": "before_tool"}
        # Kept as JSON and resumed by another client, as a durable host does.
        stored = RunResult.from_dict(json.loads(json.dumps(halted.to_dict())))
        assert stored.pending is not None
        async with LlmClient.in_process(ScriptedModel("Paid."), hooks=hooks) as other:
            confirm = await other.resume(stored, toolkit, answers=Answer(stored.pending.id, True))
            assert paid == []  # the manager's yes is not the card holder's
            assert confirm.status == "pending" and confirm.pending is not None
            assert confirm.pending.prompt == "Charge 30 EUR?"
            assert confirm.pending.data is None  # the tool's own request: no mark
            done = await other.resume(confirm, toolkit, answers=Answer(confirm.pending.id, True))

    assert done.status == "done" and paid == [30]


def pay_model(messages: list[Message], tools: list[Any]) -> Any:
    """Calls pay, then reports its result (a function: any host may ask it next)."""
    last = messages[-1]
    if isinstance(last, ToolReturn):
        return f"result: {last.output}"
    return reply(None, tool_call("pay", {"amount": 30}, id="c1"))


async def test_a_new_durable_host_gives_the_stored_hooks_answer_to_the_hook(tmp_path: Path) -> None:
    """Halted into a SQLite store by one host; the next host on that store takes the
    manager's answer: the hook gets it, the tool asks its own question."""
    paid, pay, hooks = scenario()
    path = tmp_path / "runs.db"
    results: list[RunResult] = []
    with anyio.fail_after(LIMIT):
        async with (
            Toolkit.create(builtins=False, extra_tools=[pay]) as toolkit,
            SqliteRunStore(path) as store,
            LlmClient.in_process(pay_model, hooks=hooks, wait_for=Inbox(park_timeout=0.02)) as c,
            DurableHost(c, toolkit, store, sweep=0.02, poll=0.02) as host,
        ):
            halted = await host.run("Pay the invoice")
        assert halted.pending is not None
        assert halted.pending.data == {"team": "ops", "gate": "before_tool"}

        async with (
            Toolkit.create(builtins=False, extra_tools=[pay]) as toolkit,
            SqliteRunStore(path) as store,
            LlmClient.in_process(pay_model, hooks=hooks, wait_for=Inbox()) as c,
            DurableHost(c, toolkit, store, sweep=0.02, poll=0.02, on_result=results.append) as host,
        ):
            assert await host.requests() == [halted.pending]
            await host.answer(Answer(halted.pending.id, True))
            confirm = await listed(host, "Charge 30 EUR?")
            assert paid == [] and confirm.data is None  # the tool's own, unmarked
            await host.answer(Answer(confirm.id, True))
            await until(lambda: bool(results))
    assert results[0].text == "result: paid 30 EUR" and paid == [30]


async def listed(host: DurableHost, prompt: str) -> Request:
    """The outstanding request with ``prompt``, once the host's store lists it."""
    while True:
        for request in await host.requests():
            if request.prompt == prompt:
                return request
        await anyio.lowlevel.checkpoint()


async def test_in_memory_the_same_questions_are_asked_in_the_same_order() -> None:
    paid, pay, hooks = scenario()
    asked: list[tuple[str, dict[str, Any] | None]] = []

    async def person(request: Request) -> Answer:
        asked.append((request.prompt, request.data))
        return Answer(request.id, True)

    async with (
        Toolkit.create(builtins=False, extra_tools=[pay]) as toolkit,
        LlmClient.in_process(model(), hooks=hooks, wait_for=person) as client,
    ):
        done = await client.run("Pay the invoice", toolkit)

    assert asked == [
        ("Manager: allow this payment?", {"team": "ops", "gate": "before_tool"}),
        ("Charge 30 EUR?", None),
    ]
    assert done.status == "done" and paid == [30]


async def test_a_hooks_request_with_a_gate_of_its_own_is_an_error_and_nothing_runs() -> None:
    ran: list[int] = []

    @define_tool
    async def pay(amount: int) -> str:
        """Pay.

        Args:
            amount: euros.
        """
        ran.append(amount)
        return "paid"

    def hook(name: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult | None:
        return ToolResult.pending(Request("", "input", "Which door?", data={"gate": "B12"}))

    async with (
        Toolkit.create(builtins=False, extra_tools=[pay]) as toolkit,
        LlmClient.in_process(model(), hooks=Hooks(before_tool=hook)) as client,
    ):
        result = await client.run("Pay the invoice", toolkit)

    assert result.status == "done" and ran == []
    output = result.tool_calls[0].result
    assert output.is_error
    assert "its own 'gate' ('B12')" in output.output and "use another key" in output.output


async def test_the_hook_can_tell_its_own_answer_from_the_tools() -> None:
    """docs/hooks.md's rule: after its own question the hook's ``ctx.request`` is None;
    after the tool's, it is the tool's request, beside the tool's answer."""
    paid, pay, _ = scenario()
    seen: list[tuple[str | None, str | None]] = []

    def manager(name: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult | None:
        seen.append(
            (
                None if ctx.answer is None else ctx.answer.id,
                None if ctx.request is None else ctx.request.prompt,
            )
        )
        if ctx.answer is None:
            return ToolResult.pending(Request("m1", "approval", "Manager?"))
        return None

    async def person(request: Request) -> Answer:
        return Answer(request.id, True)

    async with (
        Toolkit.create(builtins=False, extra_tools=[pay]) as toolkit,
        LlmClient.in_process(model(), hooks=Hooks(before_tool=manager), wait_for=person) as c,
    ):
        done = await c.run("Pay the invoice", toolkit)

    assert done.status == "done" and paid == [30]
    charge = done.tool_calls[0].request
    assert charge is not None and charge.prompt == "Charge 30 EUR?"
    assert seen == [(None, None), ("m1", None), (charge.id, "Charge 30 EUR?")]
