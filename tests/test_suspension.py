"""The suspension rule of DESIGN §3, one test per clause, through the public API.

Ordering between concurrent tools and resolvers is forced with anyio events, never with
sleeps; anything that could hang on a broken implementation runs under ``anyio.fail_after``
so that it fails instead. Models are scripted in-process, or played over the mock transport
(``provider``) where what the provider is sent matters.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest

from tests.conftest import FakeProvider, anthropic_reply, assert_no_leaks, openai_reply
from toolnexus_async import (
    Answer,
    LlmClient,
    Request,
    RunResult,
    ToolContext,
    Toolkit,
    ToolResult,
    ToolReturn,
    pending_of,
)
from toolnexus_async.testing import ScriptedModel, reply, tool_call

LIMIT = 5  # seconds; only reached when the rule under test is broken

Body = Callable[[dict[str, Any], ToolContext | None], Awaitable[ToolResult]]


class RecordingTool:
    """A tool whose behaviour is an async function; it records every execution."""

    source = "custom"
    description = "a tool for the suspension tests"
    input_schema: dict[str, Any] = {"type": "object", "properties": {}}  # noqa: RUF012

    def __init__(self, name: str, body: Body) -> None:
        self.name = name
        self._body = body
        self.calls: list[tuple[dict[str, Any], ToolContext | None]] = []

    async def execute(self, args: dict[str, Any], ctx: ToolContext | None = None) -> ToolResult:
        self.calls.append((dict(args), ctx))
        return await self._body(args, ctx)


def approval_tool(name: str, prompt: str, *, request_id: str = "") -> RecordingTool:
    """Suspends until it runs with ``ctx.answer``; then reports the answer it got."""

    async def body(args: dict[str, Any], ctx: ToolContext | None) -> ToolResult:
        if ctx is None or ctx.answer is None:
            return ToolResult.pending(Request(request_id, "approval", prompt))
        return ToolResult.ok(f"{name} done with {args} after answer {ctx.answer.id}")

    return RecordingTool(name, body)


def tool_returns(messages: list[Any]) -> list[ToolReturn]:
    return [m for m in messages if isinstance(m, ToolReturn)]


async def run_in_process(
    model: ScriptedModel, tools: list[RecordingTool], wait_for: Any = None
) -> RunResult:
    with anyio.fail_after(LIMIT):
        async with Toolkit.create(builtins=False, extra_tools=tools) as tk:
            client = LlmClient.in_process(model, model="scripted", wait_for=wait_for)
            async with client:
                return await client.run("go", tk)


def in_seconds(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


# --- 1. with wait_for --------------------------------------------------------------------


async def test_ok_answer_retries_once_with_ctx_answer_and_the_same_arguments() -> None:
    """answer.ok: the same tool runs once more, same arguments, ctx.answer set; model sees it."""
    tool = approval_tool("pay", "Pay 30 EUR?")
    asked: list[Request] = []
    answers: list[Answer] = []

    async def wait_for(request: Request) -> Answer:
        asked.append(request)
        answers.append(Answer(request.id, True, data={"note": "fine"}))
        return answers[-1]

    model = ScriptedModel(reply(None, tool_call("pay", {"amount": 30, "to": "Bob"}, id="c1")), "ok")
    result = await run_in_process(model, [tool], wait_for)

    assert result.status == "done"
    assert len(asked) == 1 and asked[0].prompt == "Pay 30 EUR?"
    assert [args for args, _ in tool.calls] == [{"amount": 30, "to": "Bob"}] * 2
    first_ctx, retry_ctx = (ctx for _, ctx in tool.calls)
    assert first_ctx is not None and first_ctx.answer is None and first_ctx.request is None
    assert retry_ctx is not None and retry_ctx.answer == answers[0]
    # The retry is told which request the answer answers: the tool can check what was approved.
    assert retry_ctx.request == asked[0]
    assert retry_ctx.answer.data == {"note": "fine"}
    (fed,) = tool_returns(model.requests[1])
    assert fed.call_id == "c1"
    assert not fed.is_error
    assert fed.output == f"pay done with {{'amount': 30, 'to': 'Bob'}} after answer {asked[0].id}"
    assert_no_leaks()


async def test_retry_that_suspends_again_is_unresolved_and_never_asked_again() -> None:
    """A retry that suspends again: error "unresolved: <prompt>", wait_for asked only once."""

    async def always_pending(args: dict[str, Any], ctx: ToolContext | None) -> ToolResult:
        return ToolResult.pending(Request("", "approval", "Really pay?"))

    tool = RecordingTool("stubborn", always_pending)
    asked: list[Request] = []

    async def wait_for(request: Request) -> Answer:
        asked.append(request)
        return Answer(request.id, True)

    model = ScriptedModel(reply(None, tool_call("stubborn", id="c1")), "gave up")
    result = await run_in_process(model, [tool], wait_for)

    assert len(asked) == 1, "wait_for must not be asked again for the retry's suspension"
    assert len(tool.calls) == 2, "exactly one retry"
    (fed,) = tool_returns(model.requests[1])
    assert fed.is_error
    assert fed.output == "unresolved: Really pay?"
    assert result.status == "done" and result.text == "gave up", "the model decides what next"
    assert_no_leaks()


async def test_declined_answer_is_fed_back_and_the_loop_goes_on(provider: FakeProvider) -> None:
    """answer.ok false: error "declined/expired: <prompt>", no retry, the model gets a turn."""

    def handler(body: dict[str, Any], _seen: object) -> dict[str, Any]:
        if len(provider.requests) == 1:
            return openai_reply(None, [("c1", "pay", {"amount": 30})])
        return openai_reply("Understood, I did not pay.")

    provider.handler = handler
    tool = approval_tool("pay", "Pay 30 EUR?")
    asked: list[Request] = []

    async def decline(request: Request) -> Answer:
        asked.append(request)
        return Answer(request.id, False, reason="declined")

    with anyio.fail_after(LIMIT):
        async with (
            Toolkit.create(builtins=False, extra_tools=[tool]) as tk,
            provider.client(wait_for=decline) as client,
        ):
            result = await client.run("pay Bob", tk)

    assert len(asked) == 1
    assert len(tool.calls) == 1, "a declined call is not retried"
    assert result.status == "done"
    assert result.text == "Understood, I did not pay."
    assert result.turns == 2 and len(provider.requests) == 2
    fed = [m for m in provider.bodies[1]["messages"] if m["role"] == "tool"]
    assert fed == [
        {"role": "tool", "tool_call_id": "c1", "content": "declined/expired: Pay 30 EUR?"}
    ]
    (record,) = result.tool_calls
    assert record.result.is_error and record.answered_ok is False
    assert_no_leaks()


async def test_suspended_calls_of_one_turn_are_resolved_concurrently() -> None:
    """Two suspensions of one turn: both wait_for calls are outstanding at the same time.

    Each resolver waits for an event only the other one sets, so a sequential
    implementation deadlocks and ``fail_after`` turns that into a failure.
    """
    entered = {"first": anyio.Event(), "second": anyio.Event()}
    other = {"first": "second", "second": "first"}
    outstanding = 0
    peak = 0

    async def wait_for(request: Request) -> Answer:
        nonlocal outstanding, peak
        outstanding += 1
        peak = max(peak, outstanding)
        who = request.data["who"] if request.data else "?"
        entered[who].set()
        await entered[other[who]].wait()
        outstanding -= 1
        return Answer(request.id, True)

    def gated(name: str) -> RecordingTool:
        async def body(args: dict[str, Any], ctx: ToolContext | None) -> ToolResult:
            if ctx is None or ctx.answer is None:
                return ToolResult.pending(
                    Request("", "approval", f"approve {name}?", data={"who": name})
                )
            return ToolResult.ok(f"{name} approved")

        return RecordingTool(name, body)

    first, second = gated("first"), gated("second")
    model = ScriptedModel(
        reply(None, tool_call("first", id="c1"), tool_call("second", id="c2")), "both done"
    )
    result = await run_in_process(model, [first, second], wait_for)

    assert peak == 2
    assert result.status == "done"
    assert [(r.call_id, r.output) for r in tool_returns(model.requests[1])] == [
        ("c1", "first approved"),
        ("c2", "second approved"),
    ]
    assert_no_leaks()


# --- 2. without wait_for -------------------------------------------------------------------


async def test_without_wait_for_the_first_suspension_in_call_order_wins() -> None:
    """No wait_for: status "pending" with call 1's request although call 2 suspended first."""
    second_finished = anyio.Event()
    finished: list[str] = []

    async def slow_first(args: dict[str, Any], ctx: ToolContext | None) -> ToolResult:
        await second_finished.wait()
        finished.append("first")
        return ToolResult.pending(Request("req-first", "approval", "first?"))

    async def quick_second(args: dict[str, Any], ctx: ToolContext | None) -> ToolResult:
        finished.append("second")
        second_finished.set()
        return ToolResult.pending(Request("req-second", "input", "second?"))

    model = ScriptedModel(
        reply(None, tool_call("slow_first", id="c1"), tool_call("quick_second", id="c2"))
    )
    tools = [RecordingTool("slow_first", slow_first), RecordingTool("quick_second", quick_second)]
    result = await run_in_process(model, tools)

    assert finished == ["second", "first"], "the scenario needs call 2 to finish first"
    assert result.status == "pending"
    assert result.pending is not None and result.pending.id == "req-first"
    assert result.turns == 1 and model.remaining == 0
    assert_no_leaks()


