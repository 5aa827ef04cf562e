"""Durable halt and resume: RunResult's JSON form, client.resume and run_with_answer."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import FakeProvider, assert_no_leaks, openai_reply
from tests.shared import Ledger, final_from_results
from toolnexus_async import (
    AlreadyResumedError,
    Answer,
    AnswerMismatchError,
    AssistantMessage,
    LlmClient,
    Message,
    PayloadError,
    Request,
    RunResult,
    ToolContext,
    Toolkit,
    ToolResult,
    ToolReturn,
    UsageError,
    UserMessage,
    define_tool,
)
from toolnexus_async.testing import ScriptedModel, reply, tool_call


def three_calls() -> AssistantMessage:
    return reply(
        tool_call("lookup", {"invoice": "INV-1"}, id="c1"),
        tool_call("pay", {"amount": 30}, id="c2"),
        tool_call("notify", id="c3"),
    )


async def halt(ledger: Ledger, toolkit: Toolkit) -> RunResult:
    model = ScriptedModel(three_calls())
    async with LlmClient.in_process(model, model="m") as client:
        return await client.run("pay INV-1", toolkit)


async def test_halted_run_keeps_every_outstanding_call():
    """The halted result lists both suspended calls, the completed result is in messages."""
    ledger = Ledger()
    halted = await halt(ledger, ledger.toolkit())

    assert halted.status == "pending"
    assert [r.call.id for r in halted.suspended] == ["c2", "c3"]
    assert halted.pending == halted.suspended[0].request
    assert halted.messages[-1] == ToolReturn("c1", "lookup", "INV-1: 30 EUR")
    assert ledger.looked_up == 1


async def test_to_dict_round_trips_through_json():
    """from_dict(json(to_dict())) gives back an equal RunResult, requests included."""
    ledger = Ledger()
    halted = await halt(ledger, ledger.toolkit())

    text = json.dumps(halted.to_dict())
    again = RunResult.from_dict(json.loads(text))

    assert again == halted
    assert RunResult.from_dict(text) == halted
    stored = json.loads(text)
    assert stored["version"] == 2
    assert RunResult.from_dict({**stored, "version": 1}) == halted  # stored by the last release
    assert stored["style"] == "in-process"
    assert stored["model"] == "m"
    assert [s["call_id"] for s in stored["suspended"]] == ["c2", "c3"]
    assert stored["suspended"][0]["tool"] == "pay"
    assert stored["suspended"][0]["arguments"] == {"amount": 30}
    assert stored["suspended"][0]["request"]["kind"] == "approval"


async def test_resume_after_a_json_round_trip_never_repeats_a_completed_call():
    """Resumed from its JSON form, the run re-executes only the answered and open calls."""
    ledger = Ledger()
    toolkit = ledger.toolkit()
    halted = RunResult.from_dict(json.loads(json.dumps((await halt(ledger, toolkit)).to_dict())))
    pay_request = halted.suspended[0].request
    notify_request = halted.suspended[1].request
    assert pay_request is not None and notify_request is not None

    model = ScriptedModel(final_from_results)
    async with LlmClient.in_process(model) as client:
        result = await client.resume(
            halted,
            toolkit,
            answers=[
                Answer(pay_request.id, True),
                Answer(notify_request.id, True, data={"who": "Ann"}),
            ],
        )

    assert result.status == "done"
    assert result.text == "c1=INV-1: 30 EUR | c2=paid 30 | c3=notified Ann"
    assert ledger.looked_up == 1
    assert ledger.paid == [30]
    assert result.run_id == halted.run_id
    assert result.turns == 2


async def test_a_resumed_call_is_told_the_request_its_answer_answers():
    """After a JSON round trip, the retried tool gets ctx.request: the request it asked."""
    seen: list[ToolContext | None] = []

    @define_tool
    async def pay(amount: int, ctx: ToolContext | None = None) -> ToolResult:
        """Pay after approval."""
        seen.append(ctx)
        if ctx is None or ctx.answer is None:
            return ToolResult.pending(Request("", "approval", "Pay?", data={"amount": amount}))
        return ToolResult.ok("paid")

    async with Toolkit.create(builtins=False, extra_tools=[pay]) as toolkit:
        model = ScriptedModel(reply(tool_call("pay", {"amount": 5}, id="c1")), "done")
        async with LlmClient.in_process(model) as client:
            halted = await client.run("pay", toolkit)
            stored = RunResult.from_dict(json.loads(json.dumps(halted.to_dict())))
            assert stored.pending is not None
            result = await client.resume(stored, toolkit, answers=Answer(stored.pending.id, True))

    assert result.status == "done"
    retry = seen[-1]
    assert retry is not None and retry.request == stored.pending
    assert retry.request.data == {"amount": 5}


async def test_resume_sends_one_result_per_call_and_no_new_user_turn():
    """After a resume the model sees exactly one result per call of the halted turn."""
    ledger = Ledger()
    toolkit = ledger.toolkit()
    halted = await halt(ledger, toolkit)
    request = halted.suspended[0].request
    assert request is not None
    seen: list[list[Message]] = []

    def model(messages: list[Message], tools: list[Any]) -> str:
        seen.append(messages)
        return "ok"

    wait_for_calls: list[Request] = []

    async def wait_for(r: Request) -> Answer:
        wait_for_calls.append(r)
        return Answer(r.id, True, data={"who": "Bo"})

    async with LlmClient.in_process(model, wait_for=wait_for) as client:
        await client.resume(halted, toolkit, answers=Answer(request.id, True))

    sent = seen[0]
    assert sum(isinstance(m, UserMessage) for m in sent) == 1
    tail = [m for m in sent if isinstance(m, ToolReturn)]
    assert [(r.call_id, r.output) for r in tail] == [
        ("c1", "INV-1: 30 EUR"),
        ("c2", "paid 30"),
        ("c3", "notified Bo"),
    ]
    # The unanswered call suspended again and this client's wait_for resolved it.
    assert [r.kind for r in wait_for_calls] == ["input"]


async def test_an_open_call_that_suspends_again_halts_again_on_the_first():
    """Answering only the second request: the first (still open) suspends again and wins."""
    ledger = Ledger()
    toolkit = ledger.toolkit()
    halted = await halt(ledger, toolkit)
    second = halted.suspended[1].request
    assert second is not None

    async with LlmClient.in_process(ScriptedModel()) as client:
        again = await client.resume(
            halted, toolkit, answers=Answer(second.id, True, data={"who": "Cy"})
        )

    assert again.status == "pending"
    assert again.pending is not None and again.pending.kind == "approval"
    assert [r.call.id for r in again.suspended] == ["c2"]
    assert again.messages[-2:] == (
        ToolReturn("c1", "lookup", "INV-1: 30 EUR"),
        ToolReturn("c3", "notify", "notified Cy"),
    )
    assert ledger.paid == []
    assert ledger.looked_up == 1


async def test_a_declined_answer_on_resume_is_reported_to_the_model():
    """A refusal gives the model 'declined/expired: <prompt>' and the call does not run."""
    ledger = Ledger()
    toolkit = ledger.toolkit()
    halted = await halt(ledger, toolkit)
    pay_request = halted.suspended[0].request
    notify_request = halted.suspended[1].request
    assert pay_request is not None and notify_request is not None

    async with LlmClient.in_process(ScriptedModel(final_from_results)) as client:
        result = await client.resume(
            halted,
            toolkit,
            answers=[
                Answer(pay_request.id, False, reason="declined"),
                Answer(notify_request.id, True, data={"who": "Di"}),
            ],
        )

    assert "c2=declined/expired: Pay 30 EUR?" in result.text
    assert ledger.paid == []


async def test_an_answer_with_a_foreign_id_is_refused_and_nothing_runs():
    """AnswerMismatchError, and not one tool executed again."""
    ledger = Ledger()
    toolkit = ledger.toolkit()
    halted = await halt(ledger, toolkit)
    model = ScriptedModel()

    async with LlmClient.in_process(model) as client:
        with pytest.raises(AnswerMismatchError, match="nope") as caught:
            await client.resume(halted, toolkit, answers=Answer("nope", True))

    assert caught.value.request_id == "nope"
    assert isinstance(caught.value, LookupError)
    assert model.requests == []
    assert ledger.looked_up == 1


async def test_only_a_halted_run_can_be_resumed():
    """Resuming a finished run is a usage error."""
    async with LlmClient.in_process(ScriptedModel("done")) as client:
        done = await client.run("hi", Toolkit.create(builtins=False))
        with pytest.raises(UsageError, match="halted"):
            await client.resume(done, Toolkit.create(builtins=False), answers=Answer("x", True))


async def test_run_with_answer_needs_only_the_transcript_and_the_pending_request():
    """The other ports' entry point: history + pending + answer, no RunResult."""
    ledger = Ledger()
    toolkit = ledger.toolkit()
    halted = await halt(ledger, toolkit)
    assert halted.pending is not None
    history = list(halted.messages)

    async def wait_for(r: Request) -> Answer:
        return Answer(r.id, True, data={"who": "Ed"})

    async with LlmClient.in_process(ScriptedModel(final_from_results), wait_for=wait_for) as client:
        result = await client.run_with_answer(
            history, toolkit, pending=halted.pending, answer=Answer(halted.pending.id, True)
        )
        with pytest.raises(AnswerMismatchError):
            await client.run_with_answer(
                history, toolkit, pending=halted.pending, answer=Answer("someone-else", True)
            )

    assert result.status == "done"
    assert result.text == "c1=INV-1: 30 EUR | c2=paid 30 | c3=notified Ed"
    assert ledger.paid == [30]
    assert ledger.looked_up == 1


