"""Hooks end to end through the public API: ``before_llm``, ``after_llm``, ``before_tool``,
``after_tool`` (each as a plain function and as a coroutine function) and
``require_approval``.

Models are scripted in-process unless the wire matters (what the provider is sent or
returned), then a provider played over the mock transport (``provider``) does. Anything that
could hang on a broken implementation runs under ``anyio.fail_after``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
import pytest

from tests.conftest import FakeProvider, assert_no_leaks, openai_reply
from toolnexus_async import (
    Answer,
    AssistantMessage,
    Hooks,
    LlmCall,
    LlmClient,
    Message,
    ModelReply,
    Request,
    RunResult,
    ToolContext,
    Toolkit,
    ToolResult,
    ToolReturn,
    UserMessage,
    pending_of,
    require_approval,
)
from toolnexus_async._engine.hooks import call_digest
from toolnexus_async.testing import ScriptedModel, reply, tool_call

LIMIT = 5  # seconds; only reached when the rule under test is broken

VARIANTS = pytest.mark.parametrize("variant", ["sync", "async"])

Body = Callable[[dict[str, Any], ToolContext | None], Awaitable[ToolResult]]


class RecordingTool:
    """A tool whose behaviour is an async function; it records every execution."""

    source = "custom"
    description = "a tool for the hook tests"
    input_schema: dict[str, Any] = {"type": "object", "properties": {}}  # noqa: RUF012

    def __init__(self, name: str, body: Body | None = None) -> None:
        self.name = name
        self._body = body
        self.calls: list[tuple[dict[str, Any], ToolContext | None]] = []

    @property
    def arguments(self) -> list[dict[str, Any]]:
        return [args for args, _ in self.calls]

    async def execute(self, args: dict[str, Any], ctx: ToolContext | None = None) -> ToolResult:
        self.calls.append((dict(args), ctx))
        if self._body is None:
            return ToolResult.ok(f"{self.name} ran with {sorted(args.items())}")
        return await self._body(args, ctx)


def self_suspending(name: str, prompt: str) -> RecordingTool:
    """Suspends until it runs with ``ctx.answer``; then reports the answer it got."""

    async def body(args: dict[str, Any], ctx: ToolContext | None) -> ToolResult:
        if ctx is None or ctx.answer is None:
            return ToolResult.pending(Request("", "approval", prompt))
        return ToolResult.ok(f"{name} done after {ctx.answer.ok}")

    return RecordingTool(name, body)


def shaped(fn: Callable[..., Any], variant: str) -> Callable[..., Any]:
    """``fn`` as given ("sync"), or wrapped in a coroutine function that yields first."""
    if variant == "sync":
        return fn

    async def hook(*args: Any) -> Any:
        await anyio.lowlevel.checkpoint()
        return fn(*args)

    return hook


def returns(messages: Sequence[Message]) -> dict[str, ToolReturn]:
    """The tool results of a transcript, by call id."""
    return {m.call_id: m for m in messages if isinstance(m, ToolReturn)}


async def run_in_process(
    model: ScriptedModel,
    tools: Sequence[RecordingTool],
    hooks: Hooks,
    *,
    wait_for: Any = None,
    history: Sequence[Message] | None = None,
) -> RunResult:
    with anyio.fail_after(LIMIT):
        async with (
            Toolkit.create(builtins=False, extra_tools=tools) as tk,
            LlmClient.in_process(model, model="scripted", hooks=hooks, wait_for=wait_for) as client,
        ):
            return await client.run("go", tk, history=history)


# --- before_llm ----------------------------------------------------------------------------


@VARIANTS
async def test_before_llm_dropping_old_turns_holds_for_the_rest_of_the_run(variant: str) -> None:
    """Messages replaced once by before_llm stay replaced: later requests lack them too."""
    seen: list[LlmCall] = []

    def trim(call: LlmCall) -> LlmCall | None:
        seen.append(call)
        if len(seen) > 1:
            return None  # only the first request is trimmed; the change must persist
        last_user = max(i for i, m in enumerate(call.messages) if isinstance(m, UserMessage))
        return LlmCall(call.messages[last_user:], call.tools)

    history: list[Message] = [UserMessage("old question"), AssistantMessage("old answer")]
    model = ScriptedModel(reply(tool_call("echo", {"x": 1}, id="c1")), "done")
    echo = RecordingTool("echo")
    result = await run_in_process(
        model, [echo], Hooks(before_llm=shaped(trim, variant)), history=history
    )

    assert result.status == "done"
    assert len(seen) == 2, "before_llm runs before every model request"
    assert seen[0].messages == [*history, UserMessage("go")]
    assert model.requests[0] == [UserMessage("go")]
    second = model.requests[1]
    assert second[0] == UserMessage("go") and len(second) == 3
    assert all("old" not in repr(m) for m in second), "dropped turns came back"
    assert UserMessage("old question") not in result.messages
    assert_no_leaks()


@VARIANTS
async def test_before_llm_replacing_tools_holds_for_the_rest_of_the_run(
    provider: FakeProvider, variant: str
) -> None:
    """New tools from before_llm are all the model gets; a removed tool is an unknown tool."""
    legacy = RecordingTool("legacy")
    fresh = RecordingTool("fresh")
    calls: list[list[str]] = []

    def swap(call: LlmCall) -> LlmCall | None:
        calls.append([t.name for t in call.tools])
        if len(calls) > 1:
            return None
        return LlmCall(call.messages, [fresh])

    provider.script(
        openai_reply(None, [("c1", "legacy", {}), ("c2", "fresh", {"x": 1})]),
        openai_reply("done"),
    )
    with anyio.fail_after(LIMIT):
        async with (
            Toolkit.create(builtins=False, extra_tools=[legacy]) as tk,
            provider.client(hooks=Hooks(before_llm=shaped(swap, variant))) as client,
        ):
            result = await client.run("go", tk)

    assert result.status == "done"
    assert calls == [["legacy"], ["fresh"]], "the second request must start from the new tools"
    sent = [[t["function"]["name"] for t in body["tools"]] for body in provider.bodies]
    assert sent == [["fresh"], ["fresh"]]
    assert legacy.calls == [], "a tool removed by before_llm must not run"
    assert fresh.arguments == [{"x": 1}]
    fed = {
        m["tool_call_id"]: m["content"]
        for m in provider.bodies[1]["messages"]
        if m["role"] == "tool"
    }
    assert fed["c1"].startswith("unknown tool 'legacy'")
    assert fed["c2"] == "fresh ran with [('x', 1)]"
    records = {r.id: r.result for r in result.tool_calls}
    assert records["c1"].is_error and not records["c2"].is_error
    assert_no_leaks()


# --- after_llm -----------------------------------------------------------------------------


@VARIANTS
async def test_after_llm_sees_the_provider_json(provider: FakeProvider, variant: str) -> None:
    """Over HTTP, after_llm gets each decoded reply and the provider's JSON as sent."""
    first = openai_reply(None, [("c1", "echo", {})], usage={"prompt_tokens": 3})
    first["system_fingerprint"] = "fp_raw_only"  # a key the codec ignores
    second = openai_reply("done")
    provider.script(first, second)
    seen: list[tuple[ModelReply, Any]] = []

    def after(reply: ModelReply, raw: Any) -> None:
        seen.append((reply, raw))

    with anyio.fail_after(LIMIT):
        async with (
            Toolkit.create(builtins=False, extra_tools=[RecordingTool("echo")]) as tk,
            provider.client(hooks=Hooks(after_llm=shaped(after, variant))) as client,
        ):
            result = await client.run("go", tk)

    assert result.status == "done"
    assert [raw for _, raw in seen] == [first, second]
    assert seen[0][0].message.tool_calls[0].name == "echo"
    assert seen[1][0].message.text == "done"
    assert_no_leaks()


