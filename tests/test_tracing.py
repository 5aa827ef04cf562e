"""OpenTelemetry traces of runs, read back through the SDK's in-memory exporter.

A run is an ``invoke_agent`` span; its model requests, tool executions and waits for a
person are its children, with the GenAI conventions' attributes and ours under
``toolnexus.*``. Contents only when asked; the key and header values never.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from aiohttp import web
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from tests.conftest import assert_no_leaks
from tests.shared import loopback
from toolnexus_async import (
    Answer,
    Inbox,
    LlmClient,
    Message,
    ModelReply,
    ProviderError,
    Request,
    RetryPolicy,
    RunResult,
    ToolContext,
    Toolkit,
    ToolResult,
    ToolReturn,
    Tracing,
    Usage,
    UsageError,
    define_tool,
)
from toolnexus_async.durable import DurableHost, MemoryRunStore
from toolnexus_async.testing import reply, tool_call

LIMIT = 10


class Spans:
    """A tracer provider whose finished spans are kept in memory."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def tracing(self, **options: Any) -> Tracing:
        return Tracing(tracer_provider=self.provider, **options)

    @property
    def finished(self) -> tuple[ReadableSpan, ...]:
        return self.exporter.get_finished_spans()

    def named(self, prefix: str) -> list[ReadableSpan]:
        return [span for span in self.finished if span.name.startswith(prefix)]

    def one(self, prefix: str) -> ReadableSpan:
        (span,) = self.named(prefix)
        return span


@pytest.fixture
def spans() -> Iterator[Spans]:
    kept = Spans()
    yield kept
    kept.provider.shutdown()


async def wait_until(predicate: Any) -> None:
    while not predicate():
        await anyio.lowlevel.checkpoint()


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def everything_in(span: ReadableSpan) -> str:
    """Every string a span carries: name, attributes, events, links, status."""
    parts: list[Any] = [span.name, attributes(span), span.status.description]
    parts += [(event.name, dict(event.attributes or {})) for event in span.events]
    parts += [dict(link.attributes or {}) for link in span.links]
    return json.dumps(parts, default=str)


@define_tool
async def weather(city: str) -> str:
    """The weather in a city."""
    return f"{city}: sunny"


def asking(name: str) -> Any:
    @define_tool(name=name)
    async def step(table: str, ctx: ToolContext | None = None) -> ToolResult:
        """A step a person approves first."""
        if ctx is None or ctx.answer is None:
            return ToolResult.pending(Request("", "approval", f"{name} {table}?"))
        return ToolResult.ok(f"{name} {table}: done")

    return step


def trip_model(messages: list[Message], tools: list[Any]) -> Any:
    """Turn 1: two weather calls at once; turn 2: a refund and a wipe, each to approve;
    then the results as the final text. Each reply reports usage as a provider would."""
    returns = [m.output for m in messages if isinstance(m, ToolReturn)]
    if not returns:
        calls = reply(
            None,
            tool_call("weather", {"city": "Paris"}, id="c_paris"),
            tool_call("weather", {"city": "Oslo"}, id="c_oslo"),
        )
        usage = Usage(120, 30, 150, cache_read_tokens=100, reasoning_tokens=12)
        return ModelReply(calls, usage, model="m-1", stop_reason="tool_calls", raw={"id": "r1"})
    if len(returns) == 2:
        calls = reply(
            None,
            tool_call("refund", {"table": "orders"}, id="c_refund"),
            tool_call("wipe", {"table": "users"}, id="c_wipe"),
        )
        usage = Usage(200, 20, 220, cache_write_tokens=40)
        return ModelReply(calls, usage, model="m-1", stop_reason="tool_calls", raw={"id": "r2"})
    return ModelReply(
        reply(" | ".join(returns)), Usage(300, 10, 310), model="m-1", raw={"id": "r3"}
    )


def trip_toolkit() -> Toolkit:
    return Toolkit.create(builtins=False, extra_tools=[weather, asking("refund"), asking("wipe")])