async def test_run_result_suspended_lists_every_suspended_call_in_order() -> None:
    """RunResult.suspended: every suspended call of the halted turn, in call order."""

    async def fine(args: dict[str, Any], ctx: ToolContext | None) -> ToolResult:
        return ToolResult.ok("fine")

    model = ScriptedModel(
        reply(
            None,
            tool_call("fine", id="c1"),
            tool_call("ask_b", id="c2"),
            tool_call("ask_c", id="c3"),
        )
    )
    tools = [
        RecordingTool("fine", fine),
        approval_tool("ask_b", "b?", request_id="req-b"),
        approval_tool("ask_c", "c?", request_id="req-c"),
    ]
    result = await run_in_process(model, tools)

    assert result.status == "pending"
    assert [(r.id, r.request.id if r.request else None) for r in result.suspended] == [
        ("c2", "req-b"),
        ("c3", "req-c"),
    ]
    assert result.pending == result.suspended[0].request
    assert [r.id for r in result.tool_calls] == ["c1", "c2", "c3"]
    assert_no_leaks()


async def test_pending_of_reads_a_halted_run_and_nothing_else(provider: FakeProvider) -> None:
    """pending_of(result) is the halted run's request; None for a run that is done."""
    provider.handler = lambda body, seen: anthropic_reply(
        None, [("tu1", "login", {})] if len(provider.requests) == 1 else None
    )

    async def login(args: dict[str, Any], ctx: ToolContext | None) -> ToolResult:
        if ctx is None or ctx.answer is None:
            return ToolResult.auth_required("https://example.com/login", "Log in")
        return ToolResult.ok("in")

    async with Toolkit.create(builtins=False, extra_tools=[RecordingTool("login", login)]) as tk:
        with anyio.fail_after(LIMIT):
            async with provider.client("anthropic") as client:
                halted = await client.run("who am I", tk)
            assert len(provider.requests) == 1
            provider.requests.clear()

            async def approve(request: Request) -> Answer:
                return Answer(request.id, True)

            async with provider.client("anthropic", wait_for=approve) as client:
                finished = await client.run("who am I", tk)

    request = pending_of(halted)
    assert request is not None and request is halted.pending
    assert request.kind == "authorization" and request.url == "https://example.com/login"
    assert ToolResult.pending_of(halted) is request
    assert finished.status == "done"
    assert pending_of(finished) is None
    assert_no_leaks()


