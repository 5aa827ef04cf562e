"""Metric events and ``client.metrics()`` end to end: what ``on_metric`` receives for model
requests, tool calls and runs, how a suspension and a failure are counted, and that a
broken ``on_metric`` cannot break a run. Models are scripted in-process, or played over the
mock transport (``provider``) where the provider's replies matter: usage, statuses."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import pytest

from tests.conftest import FakeProvider, anthropic_reply, assert_no_leaks, openai_reply
from tests.shared import ApprovedPay
from toolnexus_async import (
    Answer,
    Hooks,
    Limits,
    LlmCall,
    LlmCallEvent,
    LlmClient,
    MetricEvent,
    ProviderError,
    Request,
    RetryPolicy,
    RunEvent,
    RunResult,
    RunTimeoutError,
    ToolCallEvent,
    Toolkit,
    define_tool,
)
from toolnexus_async.testing import ScriptedModel, reply, tool_call

LIMIT = 5  # seconds; reached only when something hangs
FAST = RetryPolicy(base_delay=0)


@define_tool
async def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@define_tool
async def explode() -> str:
    """Always fails."""
    raise ValueError("boom")


def of(events: list[MetricEvent], kind: type) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


async def approve(request: Request) -> Answer:
    return Answer(request.id, True)


async def run(client: LlmClient, *tools: Any) -> RunResult:
    with anyio.fail_after(LIMIT):
        async with Toolkit.create(builtins=False, extra_tools=tools) as tk:
            return await client.run("go", tk)


@pytest.mark.parametrize("style", ["openai", "anthropic"])
async def test_one_llm_call_event_per_request_with_model_status_seconds_tokens(
    provider: FakeProvider, style: str
) -> None:
    """Each model request is one LlmCallEvent carrying model, style, status, time, tokens."""
    if style == "openai":
        provider.script(
            openai_reply(
                None,
                [("c1", "add", {"a": 1, "b": 2})],
                {"prompt_tokens": 11, "completion_tokens": 4},
            ),
            openai_reply("3", usage={"prompt_tokens": 20, "completion_tokens": 6}),
        )
    else:
        provider.script(
            anthropic_reply(
                None, [("c1", "add", {"a": 1, "b": 2})], {"input_tokens": 11, "output_tokens": 4}
            ),
            anthropic_reply("3", usage={"input_tokens": 20, "output_tokens": 6}),
        )
    events: list[MetricEvent] = []
    async with provider.client(style, hooks=Hooks(on_metric=events.append)) as client:
        result = await run(client, add)

    assert result.status == "done"
    assert len(provider.requests) == 2
    calls = of(events, LlmCallEvent)
    assert [(e.model, e.style, e.status, e.prompt_tokens, e.completion_tokens) for e in calls] == [
        ("m", style, "ok", 11, 4),
        ("m", style, "ok", 20, 6),
    ]
    assert all(isinstance(e.seconds, float) and e.seconds >= 0 for e in calls)
    assert [type(e) for e in events] == [LlmCallEvent, ToolCallEvent, LlmCallEvent, RunEvent]
    assert_no_leaks()


async def test_tool_call_events_name_tool_source_and_outcome_and_a_suspension_is_pending() -> None:
    """Each tool execution is one ToolCallEvent; a suspension is "pending", never "error"."""
    events: list[MetricEvent] = []
    model = ScriptedModel(
        reply(
            tool_call("add", {"a": 1, "b": 2}, id="c1"),
            tool_call("explode", id="c2"),
            tool_call("pay", id="c3"),
        ),
        "ok",
    )
    with anyio.fail_after(LIMIT):
        async with (
            Toolkit.create(builtins=False, extra_tools=[add, explode, ApprovedPay()]) as tk,
            LlmClient.in_process(
                model, model="scripted", wait_for=approve, hooks=Hooks(on_metric=events.append)
            ) as client,
        ):
            result = await client.run("go", tk)

    assert result.status == "done"
    tools = sorted((e.tool, e.source, e.outcome) for e in of(events, ToolCallEvent))
    assert tools == [
        ("add", "native", "ok"),
        ("explode", "native", "error"),
        ("pay", "custom", "ok"),  # the retry after the approval
        ("pay", "custom", "pending"),  # the suspension
    ]
    assert all(e.seconds >= 0 for e in of(events, ToolCallEvent))
    (run_event,) = of(events, RunEvent)
    assert (run_event.status, run_event.turns, run_event.model) == ("done", 2, "scripted")
    assert events[-1] is run_event


async def test_a_halted_run_is_a_pending_tool_call_and_a_pending_run() -> None:
    """Without wait_for the suspension is "pending" and so is the RunEvent; no "error"."""
    events: list[MetricEvent] = []
    model = ScriptedModel(reply(tool_call("pay", id="c1")))
    with anyio.fail_after(LIMIT):
        async with (
            Toolkit.create(builtins=False, extra_tools=[ApprovedPay()]) as tk,
            LlmClient.in_process(
                model, model="scripted", hooks=Hooks(on_metric=events.append)
            ) as client,
        ):
            result = await client.run("go", tk)
            text = client.metrics()

    assert result.status == "pending"
    assert [(e.tool, e.outcome) for e in of(events, ToolCallEvent)] == [("pay", "pending")]
    assert [e.status for e in of(events, RunEvent)] == ["pending"]
    assert 'toolnexus_tool_calls_total{tool="pay",source="custom",outcome="pending"} 1' in text
    assert 'outcome="error"' not in text


async def test_failed_attempts_are_error_events_and_a_failed_run_an_error_run(
    provider: FakeProvider,
) -> None:
    """Each failed attempt is an "error" LlmCallEvent; a run that raises is an "error" run."""
    provider.handler = lambda body, seen: (503, {"error": {"message": "busy"}})
    events: list[MetricEvent] = []
    client = provider.client(retry=FAST, hooks=Hooks(on_metric=events.append))
    async with client:
        with pytest.raises(ProviderError):
            await run(client)

    calls = of(events, LlmCallEvent)
    assert [(e.status, e.error) for e in calls] == [("error", "ProviderError")] * 3
    assert [(e.status, e.turns) for e in of(events, RunEvent)] == [("error", 0)]


async def test_a_retried_request_counts_one_error_and_one_ok(provider: FakeProvider) -> None:
    """503 then 200: an "error" event for the failed attempt, then an "ok" one."""
    provider.script((503, {"error": {"message": "busy"}}), openai_reply("fine"))
    events: list[MetricEvent] = []
    client = provider.client(retry=FAST, hooks=Hooks(on_metric=events.append))
    async with client:
        result = await run(client)

    assert result.status == "done"
    assert [e.status for e in of(events, LlmCallEvent)] == ["error", "ok"]
    assert [e.status for e in of(events, RunEvent)] == ["done"]


async def test_a_timed_out_run_is_an_error_run() -> None:
    """A run cut off by its timeout still reports one RunEvent, with status "error"."""

    async def stuck(messages: list[Any], tools: list[Any]) -> str:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    events: list[MetricEvent] = []
    client = LlmClient.in_process(
        stuck, limits=Limits(timeout=0.05), hooks=Hooks(on_metric=events.append)
    )
    async with client:
        with pytest.raises(RunTimeoutError):
            await run(client)
    assert [e.status for e in of(events, RunEvent)] == ["error"]


async def test_metrics_renders_prometheus_text(provider: FakeProvider) -> None:
    """client.metrics(): request, token, tool and run counters and duration histograms."""
    provider.script(
        (500, {"error": {"message": "oops"}}),
        openai_reply(
            None,
            [("c1", "add", {"a": 1, "b": 2}), ("c2", "pay", {})],
            {"prompt_tokens": 10, "completion_tokens": 2},
        ),
        openai_reply("done", usage={"prompt_tokens": 21, "completion_tokens": 3}),
    )
    client = provider.client(retry=FAST, wait_for=approve)
    async with client:
        await run(client, add, ApprovedPay())
        text = client.metrics()
    other = LlmClient.in_process(ScriptedModel("hi"))

    lines = set(text.splitlines())
    for line in (
        "# TYPE toolnexus_llm_requests_total counter",
        'toolnexus_llm_requests_total{model="m",status="ok"} 2',
        'toolnexus_llm_requests_total{model="m",status="error"} 1',
        'toolnexus_llm_tokens_total{model="m",kind="prompt"} 31',
        'toolnexus_llm_tokens_total{model="m",kind="completion"} 5',
        'toolnexus_tool_calls_total{tool="add",source="native",outcome="ok"} 1',
        'toolnexus_tool_calls_total{tool="pay",source="custom",outcome="pending"} 1',
        'toolnexus_tool_calls_total{tool="pay",source="custom",outcome="ok"} 1',
        'toolnexus_runs_total{status="done"} 1',
        "# TYPE toolnexus_llm_request_duration_seconds histogram",
        'toolnexus_llm_request_duration_seconds_count{model="m"} 3',
        'toolnexus_llm_request_duration_seconds_bucket{model="m",le="+Inf"} 3',
        'toolnexus_tool_duration_seconds_count{tool="add"} 1',
        "toolnexus_run_duration_seconds_count 1",
    ):
        assert line in lines, f"missing {line!r} in:\n{text}"
    assert "toolnexus_runs_total{" not in other.metrics(), "each client counts its own runs"


async def test_a_raising_on_metric_does_not_break_the_run(caplog: pytest.LogCaptureFixture) -> None:
    """on_metric raising at every event: the run completes and metrics() still counts."""

    def broken(event: MetricEvent) -> None:
        raise RuntimeError("dashboard down")

    model = ScriptedModel(
        reply(tool_call("add", {"a": 2, "b": 2}, id="c1"), tool_call("pay", id="c2")), "4"
    )
    with anyio.fail_after(LIMIT), caplog.at_level(logging.ERROR, logger="toolnexus_async"):
        async with (
            Toolkit.create(builtins=False, extra_tools=[add, ApprovedPay()]) as tk,
            LlmClient.in_process(
                model, model="scripted", wait_for=approve, hooks=Hooks(on_metric=broken)
            ) as client,
        ):
            result = await client.run("go", tk)
            text = client.metrics()

    assert result.status == "done" and result.text == "4"
    assert 'toolnexus_runs_total{status="done"} 1' in text
    assert 'toolnexus_tool_calls_total{tool="add",source="native",outcome="ok"} 1' in text
    assert any("on_metric" in r.getMessage() for r in caplog.records)
    assert_no_leaks()


async def test_a_tool_added_by_before_llm_reports_its_own_source() -> None:
    """A tool that before_llm put in the run is reported with its source, not "unknown"."""

    def swap(call: LlmCall) -> LlmCall:
        return LlmCall(call.messages, [ApprovedPay()])

    events: list[MetricEvent] = []
    model = ScriptedModel(reply(tool_call("pay", id="c1")), "ok")
    with anyio.fail_after(LIMIT):
        async with (
            Toolkit.create(builtins=False, extra_tools=[add]) as tk,
            LlmClient.in_process(
                model,
                model="scripted",
                wait_for=approve,
                hooks=Hooks(before_llm=swap, on_metric=events.append),
            ) as client,
        ):
            result = await client.run("go", tk)

    assert result.status == "done"
    assert sorted((e.tool, e.source) for e in of(events, ToolCallEvent)) == [
        ("pay", "custom"),
        ("pay", "custom"),
    ]


async def test_a_call_with_unparseable_arguments_is_counted_as_a_tool_error(
    provider: FakeProvider,
) -> None:
    """A call whose arguments are not JSON is still a tool call: one "error" ToolCallEvent,
    as a call whose arguments fail the schema is."""
    provider.script(
        openai_reply(None, [("c1", "add", "{not json"), ("c2", "add", {"a": "x"})]),
        openai_reply("sorry"),
    )
    events: list[MetricEvent] = []
    async with provider.client(hooks=Hooks(on_metric=events.append)) as client:
        result = await run(client, add)

    assert [r.result.is_error for r in result.tool_calls] == [True, True]
    assert [(e.tool, e.outcome) for e in of(events, ToolCallEvent)] == [
        ("add", "error"),
        ("add", "error"),
    ]