async def run_trip(client: LlmClient, inbox: Inbox) -> RunResult:
    """The trip through ``inbox``: the refund approved, the wipe declined."""
    results: list[RunResult] = []

    async def run() -> None:
        results.append(await client.run("Plan it", trip_toolkit()))

    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await wait_until(lambda: len(inbox) == 2)
            refund, wipe = sorted(inbox.pending(), key=lambda r: r.prompt)
            await inbox.answer(Answer(refund.id, True))
            await inbox.answer(Answer(wipe.id, False, reason="declined"))
    return results[0]


async def test_a_run_is_a_tree_of_spans_with_the_conventions_attributes(spans: Spans) -> None:
    inbox = Inbox()
    async with LlmClient.in_process(
        trip_model, model="m-1", wait_for=inbox, tracing=spans.tracing()
    ) as client:
        result = await run_trip(client, inbox)
    assert result.text == (
        "Paris: sunny | Oslo: sunny | refund orders: done | declined/expired: wipe users?"
    )
    run = spans.one("invoke_agent")
    assert run.parent is None
    trace_id = run.context.trace_id
    children = [span for span in spans.finished if span is not run]
    # Every other span is the run's child, in its trace.
    assert {span.context.trace_id for span in children} == {trace_id}
    assert {span.parent.span_id for span in children if span.parent} == {run.context.span_id}
    assert all(span.parent is not None for span in children)

    assert attributes(run) == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.provider.name": "toolnexus.in-process",
        "gen_ai.request.model": "m-1",
        "toolnexus.run.id": result.run_id,
        "toolnexus.run.resumed": False,
        "toolnexus.run.status": "done",
        "toolnexus.run.turns": 3,
        "gen_ai.usage.input_tokens": 620,
        "gen_ai.usage.output_tokens": 60,
        "gen_ai.response.model": "m-1",
    }
    assert result.trace_context is not None
    assert result.trace_context["traceparent"].split("-")[1] == f"{trace_id:032x}"

    first, second, third = spans.named("chat ")
    assert first.name == "chat m-1"
    assert attributes(first) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "toolnexus.in-process",
        "gen_ai.request.model": "m-1",
        "gen_ai.response.model": "m-1",
        "gen_ai.response.id": "r1",
        "gen_ai.response.finish_reasons": ("tool_calls",),
        "gen_ai.usage.input_tokens": 120,
        "gen_ai.usage.output_tokens": 30,
        "gen_ai.usage.cache_read.input_tokens": 100,
        "gen_ai.usage.reasoning.output_tokens": 12,
    }
    assert attributes(second)["gen_ai.usage.cache_creation.input_tokens"] == 40
    assert attributes(third)["gen_ai.response.id"] == "r3"

    executions = [
        (
            span.name,
            attributes(span)["gen_ai.tool.call.id"],
            attributes(span)["toolnexus.tool.outcome"],
        )
        for span in spans.named("execute_tool ")
    ]
    # The weather calls ran side by side; refund and wipe suspended, refund ran again.
    assert sorted(executions) == [
        ("execute_tool refund", "c_refund", "ok"),
        ("execute_tool refund", "c_refund", "pending"),
        ("execute_tool weather", "c_oslo", "ok"),
        ("execute_tool weather", "c_paris", "ok"),
        ("execute_tool wipe", "c_wipe", "pending"),
    ]
    paris = next(s for s in spans.named("execute_tool weather") if "c_paris" in everything_in(s))
    assert attributes(paris)["gen_ai.operation.name"] == "execute_tool"
    assert attributes(paris)["gen_ai.tool.name"] == "weather"
    assert attributes(paris)["gen_ai.tool.type"] == "function"
    assert attributes(paris)["toolnexus.tool.source"] == "native"

    waits = {attributes(span)["toolnexus.tool.name"]: span for span in spans.named("wait ")}
    assert sorted(waits) == ["refund", "wipe"]
    refund, wipe = waits["refund"], waits["wipe"]
    assert refund.name == "wait approval"
    refund_asked = next(
        s for s in spans.named("execute_tool refund") if "pending" in everything_in(s)
    )
    assert attributes(refund) == {
        "toolnexus.request.id": attributes(refund_asked)["toolnexus.request.id"],
        "toolnexus.request.kind": "approval",
        "toolnexus.tool.name": "refund",
        "toolnexus.tool.call.id": "c_refund",
        "toolnexus.wait.outcome": "approved",
        "toolnexus.wait.seconds": attributes(refund)["toolnexus.wait.seconds"],
    }
    assert attributes(refund)["toolnexus.wait.seconds"] >= 0
    assert attributes(wipe)["toolnexus.wait.outcome"] == "declined"
    assert attributes(wipe)["toolnexus.answer.reason"] == "declined"
    assert attributes(wipe)["toolnexus.tool.call.id"] == "c_wipe"
    # Both were outstanding at once: each wait began before the other ended.
    assert refund.start_time is not None and wipe.start_time is not None
    assert refund.end_time is not None and wipe.end_time is not None
    assert refund.start_time < wipe.end_time and wipe.start_time < refund.end_time
    # No contents unless asked for.
    assert not any("Plan it" in everything_in(span) for span in spans.finished)
    assert not any("sunny" in everything_in(span) for span in spans.finished)
    assert_no_leaks()