# --- 3. a suspension is not a tool failure -----------------------------------------------------


async def test_a_suspension_is_not_a_tool_failure() -> None:
    """The record of a suspended call keeps its request; a failing tool has none."""

    async def broken(args: dict[str, Any], ctx: ToolContext | None) -> ToolResult:
        raise RuntimeError("disk on fire")

    model = ScriptedModel(reply(None, tool_call("broken", id="c1"), tool_call("ask", id="c2")))
    tools = [RecordingTool("broken", broken), approval_tool("ask", "ok?", request_id="req-1")]
    result = await run_in_process(model, tools)  # no exception: a suspension is not an error

    assert result.status == "pending"
    failed, parked = result.tool_calls
    assert failed.result.is_error and failed.request is None
    assert "disk on fire" in failed.result.output
    assert parked.request is not None and parked.request.id == "req-1"
    assert pending_of(parked.result) == parked.request
    assert parked.answered_ok is None
    assert [r.id for r in result.suspended] == ["c2"], "the failed call is not a suspension"
    assert_no_leaks()


async def test_a_resolved_suspension_keeps_its_request_on_the_record() -> None:
    """Resolved by wait_for, the record still says it suspended, and how it was answered."""
    model = ScriptedModel(
        reply(None, tool_call("yes", id="c1"), tool_call("no", id="c2")), "reported"
    )
    tools = [
        approval_tool("yes", "yes?", request_id="req-yes"),
        approval_tool("no", "no?", request_id="req-no"),
    ]

    async def wait_for(request: Request) -> Answer:
        if request.id == "req-yes":
            return Answer(request.id, True)
        return Answer(request.id, False, reason="declined")

    result = await run_in_process(model, tools, wait_for)

    assert result.status == "done" and result.suspended == ()
    yes, no = result.tool_calls
    assert yes.request is not None and yes.request.id == "req-yes"
    assert yes.answered_ok is True and not yes.result.is_error
    assert no.request is not None and no.request.id == "req-no"
    assert no.answered_ok is False and no.result.output == "declined/expired: no?"
    assert_no_leaks()