async def test_run_with_answer_refuses_a_transcript_that_did_not_halt():
    """A finished transcript has nothing to resume."""
    async with LlmClient.in_process(ScriptedModel()) as client:
        with pytest.raises(UsageError, match="not a halted run"):
            await client.run_with_answer(
                [UserMessage("hi"), AssistantMessage("hello")],
                Toolkit.create(builtins=False),
                pending=Request("r", "approval", "?"),
                answer=Answer("r", True),
            )


async def test_a_conversation_halted_on_openai_resumes_against_anthropic(provider: FakeProvider):
    """The stored run is provider-neutral: another style can finish it."""
    ledger = Ledger()
    toolkit = ledger.toolkit()

    def handler(body: dict[str, Any], seen: Any) -> dict[str, Any]:
        if seen.path.endswith("/chat/completions"):
            return openai_reply(None, [("c1", "pay", {"amount": 5})])
        results = [
            block
            for message in body["messages"]
            if isinstance(message["content"], list)
            for block in message["content"]
            if block.get("type") == "tool_result"
        ]
        return {"content": [{"type": "text", "text": results[0]["content"]}]}

    provider.handler = handler
    async with provider.client(model="gpt", base_url=f"{provider.url}/v1") as openai:
        halted = await openai.run("pay 5", toolkit)
    stored = json.dumps(halted.to_dict())
    halted = RunResult.from_dict(stored)
    assert halted.pending is not None
    async with provider.client("anthropic", "claude") as claude:
        result = await claude.resume(halted, toolkit, answers=Answer(halted.pending.id, True))

    assert result.text == "paid 5"
    assert result.style == "anthropic"
    assert [seen.path for seen in provider.requests] == ["/v1/chat/completions", "/v1/messages"]
    assert ledger.paid == [5]
    assert_no_leaks()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(version=3), "version"),
        (lambda d: d.update(version=True), "version"),
        (lambda d: d.update(status="paused"), "status"),
        (lambda d: d.update(turns="2"), "turns"),
        (lambda d: d["suspended"][0].pop("request"), "suspended"),
        (lambda d: d["messages"].append({"role": "robot"}), "role"),
        (lambda d: d["tool_calls"][0].update(turn=None), "turn"),
    ],
)
async def test_from_dict_names_what_is_wrong(change: Any, message: str):
    """A malformed stored run is a PayloadError naming the fault, never a KeyError."""
    ledger = Ledger()
    payload = (await halt(ledger, ledger.toolkit())).to_dict()
    change(payload)

    with pytest.raises(PayloadError, match=message):
        RunResult.from_dict(payload)