async def test_contents_are_on_the_spans_only_when_asked(
    spans: Spans, monkeypatch: pytest.MonkeyPatch
) -> None:
    inbox = Inbox()
    async with LlmClient.in_process(
        trip_model, wait_for=inbox, tracing=spans.tracing(capture_content=True)
    ) as client:
        await run_trip(client, inbox)
    first = attributes(spans.named("chat ")[0])
    assert json.loads(first["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": "Plan it"}]}
    ]
    (output,) = json.loads(first["gen_ai.output.messages"])
    assert output["role"] == "assistant" and output["finish_reason"] == "tool_calls"
    assert output["parts"][0] == {
        "type": "tool_call",
        "id": "c_paris",
        "name": "weather",
        "arguments": {"city": "Paris"},
    }
    paris = next(s for s in spans.named("execute_tool weather") if "c_paris" in everything_in(s))
    assert json.loads(attributes(paris)["gen_ai.tool.call.arguments"]) == {"city": "Paris"}
    assert attributes(paris)["gen_ai.tool.call.result"] == "Paris: sunny"
    waits = spans.named("wait ")
    assert {attributes(w)["toolnexus.request.prompt"] for w in waits} == {
        "refund orders?",
        "wipe users?",
    }

    # The conventions' environment variable turns it on too; the option wins over it.
    spans.exporter.clear()
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    async with LlmClient.in_process(lambda m, t: "hi", tracing=spans.tracing()) as client:
        await client.run("hello there", Toolkit.create(builtins=False))
    assert "hello there" in attributes(spans.one("chat "))["gen_ai.input.messages"]
    spans.exporter.clear()
    async with LlmClient.in_process(
        lambda m, t: "hi", tracing=spans.tracing(capture_content=False)
    ) as client:
        await client.run("hello there", Toolkit.create(builtins=False))
    assert "gen_ai.input.messages" not in attributes(spans.one("chat "))


@define_tool
async def boom(table: str) -> str:
    """Always fails."""
    raise ValueError(f"database is on fire ({table})")


def boom_model(messages: list[Message], tools: list[Any]) -> Any:
    if isinstance(messages[-1], ToolReturn):
        return messages[-1].output
    return reply(None, tool_call("boom", {"table": "users"}, id="c_boom"))