@VARIANTS
async def test_after_llm_sees_the_in_process_return_value(variant: str) -> None:
    """In-process, after_llm's raw is exactly what the model function returned."""
    message = reply(tool_call("echo", id="c1"))
    model = ScriptedModel(message, "the end")
    raws: list[Any] = []
    hooks = Hooks(after_llm=shaped(lambda _reply, raw: raws.append(raw), variant))

    result = await run_in_process(model, [RecordingTool("echo")], hooks)

    assert result.status == "done"
    assert len(raws) == 2
    assert raws[0] is message
    assert raws[1] == "the end"


# --- before_tool ---------------------------------------------------------------------------


@VARIANTS
async def test_before_tool_rewrites_the_arguments(variant: str) -> None:
    """A dict from before_tool is what the tool runs with; other tools are untouched."""

    def cap(name: str, args: dict[str, Any], ctx: ToolContext) -> dict[str, Any] | None:
        return {**args, "amount": min(args["amount"], 10)} if name == "pay" else None

    pay, echo = RecordingTool("pay"), RecordingTool("echo")
    model = ScriptedModel(
        reply(
            tool_call("pay", {"amount": 500}, id="c1"), tool_call("echo", {"amount": 500}, id="c2")
        ),
        "ok",
    )
    result = await run_in_process(model, [pay, echo], Hooks(before_tool=shaped(cap, variant)))

    assert pay.arguments == [{"amount": 10}]
    assert echo.arguments == [{"amount": 500}]
    fed = returns(model.requests[1])
    assert fed["c1"].output == "pay ran with [('amount', 10)]"
    assert result.status == "done"