def test_from_dict_refuses_non_json():
    """Text that is not JSON is a PayloadError."""
    with pytest.raises(PayloadError, match="not valid JSON"):
        RunResult.from_dict("{oops")


async def test_metadata_that_is_not_json_is_refused_by_to_dict():
    """A result whose metadata cannot be stored is refused loudly, not dropped."""

    @define_tool
    async def odd() -> ToolResult:
        """Return odd metadata."""
        return ToolResult.ok("x", metadata={"when": object()})

    toolkit = Toolkit.create(builtins=False, extra_tools=[odd])
    async with LlmClient.in_process(ScriptedModel(reply(tool_call("odd")), "fine")) as client:
        result = await client.run("go", toolkit)

    with pytest.raises(PayloadError, match="metadata"):
        result.to_dict()


def test_already_resumed_is_an_answer_error():
    """The store's refusal shares the AnswerError base with the Inbox errors."""
    error = AlreadyResumedError("r1", "request 'r1' was resumed already")
    assert isinstance(error, LookupError)
    assert error.request_id == "r1"


async def test_a_late_yes_to_an_expired_request_counts_as_expired():
    """Resuming with ok=True for a request whose expires_at passed: the tool does not run."""
    ran: list[str] = []

    @define_tool
    async def pay(ctx: ToolContext | None = None) -> ToolResult:
        """Pay; the approval must come in time."""
        if ctx is None or ctx.answer is None:
            return ToolResult.pending(
                Request("", "approval", "Pay?", expires_at="2999-01-01T00:00:00Z")
            )
        ran.append("paid")
        return ToolResult.ok("paid")

    toolkit = Toolkit.create(builtins=False, extra_tools=[pay])
    async with LlmClient.in_process(ScriptedModel(reply(tool_call("pay", id="c1")))) as client:
        halted = await client.run("pay", toolkit)
    payload = halted.to_dict()
    # The request expired while the run sat in storage.
    payload["suspended"][0]["request"]["expiresAt"] = "2000-01-01T00:00:00Z"
    stale = RunResult.from_dict(payload)
    assert stale.suspended[0].request is not None
    late_yes = Answer(stale.suspended[0].request.id, True)

    async with LlmClient.in_process(ScriptedModel(final_from_results)) as client:
        result = await client.resume(stale, toolkit, answers=late_yes)

    assert result.text == "c1=declined/expired: Pay?"
    assert ran == []