async def test_a_raising_tool_records_its_exception_on_its_span(spans: Spans) -> None:
    toolkit = Toolkit.create(builtins=False, extra_tools=[boom])
    async with LlmClient.in_process(boom_model, tracing=spans.tracing()) as client:
        result = await client.run("go", toolkit)
    assert result.status == "done"
    assert result.text == "tool 'boom' raised ValueError: database is on fire (users)"
    failed = spans.one("execute_tool boom")
    assert failed.status.status_code is StatusCode.ERROR
    assert attributes(failed)["error.type"] == "ValueError"
    assert attributes(failed)["toolnexus.tool.outcome"] == "error"
    (event,) = failed.events
    assert event.name == "exception"
    event_attributes = dict(event.attributes or {})
    assert event_attributes["exception.type"] == "ValueError"
    assert "database is on fire" in str(event_attributes["exception.stacktrace"])
    assert 'raise ValueError(f"database is on fire' in str(event_attributes["exception.stacktrace"])


async def test_a_failed_model_request_is_an_error_span_and_the_run_records_it(
    spans: Spans,
) -> None:
    def refuse(messages: list[Message], tools: list[Any]) -> Any:
        raise ProviderError(400, "bad request", "https://llm.example.com/v1/chat/completions")

    async with LlmClient.in_process(
        refuse, tracing=spans.tracing(), retry=RetryPolicy(retries=0)
    ) as client:
        with pytest.raises(ProviderError):
            await client.run("go", Toolkit.create(builtins=False))
    chat, run = spans.one("chat "), spans.one("invoke_agent")
    for span in (chat, run):
        assert span.status.status_code is StatusCode.ERROR
        assert attributes(span)["error.type"] == "ProviderError"
    assert chat.parent is not None and chat.parent.span_id == run.context.span_id


async def test_an_ambient_span_is_the_runs_parent(spans: Spans) -> None:
    """A run inside the application's own span (a web request's) joins its trace."""
    tracer = spans.provider.get_tracer("app")
    async with LlmClient.in_process(lambda m, t: "hi", tracing=spans.tracing()) as client:
        with tracer.start_as_current_span("POST /ask") as outer:
            await client.run("hi", Toolkit.create(builtins=False))
    run = spans.one("invoke_agent")
    assert run.parent is not None and run.parent.span_id == outer.get_span_context().span_id


async def test_a_halted_run_resumed_in_process_continues_its_trace(spans: Spans) -> None:
    toolkit = Toolkit.create(builtins=False, extra_tools=[asking("refund")])
    model = lambda m, t: (  # noqa: E731
        m[-1].output
        if isinstance(m[-1], ToolReturn)
        else reply(None, tool_call("refund", {"table": "t"}, id="c1"))
    )
    async with LlmClient.in_process(model, tracing=spans.tracing()) as client:
        halted = await client.run("go", toolkit)
        assert halted.status == "pending" and halted.trace_context is not None
        assert int(halted.trace_context["suspended_at"]) > 0 and halted.pending is not None
        # The trace context travels in the run's JSON form, as a store keeps it.
        stored = RunResult.from_dict(json.loads(json.dumps(halted.to_dict())))
        assert stored.trace_context == halted.trace_context
        assert stored == halted
        done = await client.resume(stored, toolkit, answers=Answer(halted.pending.id, True))
    assert done.text == "refund t: done"
    first, second = spans.named("invoke_agent")
    assert attributes(first)["toolnexus.run.status"] == "pending"
    assert [e.name for e in first.events] == ["toolnexus.halted"]
    assert second.context.trace_id == first.context.trace_id
    assert second.parent is not None and second.parent.span_id == first.context.span_id
    assert attributes(second)["toolnexus.run.resumed"] is True
    wait = spans.one("wait ")
    assert wait.parent is not None and wait.parent.span_id == second.context.span_id
    assert attributes(wait)["toolnexus.wait.outcome"] == "approved"
    assert attributes(wait)["toolnexus.wait.resumed"] is True
    assert wait.start_time == int(halted.trace_context["suspended_at"])


async def test_an_untraced_run_keeps_no_trace_context_and_its_json_is_unchanged() -> None:
    async with LlmClient.in_process(lambda m, t: "hi") as client:
        result = await client.run("hi", Toolkit.create(builtins=False))
    assert result.trace_context is None
    assert "trace_context" not in result.to_dict()