@VARIANTS
async def test_before_tool_short_circuits_with_a_result(variant: str) -> None:
    """A ToolResult from before_tool is the call's result; the tool does not run."""

    def cached(name: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult | None:
        return ToolResult.ok("from cache") if name == "lookup" else None

    lookup = RecordingTool("lookup")
    model = ScriptedModel(reply(tool_call("lookup", {"q": "x"}, id="c1")), "ok")
    result = await run_in_process(model, [lookup], Hooks(before_tool=shaped(cached, variant)))

    assert lookup.calls == []
    assert returns(model.requests[1])["c1"] == ToolReturn("c1", "lookup", "from cache")
    assert result.tool_calls[0].result == ToolResult.ok("from cache")


@VARIANTS
async def test_before_tool_suspension_goes_through_wait_for(variant: str) -> None:
    """A suspension from before_tool is resolved by wait_for; the tool runs once, after."""
    order: list[str] = []

    def ask_account(name: str, args: dict[str, Any], ctx: ToolContext) -> Any:
        if ctx.answer is None:
            return ToolResult.pending(Request("", "input", "Which account?"))
        assert ctx.answer.data is not None
        return {**args, "account": ctx.answer.data["account"]}

    async def body(args: dict[str, Any], ctx: ToolContext | None) -> ToolResult:
        order.append("tool")
        return ToolResult.ok(f"paid from {args['account']}")

    asked: list[Request] = []

    async def wait_for(request: Request) -> Answer:
        order.append("wait_for")
        asked.append(request)
        return Answer(request.id, True, data={"account": "A-1"})

    pay = RecordingTool("pay", body)
    model = ScriptedModel(reply(tool_call("pay", {"amount": 3}, id="c1")), "ok")
    result = await run_in_process(
        model, [pay], Hooks(before_tool=shaped(ask_account, variant)), wait_for=wait_for
    )

    assert [(r.kind, r.prompt) for r in asked] == [("input", "Which account?")]
    assert order == ["wait_for", "tool"], "the tool must not run before the answer"
    assert pay.arguments == [{"amount": 3, "account": "A-1"}]
    assert returns(model.requests[1])["c1"].output == "paid from A-1"
    assert result.status == "done"
    assert result.tool_calls[0].answered_ok is True


@VARIANTS
async def test_before_tool_suspension_halts_without_wait_for(variant: str) -> None:
    """Without wait_for a suspension from before_tool halts the run; the tool never runs."""

    def gate(name: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return ToolResult.pending(Request("r-gate", "approval", "Proceed?"))

    pay = RecordingTool("pay")
    model = ScriptedModel(reply(tool_call("pay", id="c1")), "never asked")
    result = await run_in_process(model, [pay], Hooks(before_tool=shaped(gate, variant)))

    assert result.status == "pending"
    assert result.pending is not None and result.pending.id == "r-gate"
    assert pay.calls == []
    assert len(model.requests) == 1


# --- after_tool ----------------------------------------------------------------------------


@VARIANTS
async def test_after_tool_transforms_results(variant: str) -> None:
    """A ToolResult from after_tool replaces the result; None keeps it."""
    seen: list[tuple[str, dict[str, Any], ToolResult]] = []

    def shout(name: str, args: dict[str, Any], result: ToolResult, ctx: ToolContext) -> Any:
        seen.append((name, args, result))
        return ToolResult.ok(result.output.upper()) if name == "loud" else None

    loud, quiet = RecordingTool("loud"), RecordingTool("quiet")
    model = ScriptedModel(
        reply(tool_call("loud", {"a": 1}, id="c1"), tool_call("quiet", id="c2")), "ok"
    )
    result = await run_in_process(model, [loud, quiet], Hooks(after_tool=shaped(shout, variant)))

    fed = returns(model.requests[1])
    assert fed["c1"].output == "LOUD RAN WITH [('A', 1)]"
    assert fed["c2"].output == "quiet ran with []"
    assert sorted((name, args) for name, args, _ in seen) == [("loud", {"a": 1}), ("quiet", {})]
    assert result.status == "done"


@VARIANTS
@pytest.mark.parametrize("approve", [True, False])
async def test_after_tool_runs_once_on_the_resolved_result(variant: str, approve: bool) -> None:
    """after_tool never sees the suspension, only the result after wait_for (once)."""
    seen: list[ToolResult] = []

    def after(name: str, args: dict[str, Any], result: ToolResult, ctx: ToolContext) -> ToolResult:
        seen.append(result)
        return ToolResult(f"[checked] {result.output}", result.is_error)

    async def wait_for(request: Request) -> Answer:
        return Answer(request.id, approve)

    pay = self_suspending("pay", "Pay?")
    model = ScriptedModel(reply(tool_call("pay", id="c1")), "ok")
    await run_in_process(model, [pay], Hooks(after_tool=shaped(after, variant)), wait_for=wait_for)

    assert len(seen) == 1
    assert pending_of(seen[0]) is None
    expected = "pay done after True" if approve else "declined/expired: Pay?"
    assert seen[0].output == expected
    assert returns(model.requests[1])["c1"].output == f"[checked] {expected}"


@VARIANTS
async def test_after_tool_does_not_run_when_the_run_halts(variant: str) -> None:
    """A halted call gets no after_tool; its completed sibling does."""
    names: list[str] = []

    def after(name: str, args: dict[str, Any], result: ToolResult, ctx: ToolContext) -> None:
        names.append(name)

    model = ScriptedModel(reply(tool_call("pay", id="c1"), tool_call("echo", id="c2")))
    result = await run_in_process(
        model,
        [self_suspending("pay", "Pay?"), RecordingTool("echo")],
        Hooks(after_tool=shaped(after, variant)),
    )

    assert result.status == "pending"
    assert names == ["echo"]


# --- raising tool hooks --------------------------------------------------------------------


@VARIANTS
async def test_a_raising_before_tool_is_an_error_result_and_siblings_go_on(variant: str) -> None:
    """before_tool raising: the model gets an error naming the hook; other calls still run."""

    def before(name: str, args: dict[str, Any], ctx: ToolContext) -> None:
        if name == "bad":
            raise RuntimeError("hook broke")

    bad, good = RecordingTool("bad"), RecordingTool("good")
    model = ScriptedModel(reply(tool_call("bad", id="c1"), tool_call("good", id="c2")), "ok")
    result = await run_in_process(model, [bad, good], Hooks(before_tool=shaped(before, variant)))

    assert result.status == "done"
    fed = returns(model.requests[1])
    assert fed["c1"].is_error
    assert "before_tool" in fed["c1"].output and "RuntimeError" in fed["c1"].output
    assert "hook broke" in fed["c1"].output and "'bad'" in fed["c1"].output
    assert bad.calls == [], "the tool must not run when its before_tool raised"
    assert fed["c2"] == ToolReturn("c2", "good", "good ran with []")


@VARIANTS
async def test_a_raising_after_tool_is_an_error_result_and_siblings_go_on(variant: str) -> None:
    """after_tool raising: the model gets an error naming the hook; other calls are kept."""

    def after(name: str, args: dict[str, Any], result: ToolResult, ctx: ToolContext) -> None:
        if name == "bad":
            raise KeyError("lost")

    bad, good = RecordingTool("bad"), RecordingTool("good")
    model = ScriptedModel(reply(tool_call("bad", id="c1"), tool_call("good", id="c2")), "ok")
    result = await run_in_process(model, [bad, good], Hooks(after_tool=shaped(after, variant)))

    assert result.status == "done"
    fed = returns(model.requests[1])
    assert fed["c1"].is_error
    assert "after_tool" in fed["c1"].output and "KeyError" in fed["c1"].output
    assert len(bad.calls) == 1
    assert fed["c2"] == ToolReturn("c2", "good", "good ran with []")


# --- require_approval ----------------------------------------------------------------------


async def test_require_approval_suspends_before_the_tool_and_runs_it_once_approved() -> None:
    """A listed tool asks first (kind approval, tool and arguments in data), then runs once."""
    deploy = RecordingTool("deploy")
    asked: list[tuple[Request, int]] = []

    async def wait_for(request: Request) -> Answer:
        asked.append((request, len(deploy.calls)))
        return Answer(request.id, True)

    model = ScriptedModel(reply(tool_call("deploy", {"env": "prod"}, id="c1")), "deployed")
    hooks = Hooks(before_tool=require_approval(["deploy"]))
    result = await run_in_process(model, [deploy], hooks, wait_for=wait_for)

    ((request, runs_before),) = asked
    assert request.kind == "approval"
    assert request.data == {
        "tool": "deploy",
        "arguments": {"env": "prod"},
        "gate": "require_approval",
        "digest": call_digest("deploy", {"env": "prod"}),
    }
    assert runs_before == 0, "the tool ran before it was approved"
    assert deploy.arguments == [{"env": "prod"}]
    assert returns(model.requests[1])["c1"].output == "deploy ran with [('env', 'prod')]"
    assert result.status == "done" and result.tool_calls[0].answered_ok is True
    assert_no_leaks()


async def test_require_approval_declined_never_runs_the_tool() -> None:
    """Declined: the model is told so and the tool never runs."""
    deploy = RecordingTool("deploy")

    async def wait_for(request: Request) -> Answer:
        return Answer(request.id, False, reason="declined")

    model = ScriptedModel(reply(tool_call("deploy", {"env": "prod"}, id="c1")), "ok")
    hooks = Hooks(before_tool=require_approval(["deploy"]))
    result = await run_in_process(model, [deploy], hooks, wait_for=wait_for)

    assert deploy.calls == []
    fed = returns(model.requests[1])["c1"]
    assert fed.is_error and fed.output.startswith("declined/expired: ")
    assert result.status == "done"


async def test_require_approval_leaves_unlisted_tools_alone() -> None:
    """Only listed tools ask; an unlisted one runs at once, without an answer."""
    deploy, read = RecordingTool("deploy"), RecordingTool("read")
    asked: list[Request] = []

    async def wait_for(request: Request) -> Answer:
        asked.append(request)
        return Answer(request.id, True)

    model = ScriptedModel(
        reply(tool_call("read", {"p": "a"}, id="c1"), tool_call("deploy", id="c2")), "ok"
    )
    hooks = Hooks(
        before_tool=require_approval(["deploy"], prompt=lambda name, args: f"Run {name}?")
    )
    await run_in_process(model, [deploy, read], hooks, wait_for=wait_for)

    assert [r.prompt for r in asked] == ["Run deploy?"]
    assert read.arguments == [{"p": "a"}]
    assert read.calls[0][1] is not None and read.calls[0][1].answer is None
    assert len(deploy.calls) == 1


@pytest.mark.parametrize("approve", [True, False])
async def test_require_approval_without_wait_for_halts_and_resume_decides(approve: bool) -> None:
    """No wait_for: the run halts on the approval request; resume runs the tool iff approved."""
    deploy = RecordingTool("deploy")
    model = ScriptedModel(reply(tool_call("deploy", {"env": "prod"}, id="c1")), "finished")
    hooks = Hooks(before_tool=require_approval(["deploy"]))
    with anyio.fail_after(LIMIT):
        async with (
            Toolkit.create(builtins=False, extra_tools=[deploy]) as tk,
            LlmClient.in_process(model, model="scripted", hooks=hooks) as client,
        ):
            halted = await client.run("go", tk)
            assert halted.status == "pending"
            assert halted.pending is not None and halted.pending.kind == "approval"
            assert halted.pending.data == {
                "tool": "deploy",
                "arguments": {"env": "prod"},
                "gate": "require_approval",
                "digest": call_digest("deploy", {"env": "prod"}),
            }
            assert deploy.calls == []
            done = await client.resume(halted, tk, answers=Answer(halted.pending.id, approve))

    assert done.status == "done" and done.text == "finished"
    assert deploy.arguments == ([{"env": "prod"}] if approve else [])
    fed = returns(model.requests[1])["c1"]
    assert fed.is_error is (not approve)
    assert_no_leaks()


async def test_require_approval_in_front_of_a_tool_that_asks_its_own_question() -> None:
    """After the approval, the tool runs without the approval as its answer: its own
    question is asked (one more wait_for) and its answer is what the tool returns."""
    asked: list[str] = []

    async def wait_for(request: Request) -> Answer:
        asked.append(request.kind)
        if request.kind == "approval":
            return Answer(request.id, True)
        return Answer(request.id, True, data={"answers": ["blue"]})

    questions = {"questions": [{"question": "Which colour?", "options": ["red", "blue"]}]}
    model = ScriptedModel(reply(tool_call("question", questions, id="c1")), "noted")
    async with (
        Toolkit.create() as toolkit,
        LlmClient.in_process(
            model, wait_for=wait_for, hooks=Hooks(before_tool=require_approval(["question"]))
        ) as client,
    ):
        result = await client.run("ask me", toolkit)

    assert asked == ["approval", "question"]
    assert returns(model.requests[1])["c1"].output == '{"answers": ["blue"]}'
    assert result.status == "done"


async def test_require_approval_survives_a_halt_then_the_tool_asks_its_own_question() -> None:
    """Halted on the approval and resumed from its JSON form: the approved tool runs without
    the approval as its answer, so its own question is asked (and halts the run again)."""
    questions = {"questions": [{"question": "Which colour?", "options": ["red", "blue"]}]}
    hooks = Hooks(before_tool=require_approval(["question"]))
    async with Toolkit.create() as toolkit:
        model = ScriptedModel(reply(tool_call("question", questions, id="c1")), "noted")
        async with LlmClient.in_process(model, hooks=hooks) as client:
            halted = await client.run("ask me", toolkit)
        assert halted.pending is not None and halted.pending.kind == "approval"
        stored = RunResult.from_dict(json.loads(json.dumps(halted.to_dict())))
        assert stored.pending is not None
        async with LlmClient.in_process(ScriptedModel("unused"), hooks=hooks) as other:
            again = await other.resume(stored, toolkit, answers=Answer(stored.pending.id, True))

    assert again.status == "pending"
    assert again.pending is not None and again.pending.kind == "question"
    assert again.pending.prompt == "Which colour? (options: red, blue)"