async def test_resume_needs_at_least_one_answer():
    """An empty answer list is refused rather than silently re-running the calls."""
    ledger = Ledger()
    toolkit = ledger.toolkit()
    halted = await halt(ledger, toolkit)
    async with LlmClient.in_process(ScriptedModel()) as client:
        with pytest.raises(UsageError, match="at least one answer"):
            await client.resume(halted, toolkit, answers=[])
    assert ledger.looked_up == 1


@pytest.mark.parametrize(
    ("answers", "message"),
    [
        (True, r"takes an Answer or a list of Answers as answers, got bool True: build one"),
        ({"id": "r", "ok": True}, r"got dict \{'id': 'r', 'ok': True\}.*Answer.from_dict"),
        ([True], r"got a bool among them"),
    ],
)
async def test_answers_that_are_not_answers_say_what_was_expected(answers: Any, message: str):
    ledger = Ledger()
    toolkit = ledger.toolkit()
    halted = await halt(ledger, toolkit)
    async with LlmClient.in_process(ScriptedModel()) as client:
        with pytest.raises(UsageError, match=message):
            await client.resume(halted, toolkit, answers=answers)
    assert ledger.looked_up == 1


async def test_the_answers_are_named_so_they_cannot_be_swapped():
    """``resume(halted, toolkit, *, answers=...)``: the issue's ``resume(halted, True,
    toolkit)`` fails when called, before anything runs, without a check of the library's."""
    ledger = Ledger()
    toolkit = ledger.toolkit()
    halted = await halt(ledger, toolkit)
    async with LlmClient.in_process(ScriptedModel()) as client:
        with pytest.raises(TypeError, match="positional argument"):
            await client.resume(halted, True, toolkit)  # type: ignore[call-overload]
        with pytest.raises(TypeError, match="answers"):
            await client.resume(halted, toolkit)  # type: ignore[call-overload]
    assert ledger.looked_up == 1