def test_tracing_refuses_what_is_not_a_tracing_or_a_bool() -> None:
    with pytest.raises(UsageError, match="tracing must be a Tracing"):
        LlmClient.in_process(lambda m, t: "hi", tracing=True)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="capture_content"):
        Tracing(capture_content="yes")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="must be an OpenTelemetry TracerProvider, got str"):
        LlmClient.in_process(lambda m, t: "hi", tracing=Tracing(tracer_provider="jaeger"))


KEY = "sk-live-TRACE-1234567890"
HEADER_VALUE = "tenant-secret-0987654321"


async def test_no_span_or_log_line_carries_the_key_or_a_header_value(
    spans: Spans, caplog: pytest.LogCaptureFixture
) -> None:
    """A real HTTP provider that echoes the key and the header back, in an error and in a
    reply; contents captured, logging at DEBUG: neither secret is anywhere."""
    turns: list[str] = []

    async def provider(request: web.Request) -> web.Response:
        body = await request.json()
        key = request.headers["Authorization"].removeprefix("Bearer ")
        tenant = request.headers["X-Tenant"]
        turns.append("asked")
        if len(turns) == 1:
            busy = {"error": {"message": f"busy; key {key}, tenant {tenant}"}}
            return web.json_response(busy, status=503)
        message: dict[str, Any]
        if body["messages"][-1]["role"] != "tool":
            call = {
                "id": "c1",
                "type": "function",
                "function": {"name": "weather", "arguments": json.dumps({"city": "Paris"})},
            }
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            finish = "tool_calls"
        else:
            # A reply that quotes them: contents go on the spans, these never do.
            message = {"role": "assistant", "content": f"sunny ({key}, {tenant})"}
            finish = "stop"
        return web.json_response(
            {
                "id": f"resp-{len(turns)}",
                "model": "gpt-test",
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
            }
        )

    app = web.Application()
    app.router.add_post("/{path:.*}", provider)
    caplog.set_level(logging.DEBUG, logger="toolnexus_async")
    async with loopback(app) as url:
        async with LlmClient(
            url + "/v1",
            model="gpt-test",
            api_key=KEY,
            headers={"X-Tenant": HEADER_VALUE},
            retry=RetryPolicy(retries=1, base_delay=0),
            tracing=spans.tracing(capture_content=True),
        ) as client:
            result = await client.run(
                "weather?", Toolkit.create(builtins=False, extra_tools=[weather])
            )
    assert result.text == f"sunny ({KEY}, {HEADER_VALUE})"  # the run's own data, as it came
    failed, *answered = spans.named("chat ")
    assert attributes(failed)["error.type"] == "ProviderError"
    assert attributes(failed)["server.address"] == "127.0.0.1"
    assert attributes(answered[0])["gen_ai.response.id"] == "resp-2"
    assert attributes(answered[0])["gen_ai.provider.name"] == "openai"
    assert "[redacted]" in everything_in(failed)  # the echo was there, scrubbed
    assert "sunny ([redacted], [redacted])" in attributes(answered[-1])["gen_ai.output.messages"]
    for span in spans.finished:
        assert KEY not in everything_in(span) and HEADER_VALUE not in everything_in(span)
    lines = [caplog.handler.format(record) for record in caplog.records]
    assert any("retry 1" in line for line in lines)
    assert not any(KEY in line or HEADER_VALUE in line for line in lines)


# Run in a fresh interpreter where OpenTelemetry cannot be imported, as if not installed.
WITHOUT_OTEL = """
import asyncio, sys


class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "opentelemetry":
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None


sys.meta_path.insert(0, NotInstalled())
from toolnexus_async import LlmClient, Toolkit, Tracing, UsageError


async def main():
    async with LlmClient.in_process(lambda m, t: "hi") as client:
        print((await client.run("hi", Toolkit.create(builtins=False))).text)


asyncio.run(main())
try:
    LlmClient.in_process(lambda m, t: "hi", tracing=Tracing())
except UsageError as error:
    print(error)
"""


