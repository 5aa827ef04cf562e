"""A tool's optional ``refused(args, ctx)``: told once when its own request is refused.

Every path that settles a call as declined/expired tells the tool (a live ``wait_for``,
``stream`` and ``start``, an in-memory resume, a durable one, a halted request expired
before the resume), before the model sees the refusal; an ok answer, a gate's refusal, a
wrong id and a halt do not. Models are scripted in-process; nothing sleeps to synchronise.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.conftest import assert_no_leaks
from toolnexus_async import (
    Answer,
    Hooks,
    LlmClient,
    Request,
    RunResult,
    StreamToolResult,
    ToolContext,
    Toolkit,
    ToolResult,
    ToolReturn,
    UsageError,
    define_tool,
    require_approval,
)
from toolnexus_async._core.suspension import CallRule, Execute, Halt, Settle
from toolnexus_async.durable import DurableHost, SqliteRunStore
from toolnexus_async.testing import ScriptedModel, reply, tool_call

LIMIT = 5  # seconds; only reached when what is under test is broken

SECRET = "sk-do-not-log-1234"


def in_seconds(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


class Pay:
    """Asks before paying; records every execution, and every refusal with what the model
    had been sent by then (to show the tool is told first)."""

    name = "pay"
    description = "Pay, once approved."
    input_schema: dict[str, Any] = {"type": "object", "properties": {}}  # noqa: RUF012
    source = "custom"

    def __init__(
        self, model: ScriptedModel | None = None, *, expires_at: str | None = None
    ) -> None:
        self.model = model
        self.expires_at = expires_at
        self.runs: list[ToolContext | None] = []
        self.told: list[tuple[dict[str, Any], ToolContext, int]] = []
        self.fail: BaseException | None = None
        self.hold: anyio.Event | None = None  # when set: refused() waits for it

    async def execute(self, args: dict[str, Any], ctx: ToolContext | None = None) -> ToolResult:
        self.runs.append(ctx)
        if ctx is None or ctx.answer is None:
            return ToolResult.pending(Request("", "approval", "Pay?", expires_at=self.expires_at))
        return ToolResult.ok("paid")

    async def refused(self, args: dict[str, Any], ctx: ToolContext) -> None:
        seen = len(self.model.requests) if self.model is not None else -1
        self.told.append((dict(args), ctx, seen))
        if self.hold is not None:
            await self.hold.wait()
        if self.fail is not None:
            raise self.fail


def script() -> ScriptedModel:
    return ScriptedModel(reply(tool_call("pay", {"amount": 30}, id="c1")), "ok")


def fed(model: ScriptedModel) -> ToolReturn:
    (result,) = [m for m in model.requests[1] if isinstance(m, ToolReturn)]
    return result


async def run(pay: Pay, wait_for: Any = None, hooks: Hooks | None = None) -> RunResult:
    assert pay.model is not None
    with anyio.fail_after(LIMIT):
        async with (
            Toolkit([pay]) as tk,
            LlmClient.in_process(pay.model, wait_for=wait_for, hooks=hooks) as client,
        ):
            return await client.run("go", tk)


def assert_told(pay: Pay, answer: Answer, request: Request | None = None) -> ToolContext:
    """Told once, of ``answer``, with the ctx of the call's executions, before the model
    saw the refusal."""
    ((args, ctx, seen),) = pay.told
    first = pay.runs[0]
    assert first is not None
    assert args == {"amount": 30}
    assert ctx.answer == answer
    assert ctx.request is not None and ctx.request.id == answer.id
    if request is not None:
        assert ctx.request == request
    assert (ctx.call_id, ctx.run_id, ctx.tool_name, ctx.turn) == (
        first.call_id,
        first.run_id,
        first.tool_name,
        first.turn,
    )
    assert ctx.idempotency_key is not None and ctx.idempotency_key == first.idempotency_key
    assert seen == 1, "the model saw the refusal before the tool was told"
    return ctx


# --- a live run with wait_for ------------------------------------------------------------


@pytest.mark.parametrize("reason", ["declined", "cancelled", None])
async def test_a_declined_answer_tells_the_tool_once_before_the_model_sees_it(
    reason: str | None,
) -> None:
    pay = Pay(script())
    asked: list[Request] = []

    async def wait_for(request: Request) -> Answer:
        asked.append(request)
        return Answer(request.id, False, reason=reason)

    result = await run(pay, wait_for)

    assert_told(pay, Answer(asked[0].id, False, reason=reason), asked[0])
    assert len(pay.runs) == 1, "a refused tool ran again"
    assert fed(pay.model) == ToolReturn("c1", "pay", "declined/expired: Pay?", True)  # type: ignore[arg-type]
    assert result.status == "done" and result.tool_calls[0].answered_ok is False
    assert_no_leaks()


async def test_a_request_expired_before_asking_is_told_as_expired() -> None:
    pay = Pay(script(), expires_at=in_seconds(-60))
    asked: list[Request] = []

    async def wait_for(request: Request) -> Answer:
        asked.append(request)
        return Answer(request.id, True)

    await run(pay, wait_for)

    assert asked == []
    request = pay.told[0][1].request
    assert request is not None
    assert_told(pay, Answer(request.id, False, reason="expired"))
    assert len(pay.runs) == 1
    assert fed(pay.model).output == "declined/expired: Pay?"  # type: ignore[arg-type]


async def test_a_time_limit_that_passes_is_told_as_expired() -> None:
    """A resolver that does not enforce expires_at gets the seconds left; their passing is
    the synthesized Answer(ok=False, reason="expired")."""
    pay = Pay(script(), expires_at=in_seconds(0.2))
    asked: list[Request] = []

    async def wait_for(request: Request) -> Answer:
        asked.append(request)
        await anyio.Event().wait()  # nobody ever answers
        raise AssertionError("unreachable")

    await run(pay, wait_for)

    assert_told(pay, Answer(asked[0].id, False, reason="expired"), asked[0])
    assert len(pay.runs) == 1
    assert fed(pay.model).output == "declined/expired: Pay?"  # type: ignore[arg-type]


async def test_an_ok_answer_retries_and_does_not_tell() -> None:
    pay = Pay(script())

    async def wait_for(request: Request) -> Answer:
        return Answer(request.id, True)

    result = await run(pay, wait_for)

    assert pay.told == []
    assert len(pay.runs) == 2 and fed(pay.model).output == "paid"  # type: ignore[arg-type]
    assert result.tool_calls[0].answered_ok is True


async def test_a_gates_refusal_does_not_tell_the_tool_which_never_asked() -> None:
    pay = Pay(script())
    asked: list[Request] = []

    async def wait_for(request: Request) -> Answer:
        asked.append(request)
        return Answer(request.id, False, reason="declined")

    await run(pay, wait_for, Hooks(before_tool=require_approval(["pay"])))

    assert [r.data["gate"] for r in asked if r.data] == ["require_approval"]
    assert pay.runs == [] and pay.told == []
    assert fed(pay.model).output.startswith("declined/expired: ")  # type: ignore[arg-type]


async def test_after_an_approved_gate_the_tools_own_refusal_tells_it() -> None:
    pay = Pay(script())
    asked: list[Request] = []

    async def wait_for(request: Request) -> Answer:
        asked.append(request)
        return Answer(request.id, len(asked) == 1)  # the gate yes, the tool's own no

    await run(pay, wait_for, Hooks(before_tool=require_approval(["pay"])))

    _gate, own = asked
    assert own.prompt == "Pay?"
    assert_told(pay, Answer(own.id, False), own)
    assert fed(pay.model).output == "declined/expired: Pay?"  # type: ignore[arg-type]


async def test_stream_and_start_tell_the_tool_before_the_result_event() -> None:
    for how in ("stream", "start"):
        pay = Pay(script())

        async def wait_for(request: Request) -> Answer:
            return Answer(request.id, False, reason="declined")

        order: list[str] = []
        with anyio.fail_after(LIMIT):
            async with (
                Toolkit([pay]) as tk,
                LlmClient.in_process(pay.model, wait_for=wait_for) as client,  # type: ignore[arg-type]
            ):
                if how == "stream":
                    async with client.stream("go", tk) as stream:
                        async for event in stream:
                            if isinstance(event, StreamToolResult):
                                assert event.declined
                                order.append(f"event, told {len(pay.told)}")
                else:
                    async with client.start("go", tk) as handle:
                        await handle.result()
        assert len(pay.told) == 1 and pay.told[0][1].answer == Answer(
            pay.told[0][1].answer.id,  # type: ignore[union-attr]
            False,
            reason="declined",
        )
        if how == "stream":
            assert order == ["event, told 1"]
        assert fed(pay.model).output == "declined/expired: Pay?"  # type: ignore[arg-type]


# --- resuming a halt ----------------------------------------------------------------------


async def test_a_halt_does_not_tell_and_a_declined_resume_does() -> None:
    pay = Pay(script())
    with anyio.fail_after(LIMIT):
        async with (
            Toolkit([pay]) as tk,
            LlmClient.in_process(pay.model) as client,  # type: ignore[arg-type]
        ):
            halted = await client.run("go", tk)
            assert halted.status == "pending" and halted.pending is not None
            assert pay.told == []
            refusal = Answer(halted.pending.id, False, reason="declined")
            result = await client.resume(halted, tk, answers=refusal)

    ctx = assert_told(pay, refusal, halted.pending)
    assert ctx.run_id == halted.run_id
    assert len(pay.runs) == 1
    assert result.status == "done" and fed(pay.model).output == "declined/expired: Pay?"  # type: ignore[arg-type]


async def test_a_late_ok_answer_counts_as_expired_and_tells_so() -> None:
    pay = Pay(script(), expires_at="2999-01-01T00:00:00Z")
    with anyio.fail_after(LIMIT):
        async with (
            Toolkit([pay]) as tk,
            LlmClient.in_process(pay.model) as client,  # type: ignore[arg-type]
        ):
            halted = await client.run("go", tk)
            payload = halted.to_dict()
            # The request expired while the run sat in storage; then a yes comes.
            payload["suspended"][0]["request"]["expiresAt"] = "2000-01-01T00:00:00Z"
            stale = RunResult.from_dict(payload)
            request = stale.suspended[0].request
            assert request is not None and request.expired()
            await client.resume(stale, tk, answers=Answer(request.id, True))

    assert_told(pay, Answer(request.id, False, reason="expired"), request)
    assert len(pay.runs) == 1
    assert fed(pay.model).output == "declined/expired: Pay?"  # type: ignore[arg-type]


def durable_model(messages: list[Any], tools: list[Any]) -> Any:
    last = messages[-1]
    if isinstance(last, ToolReturn):
        return f"result: {last.output}"
    return reply(tool_call("pay", {"amount": 30}, id="c1"))


async def test_a_durable_resume_with_a_refusal_tells_the_tool(tmp_path: Path) -> None:
    pay = Pay()
    results: list[RunResult] = []
    with anyio.fail_after(LIMIT):
        async with (
            SqliteRunStore(tmp_path / "runs.db") as store,
            Toolkit([pay]) as tk,
            LlmClient.in_process(durable_model) as client,
            DurableHost(client, tk, store, on_result=results.append, sweep=0.02) as host,
        ):
            halted = await host.run("pay")
            assert halted.pending is not None and pay.told == []
            refusal = Answer(halted.pending.id, False, reason="cancelled")
            await host.answer(refusal)
            while not results:
                await anyio.lowlevel.checkpoint()

    ((_, ctx, _),) = pay.told
    assert ctx.answer == refusal and ctx.request == halted.pending
    assert ctx.run_id == halted.run_id
    first = pay.runs[0]
    assert first is not None and ctx.idempotency_key == first.idempotency_key
    assert len(pay.runs) == 1
    assert results[0].tool_calls[0].answered_ok is False
    assert results[0].text == "result: declined/expired: Pay?"
    assert_no_leaks()


async def test_a_halted_request_that_expired_before_the_resume_tells_it(tmp_path: Path) -> None:
    pay = Pay(expires_at=in_seconds(0.3))
    results: list[RunResult] = []
    with anyio.fail_after(LIMIT):
        async with (
            SqliteRunStore(tmp_path / "runs.db") as store,
            Toolkit([pay]) as tk,
            LlmClient.in_process(durable_model) as client,
            DurableHost(client, tk, store, on_result=results.append, sweep=0.02) as host,
        ):
            halted = await host.run("pay")
            assert halted.pending is not None
            while not results:  # the sweep finds it expired and goes on
                await anyio.lowlevel.checkpoint()

    ((_, ctx, _),) = pay.told
    assert ctx.answer == Answer(halted.pending.id, False, reason="expired")
    assert ctx.request == halted.pending
    assert results[0].text == "result: declined/expired: Pay?"


async def test_a_host_stopped_while_refused_runs_tells_it_again_on_recovery(
    tmp_path: Path,
) -> None:
    """At least once: the refusal is recorded only after refused() returned, so a host that
    stops in between leaves the call to be settled, and told, again."""
    path = tmp_path / "runs.db"
    pay = Pay()
    pay.hold = anyio.Event()  # never set: the first refused() is cut off by the shutdown
    with anyio.fail_after(LIMIT), anyio.CancelScope() as stop:
        async with (
            SqliteRunStore(path) as store,
            Toolkit([pay]) as tk,
            LlmClient.in_process(durable_model) as client,
            DurableHost(client, tk, store, sweep=0.02) as host,
        ):
            halted = await host.run("pay")
            assert halted.pending is not None
            refusal = Answer(halted.pending.id, False, reason="declined")
            await host.answer(refusal)
            while not pay.told:
                await anyio.lowlevel.checkpoint()
            assert (await store.load(halted.run_id)).results == {}
            host.shutdown()  # the host stops mid-refused(), leaving the run to the next
            stop.cancel()
            await anyio.sleep_forever()
    assert stop.cancelled_caught

    pay.hold = None
    results: list[RunResult] = []
    with anyio.fail_after(LIMIT):
        async with (
            SqliteRunStore(path) as store,
            Toolkit([pay]) as tk,
            LlmClient.in_process(durable_model) as client,
            DurableHost(client, tk, store, on_result=results.append, sweep=0.02),
        ):
            while not results:
                await anyio.lowlevel.checkpoint()

    assert [ctx.answer for _, ctx, _ in pay.told] == [refusal, refusal]
    assert len({ctx.idempotency_key for _, ctx, _ in pay.told}) == 1
    assert len(pay.runs) == 1
    assert results[0].text == "result: declined/expired: Pay?"


# --- never raises across; plain tools unaffected -----------------------------------------


async def test_refused_raising_is_logged_without_its_text_and_ignored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pay = Pay(script())
    pay.fail = RuntimeError(f"server said no, key {SECRET}")

    async def wait_for(request: Request) -> Answer:
        return Answer(request.id, False, reason="declined")

    with caplog.at_level(logging.WARNING, logger="toolnexus_async"):
        result = await run(pay, wait_for)

    assert len(pay.told) == 1
    assert result.status == "done"
    assert fed(pay.model) == ToolReturn("c1", "pay", "declined/expired: Pay?", True)  # type: ignore[arg-type]
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.name == "toolnexus_async"
    assert "'pay'" in warning.getMessage() and "RuntimeError" in warning.getMessage()
    assert SECRET not in caplog.text


async def test_cancellation_in_refused_passes_through() -> None:
    pay = Pay(script())
    pay.hold = anyio.Event()

    async def wait_for(request: Request) -> Answer:
        return Answer(request.id, False)

    with anyio.fail_after(LIMIT):
        async with (
            Toolkit([pay]) as tk,
            LlmClient.in_process(pay.model, wait_for=wait_for) as client,  # type: ignore[arg-type]
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(client.run, "go", tk)
            while not pay.told:
                await anyio.lowlevel.checkpoint()
            tg.cancel_scope.cancel()
    assert len(pay.model.requests) == 1  # type: ignore[union-attr]
    assert_no_leaks()


class Plain:
    """The same tool without ``refused``."""

    name = "pay"
    description = "Pay, once approved."
    input_schema: dict[str, Any] = {"type": "object", "properties": {}}  # noqa: RUF012
    source = "custom"

    async def execute(self, args: dict[str, Any], ctx: ToolContext | None = None) -> ToolResult:
        return ToolResult.pending(Request("", "approval", "Pay?"))


async def test_a_tool_without_refused_is_unaffected() -> None:
    model = script()

    async def wait_for(request: Request) -> Answer:
        return Answer(request.id, False, reason="declined")

    with anyio.fail_after(LIMIT):
        async with (
            Toolkit([Plain()]) as tk,
            LlmClient.in_process(model, wait_for=wait_for) as client,
        ):
            result = await client.run("go", tk)
            # Toolkit.refused itself: nothing for a tool without it or an unknown name.
            ctx = ToolContext(answer=Answer("r1", False), call_id="c9")
            await tk.refused("pay", {}, ctx)
            await tk.refused("nope", {}, ctx)
    assert result.status == "done"
    assert fed(model) == ToolReturn("c1", "pay", "declined/expired: Pay?", True)
    with pytest.raises(UsageError, match="closed"):
        await tk.refused("pay", {}, ctx)


# --- the rule itself (sans-IO) ------------------------------------------------------------


def test_the_rule_carries_a_refusal_only_for_the_calls_own_request() -> None:
    call = tool_call("pay", id="c1")
    own = Request("r1", "approval", "Pay?")
    gate = Request("g1", "approval", "Allow pay?", data={"gate": "require_approval"})
    expired = Request("r2", "approval", "Pay?", expires_at=in_seconds(-1))

    def settled(action: object) -> Settle:
        assert isinstance(action, Settle)
        return action

    no = Answer("r1", False, reason="declined")
    assert settled(CallRule(call, can_ask=True).resumed(own, no)).refusal == no
    assert settled(CallRule(call, can_ask=True).resumed(gate, Answer("g1", False))).refusal is None
    wrong = settled(CallRule(call, can_ask=True).resumed(own, Answer("zz", False)))
    assert wrong.refusal is None and wrong.outcome.result.output.startswith("refused an answer")
    late = settled(CallRule(call, can_ask=True).resumed(expired, Answer("r2", True)))
    assert late.refusal == Answer("r2", False, reason="expired")
    waited = settled(CallRule(call, can_ask=True).waiting(expired))
    assert waited.refusal == Answer("r2", False, reason="expired")
    assert isinstance(CallRule(call, can_ask=False).waiting(own), Halt)
    fresh = CallRule(call, can_ask=True)
    fresh.start()
    assert settled(fresh.executed(ToolResult.pending(expired))).refusal == late.refusal
    gated = CallRule(call, can_ask=True)
    gated.start()
    expired_gate = Request("g2", "approval", "Allow?", expires_at=in_seconds(-1))
    assert settled(gated.executed(ToolResult.pending(expired_gate), by_gate=True)).refusal is None
    assert isinstance(CallRule(call, can_ask=True).resumed(own, Answer("r1", True)), Execute)


# --- define_tool(on_refused=...) ----------------------------------------------------------


async def test_define_tool_on_refused_is_told_and_must_be_async() -> None:
    told: list[tuple[dict[str, Any], ToolContext]] = []

    async def cancel_order(args: dict[str, Any], ctx: ToolContext) -> None:
        told.append((args, ctx))

    @define_tool(on_refused=cancel_order)
    async def pay(amount: int, ctx: ToolContext | None = None) -> ToolResult:
        """Pay, once approved."""
        if ctx is None or ctx.answer is None:
            return ToolResult.pending(Request("", "approval", "Pay?"))
        return ToolResult.ok("paid")

    @define_tool
    async def plain(ctx: ToolContext | None = None) -> str:
        """No refused()."""
        return "ok"

    assert plain.refused is None
    model = script()

    async def wait_for(request: Request) -> Answer:
        return Answer(request.id, False, reason="declined")

    with anyio.fail_after(LIMIT):
        async with (
            Toolkit([pay]) as tk,
            LlmClient.in_process(model, wait_for=wait_for) as client,
        ):
            await client.run("go", tk)
    ((args, ctx),) = told
    assert args == {"amount": 30} and ctx.answer is not None and ctx.answer.reason == "declined"
    assert fed(model).output == "declined/expired: Pay?"

    def not_async(args: dict[str, Any], ctx: ToolContext) -> None:
        pass

    with pytest.raises(UsageError, match="on_refused must be an async function"):
        define_tool(name="x", description="x", on_refused=not_async)(lambda: "x")  # type: ignore[arg-type]