# --- 4. expiry ----------------------------------------------------------------------------


async def test_an_expired_request_is_answered_as_expired_without_asking() -> None:
    """expires_at already passed: answered as expired, wait_for is never called."""

    async def stale(args: dict[str, Any], ctx: ToolContext | None) -> ToolResult:
        return ToolResult.pending(
            Request("", "approval", "Approve yesterday's transfer?", expires_at=in_seconds(-60))
        )

    tool = RecordingTool("stale", stale)
    asked: list[Request] = []

    async def wait_for(request: Request) -> Answer:
        asked.append(request)
        return Answer(request.id, True)

    model = ScriptedModel(reply(None, tool_call("stale", id="c1")), "too late")
    result = await run_in_process(model, [tool], wait_for)

    assert asked == []
    assert len(tool.calls) == 1
    (fed,) = tool_returns(model.requests[1])
    assert fed.is_error and fed.output == "declined/expired: Approve yesterday's transfer?"
    assert result.status == "done" and result.tool_calls[0].answered_ok is False
    assert_no_leaks()


async def test_without_wait_for_an_expired_request_is_answered_not_parked() -> None:
    """No wait_for, expires_at already passed: no halt on a dead request; the model is told."""

    async def stale(args: dict[str, Any], ctx: ToolContext | None) -> ToolResult:
        return ToolResult.pending(Request("", "approval", "Too late?", expires_at=in_seconds(-1)))

    tool = RecordingTool("stale", stale)
    model = ScriptedModel(reply(None, tool_call("stale", id="c1")), "noted")
    result = await run_in_process(model, [tool])

    assert result.status == "done" and result.pending is None
    (fed,) = tool_returns(model.requests[1])
    assert fed.is_error and fed.output == "declined/expired: Too late?"
    assert result.tool_calls[0].request is not None
    assert result.tool_calls[0].answered_ok is False
    assert_no_leaks()


async def test_a_request_that_expires_while_waiting_is_answered_as_expired(
    provider: FakeProvider,
) -> None:
    """expires_at passes while wait_for is pending: expired, the resolver is cancelled."""

    def handler(body: dict[str, Any], _seen: object) -> dict[str, Any]:
        if len(provider.requests) == 1:
            return anthropic_reply(None, [("tu1", "soon", {})])
        return anthropic_reply("expired, as expected")

    provider.handler = handler

    async def soon(args: dict[str, Any], ctx: ToolContext | None) -> ToolResult:
        return ToolResult.pending(
            Request("", "approval", "Quick, approve?", expires_at=in_seconds(0.3))
        )

    tool = RecordingTool("soon", soon)
    entered = anyio.Event()
    cancelled: list[bool] = []

    async def never_answers(request: Request) -> Answer:
        entered.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            cancelled.append(True)
            raise
        raise AssertionError("unreachable")

    with anyio.fail_after(LIMIT):
        async with (
            Toolkit.create(builtins=False, extra_tools=[tool]) as tk,
            provider.client("anthropic", wait_for=never_answers) as c,
        ):
            result = await c.run("approve it", tk)

    assert entered.is_set(), "the request was live, so wait_for is asked"
    assert cancelled == [True], "the resolver is cancelled at expiry"
    assert result.status == "done" and result.text == "expired, as expected"
    blocks = provider.bodies[1]["messages"][-1]["content"]
    assert blocks == [
        {
            "type": "tool_result",
            "tool_use_id": "tu1",
            "content": "declined/expired: Quick, approve?",
            "is_error": True,
        }
    ]
    assert len(tool.calls) == 1
    assert_no_leaks()