def test_without_tracing_nothing_of_opentelemetry_is_needed() -> None:
    """A client without ``tracing=`` runs where OpenTelemetry is not installed; one with it
    says what to install."""
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", WITHOUT_OTEL],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    assert done.returncode == 0, done.stderr
    ran, refused = done.stdout.splitlines()
    assert ran == "hi"
    assert refused.startswith("tracing=Tracing() needs OpenTelemetry's API (No module named")
    assert refused.endswith(
        "pip install -e '.[otel]' in the toolnexus-async checkout "
        "(or pip install 'opentelemetry-api>=1.30')"
    )


async def test_a_streamed_run_is_traced_too(spans: Spans) -> None:
    async with LlmClient.in_process(lambda m, t: "hello", tracing=spans.tracing()) as client:
        async with client.stream("hi", Toolkit.create(builtins=False)) as events:
            kinds = [event.kind async for event in events]
    assert kinds[-1] == "done"
    chat, run = spans.one("chat "), spans.one("invoke_agent")
    assert attributes(chat)["toolnexus.stream"] is True
    assert chat.parent is not None and chat.parent.span_id == run.context.span_id
    assert attributes(run)["toolnexus.run.status"] == "done"


async def test_a_durable_hosts_run_parked_then_halted_keeps_its_wait_in_the_trace(
    spans: Spans,
) -> None:
    """A run the host parks past the inbox's park_timeout halts into the store (its wait
    span ends ``halted``); the answer resumes it from the store, in the same trace, and the
    answer is a wait span of the resume over the whole wait: from when the store was told
    of the request to when it took the answer, as the store kept both times."""
    results: list[RunResult] = []
    toolkit = Toolkit.create(builtins=False, extra_tools=[asking("refund")])

    def model(messages: list[Message], tools: list[Any]) -> Any:
        if isinstance(messages[-1], ToolReturn):
            return messages[-1].output
        return reply(None, tool_call("refund", {"table": "t"}, id="c1"))

    with anyio.fail_after(LIMIT):
        async with (
            MemoryRunStore() as store,
            LlmClient.in_process(
                model, wait_for=Inbox(park_timeout=0.02), tracing=spans.tracing()
            ) as client,
            DurableHost(
                client, toolkit, store, sweep=0.02, poll=0.02, on_result=results.append
            ) as host,
        ):
            halted = await host.run("go")
            assert halted.status == "pending" and halted.pending is not None
            stored = await store.load(halted.run_id)
            assert stored.state.trace_context is not None
            assert "traceparent" in stored.state.trace_context
            raised = stored.requests["c1"].raised_at
            await host.answer(Answer(halted.pending.id, True))
            await wait_until(lambda: bool(results))
            (record,) = await store.answers(halted.run_id or "")
    assert results[0].text == "refund t: done"
    first, resumed = spans.named("invoke_agent")
    assert resumed.context.trace_id == first.context.trace_id
    assert resumed.parent is not None and resumed.parent.span_id == first.context.span_id
    parked, rest = spans.named("wait ")
    assert attributes(parked)["toolnexus.wait.outcome"] == "halted"
    assert parked.parent is not None and parked.parent.span_id == first.context.span_id
    assert attributes(rest)["toolnexus.wait.outcome"] == "approved"
    assert attributes(rest)["toolnexus.wait.resumed"] is True
    assert rest.parent is not None and rest.parent.span_id == resumed.context.span_id
    assert raised is not None and rest.start_time == int(raised * 1e9)
    assert rest.end_time == int(record.at * 1e9)  # when the store took the answer
    seconds = attributes(rest)["toolnexus.wait.seconds"]
    assert seconds == (rest.end_time - rest.start_time) / 1e9 > 0
    assert parked.end_time is not None and rest.start_time < parked.end_time  # raised, then halted
    assert attributes(parked)["toolnexus.wait.seconds"] > 0
    assert_no_leaks()
