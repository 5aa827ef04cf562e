"""The resolver protocol: what a ``wait_for`` can do is decided once, by type, not probed.

A function is asked and timed out at ``expires_at`` by the loop; the Inbox, the one parking
resolver, hands back the future the run awaits, enforces expiry itself and learns which
run parks. Anything else that merely *looks* capable (a method called ``park``, a flag
``handles_expiry``) is a plain function to the runtime.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from tests.shared import final_from_results
from toolnexus_async import (
    Answer,
    Inbox,
    LlmClient,
    Request,
    ToolContext,
    Toolkit,
    ToolResult,
    UsageError,
    define_tool,
)
from toolnexus_async._engine.resolver import Resolver
from toolnexus_async.testing import ScriptedModel, reply, tool_call


def soon(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


@define_tool
async def pay(ctx: ToolContext | None = None) -> ToolResult:
    """Pay once approved; the approval expires in 50 ms."""
    if ctx is None or ctx.answer is None:
        return ToolResult.pending(Request("", "approval", "Pay?", expires_at=soon(0.05)))
    return ToolResult.ok("paid")


async def run_with(wait_for: Any) -> Any:
    model = ScriptedModel(reply(tool_call("pay", id="c1")), final_from_results)
    async with (
        Toolkit.create(builtins=False, extra_tools=[pay]) as toolkit,
        LlmClient.in_process(model, wait_for=wait_for) as client,
    ):
        with anyio.fail_after(5):
            return await client.run("pay", toolkit)


def test_the_inbox_is_a_parking_resolver_and_a_function_is_not():
    inbox = Resolver.of(Inbox())
    assert inbox is not None and inbox.park is not None and inbox.enforces_expiry

    async def yes(request: Request) -> Answer:
        return Answer(request.id, True)

    plain = Resolver.of(yes)
    assert plain is not None and plain.park is None and not plain.enforces_expiry
    assert Resolver.of(None) is None


@pytest.mark.parametrize("thing", [42, "inbox", Answer("r", True)])
def test_what_cannot_answer_is_refused_when_the_client_is_built(thing: object):
    with pytest.raises(UsageError, match=r"wait_for must be callable.*async def"):
        LlmClient.in_process(lambda m, t: "x", wait_for=thing)  # type: ignore[arg-type]


def test_a_class_is_refused_with_the_instance_it_meant():
    with pytest.raises(UsageError, match=r"wait_for=Inbox is a class; pass an instance"):
        LlmClient.in_process(lambda m, t: "x", wait_for=Inbox)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=r"wait_for=Inbox is a class"):
        LlmClient("http://127.0.0.1:9", model="m", api_key="sk-test-key", wait_for=Inbox)  # type: ignore[arg-type]


def test_a_sync_function_is_refused_naming_it():
    def approve(request: Request) -> Answer:
        return Answer(request.id, True)

    class SyncCall:
        def __call__(self, request: Request) -> Answer:
            return Answer(request.id, True)

    with pytest.raises(UsageError, match=r"wait_for .*approve is not an async function"):
        LlmClient.in_process(lambda m, t: "x", wait_for=approve)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=r"wait_for a .*SyncCall object is not an async"):
        LlmClient.in_process(lambda m, t: "x", wait_for=SyncCall())  # type: ignore[arg-type]


@pytest.mark.parametrize("returned", [True, {"id": "x", "ok": True}, None])
async def test_a_resolver_that_returns_no_answer_raises_naming_it(returned: object):
    """Not fed to the model as error text: the run raises, once, with the resolver's name."""

    async def sloppy(request: Request) -> Any:
        return returned

    with pytest.raises(UsageError, match=r"wait_for .*sloppy returned \w+, not an Answer"):
        await run_with(sloppy)


async def test_two_sloppy_answers_in_one_turn_raise_one_plain_usage_error():
    async def sloppy(request: Request) -> Any:
        await anyio.lowlevel.checkpoint()  # both calls outstanding: a task group runs them
        return True

    model = ScriptedModel(
        reply(tool_call("pay", id="c1"), tool_call("pay", id="c2")), final_from_results
    )
    async with (
        Toolkit.create(builtins=False, extra_tools=[pay]) as toolkit,
        LlmClient.in_process(model, wait_for=sloppy) as client,
    ):
        with pytest.raises(UsageError, match="sloppy returned bool"):
            await client.run("pay", toolkit)


async def test_a_resolver_that_raises_while_working_is_still_told_to_the_model():
    async def down(request: Request) -> Answer:
        raise ConnectionError("approval service down")

    result = await run_with(down)
    assert result.status == "done"
    assert "wait_for raised ConnectionError: approval service down" in result.text


async def test_a_lookalike_is_asked_as_a_function_and_timed_out_by_the_loop():
    """Attributes named like the old probed capabilities change nothing: the loop gives it
    until expires_at, then the model is told the request expired."""

    class LooksCapable:
        handles_expiry = True  # a lie: the loop must still enforce expiry

        def __init__(self) -> None:
            self.parked: list[Request] = []

        def park(self, request: Request) -> Any:  # never called
            raise AssertionError("park was probed")

        async def __call__(self, request: Request) -> Answer:
            self.parked.append(request)
            await anyio.sleep_forever()
            raise AssertionError("unreachable")

    resolver = LooksCapable()
    result = await run_with(resolver)
    assert [r.prompt for r in resolver.parked] == ["Pay?"]
    assert result.text == "c1=declined/expired: Pay?"


async def test_the_inbox_enforces_expiry_itself_and_knows_the_run():
    inbox = Inbox()
    seen: dict[str, str | None] = {}

    async def watch() -> None:
        async for request in inbox.requests():
            seen[request.id] = inbox.run_of(request.id)
            return

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        await anyio.wait_all_tasks_blocked()
        result = await run_with(inbox)
    assert result.text == "c1=declined/expired: Pay?"
    (run_id,) = seen.values()
    assert run_id == result.run_id