# --- the answer's id, a failing resolver, a plain resolver -------------------------------------


async def test_an_answer_with_another_id_is_refused_and_the_tool_not_rerun() -> None:
    """An Answer whose id does not echo the request's: an error naming both ids, no retry."""
    tool = approval_tool("pay", "Pay?", request_id="req-42")

    async def wrong_id(request: Request) -> Answer:
        return Answer("req-999", True)

    model = ScriptedModel(reply(None, tool_call("pay", id="c1")), "hm")
    result = await run_in_process(model, [tool], wrong_id)

    assert len(tool.calls) == 1, "the tool must not run on someone else's answer"
    (fed,) = tool_returns(model.requests[1])
    assert fed.is_error
    assert "req-42" in fed.output and "req-999" in fed.output
    assert result.status == "done"
    assert_no_leaks()


async def test_a_failing_wait_for_is_an_error_result_and_siblings_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """wait_for raising: that call gets an error result; its sibling calls are unaffected."""
    tools = [
        approval_tool("doomed", "doomed?", request_id="req-doomed"),
        approval_tool("fine", "fine?", request_id="req-fine"),
    ]
    sibling_asked = anyio.Event()

    async def wait_for(request: Request) -> Answer:
        if request.id == "req-doomed":
            # Fail only once the sibling is being asked too: the failure must not cancel it.
            await sibling_asked.wait()
            raise RuntimeError("approval service down")
        sibling_asked.set()
        return Answer(request.id, True)

    model = ScriptedModel(
        reply(None, tool_call("doomed", id="c1"), tool_call("fine", id="c2")), "partly"
    )
    result = await run_in_process(model, tools, wait_for)

    doomed, fine = tool_returns(model.requests[1])
    assert doomed.is_error
    assert "RuntimeError" in doomed.output and "approval service down" in doomed.output
    assert not fine.is_error and fine.output.startswith("fine done")
    assert len(tools[0].calls) == 1 and len(tools[1].calls) == 2
    assert result.status == "done"
    assert_no_leaks()


# --- order ----------------------------------------------------------------------------------


async def test_tool_results_reach_the_model_in_tool_call_order(provider: FakeProvider) -> None:
    """Three calls finishing in reverse order: the model still gets results in call order."""

    def handler(body: dict[str, Any], _seen: object) -> dict[str, Any]:
        if len(provider.requests) == 1:
            calls: list[tuple[str, str, dict[str, Any] | str]] = [
                (f"c{i}", f"step{i}", {}) for i in (1, 2, 3)
            ]
            return openai_reply(None, calls)
        return openai_reply("ordered")

    provider.handler = handler
    done = {i: anyio.Event() for i in (1, 2, 3)}
    finished: list[int] = []

    def step(i: int) -> RecordingTool:
        async def body(args: dict[str, Any], ctx: ToolContext | None) -> ToolResult:
            if i < 3:
                await done[i + 1].wait()  # step 3 finishes first, then 2, then 1
            finished.append(i)
            done[i].set()
            return ToolResult.ok(f"result {i}")

        return RecordingTool(f"step{i}", body)

    with anyio.fail_after(LIMIT):
        async with (
            Toolkit.create(builtins=False, extra_tools=[step(i) for i in (1, 2, 3)]) as tk,
            provider.client() as client,
        ):
            result = await client.run("three steps", tk)

    assert finished == [3, 2, 1]
    fed = [m for m in provider.bodies[1]["messages"] if m["role"] == "tool"]
    assert [(m["tool_call_id"], m["content"]) for m in fed] == [
        ("c1", "result 1"),
        ("c2", "result 2"),
        ("c3", "result 3"),
    ]
    assert [r.id for r in result.tool_calls] == ["c1", "c2", "c3"]
    assert result.status == "done"
    assert_no_leaks()
