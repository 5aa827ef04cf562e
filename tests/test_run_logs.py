"""Logs that help: a raising tool's traceback is logged, every record of a run names the run,
and ``serve --log-format json`` writes one JSON object per line."""

from __future__ import annotations

import io
import json
import logging
import signal
from pathlib import Path
from typing import Any, ClassVar

import aiohttp
import anyio
import pytest
from opentelemetry.sdk.trace import TracerProvider
from yarl import URL

from tests.test_cli import serve_process
from toolnexus_async import (
    Answer,
    Inbox,
    LlmClient,
    Message,
    ProviderError,
    Request,
    RetryPolicy,
    RunResult,
    ToolContext,
    Toolkit,
    ToolResult,
    ToolReturn,
    Tracing,
    define_tool,
)
from toolnexus_async.durable import DurableHost, MemoryRunStore
from toolnexus_async.serve._server import serve_logging
from toolnexus_async.testing import reply, tool_call

LIMIT = 30


@define_tool
async def boom(table: str) -> str:
    """Always fails."""
    raise ValueError(f"database is on fire ({table})")


class Broken:
    """A tool that is no define_tool: the toolkit itself turns its exception into text."""

    name = "broken"
    description = "Always fails."
    input_schema: ClassVar[dict[str, Any]] = {"type": "object", "properties": {}}
    source = "custom"

    async def execute(self, args: dict[str, Any], ctx: ToolContext | None = None) -> ToolResult:
        raise KeyError("no such row")


def calling(*names: str) -> Any:
    def model(messages: list[Message], tools: list[Any]) -> Any:
        if isinstance(messages[-1], ToolReturn):
            return " | ".join(m.output for m in messages if isinstance(m, ToolReturn))
        return reply(None, *(tool_call(name, {"table": "users"}) for name in names))

    return model


async def test_a_raising_tools_traceback_is_logged_with_the_run_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="toolnexus_async")
    toolkit = Toolkit.create(builtins=False, extra_tools=[boom, Broken()], validate=False)
    async with LlmClient.in_process(calling("boom", "broken")) as client:
        result = await client.run("go", toolkit)
    assert result.status == "done"  # the model was told, the run went on
    raised = [r for r in caplog.records if r.name == "toolnexus_async" and r.exc_info]
    assert [r.getMessage() for r in raised] == [
        "tool 'boom' raised ValueError; the model is told",
        "tool 'broken' raised KeyError; the model is told",
    ]
    for record in raised:
        assert record.levelno == logging.WARNING
        assert record.run_id == result.run_id  # type: ignore[attr-defined]
    text = caplog.handler.format(raised[0])
    assert "Traceback (most recent call last)" in text
    assert 'raise ValueError(f"database is on fire ({table})")' in text
    assert "ValueError: database is on fire (users)" in text


async def test_every_record_of_a_run_carries_its_id(caplog: pytest.LogCaptureFixture) -> None:
    """Model requests, a retry, tool turns, a failing wait_for and the end: all name it."""
    busy = [ProviderError(503, "busy", "https://llm.example.com/v1/chat/completions")]

    def model(messages: list[Message], tools: list[Any]) -> Any:
        if busy:
            raise busy.pop()
        return calling("ask")(messages, tools)

    @define_tool
    async def ask(table: str, ctx: ToolContext | None = None) -> ToolResult:
        """Asks first."""
        return ToolResult.pending(Request("", "approval", f"touch {table}?"))

    async def wait_for(request: Request) -> Answer:
        raise ConnectionError("the approval service is down")

    caplog.set_level(logging.DEBUG, logger="toolnexus_async")
    async with LlmClient.in_process(
        model, wait_for=wait_for, retry=RetryPolicy(base_delay=0)
    ) as client:
        result = await client.run(
            "go", Toolkit.create(builtins=False, extra_tools=[ask]), run_id="run-logged"
        )
    assert result.status == "done"
    records = [r for r in caplog.records if r.name.startswith("toolnexus_async")]
    said = [r.getMessage() for r in records]
    assert any("retry 1" in line for line in said)
    assert any("wait_for raised" in line for line in said)
    assert any("running 1 tool call" in line for line in said)
    assert len(records) >= 6
    assert {getattr(r, "run_id", None) for r in records} == {"run-logged"}


async def test_the_json_log_format_is_one_object_per_line() -> None:
    """What ``serve --log-format json`` installs: a record of a traced run's raising tool
    becomes one line with its run id, its traceback and the span it was logged in."""
    stream = io.StringIO()
    toolkit = Toolkit.create(builtins=False, extra_tools=[boom])
    provider = TracerProvider()
    with serve_logging(stream, fmt="json"):
        async with LlmClient.in_process(
            calling("boom"), tracing=Tracing(tracer_provider=provider)
        ) as client:
            result = await client.run("go", toolkit)
    provider.shutdown()
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    (line,) = [line for line in lines if "exception" in line]
    assert line["level"] == "WARNING" and line["logger"] == "toolnexus_async"
    assert line["message"] == "tool 'boom' raised ValueError; the model is told"
    assert line["run_id"] == result.run_id
    assert line["exception"].endswith("ValueError: database is on fire (users)")
    assert line["time"].endswith("Z") and len(line["trace_id"]) == 32
    assert result.trace_context is not None
    assert line["trace_id"] == result.trace_context["traceparent"].split("-")[1]
    with pytest.raises(ValueError, match="log format 'xml'"), serve_logging(stream, fmt="xml"):
        pass


async def test_serve_log_format_json_from_the_real_command(tmp_path: Path) -> None:
    with anyio.fail_after(LIMIT):
        async with serve_process(tmp_path, "--log-format", "json", "--quiet") as served:
            url = URL((await served.line_with("Open the inbox: ")).split(": ", 1)[1])
            bearer = {"Authorization": f"Bearer {url.query['token']}"}
            async with aiohttp.ClientSession() as http:
                requests = url.with_query(None).with_path("/requests")
                async with http.get(requests, headers=bearer) as answered:
                    assert answered.status == 200  # it serves: its signal handlers are set
            code, _, err = await served.stop(signal.SIGINT)
    assert code == 0, err
    lines = [json.loads(line) for line in err.splitlines()]
    assert [line["logger"] for line in lines] == ["toolnexus_async.serve"] * 2
    assert lines[0]["message"].startswith("SIGINT: stopping")
    assert {line["level"] for line in lines} == {"INFO"}


async def test_a_durable_hosts_records_of_a_run_carry_its_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The host's own lines about a run (here: its on_result raised after the run was
    resumed from the store) name the run too."""

    @define_tool
    async def ask(table: str, ctx: ToolContext | None = None) -> ToolResult:
        """Asks first."""
        if ctx is None or ctx.answer is None:
            return ToolResult.pending(Request("", "approval", f"touch {table}?"))
        return ToolResult.ok("touched")

    told: list[str] = []

    def on_result(result: RunResult) -> None:
        told.append(result.run_id)
        raise RuntimeError("the result sink is down")

    caplog.set_level(logging.WARNING, logger="toolnexus_async")
    with anyio.fail_after(LIMIT):
        async with (
            MemoryRunStore() as store,
            LlmClient.in_process(calling("ask"), wait_for=Inbox(park_timeout=0.01)) as client,
            DurableHost(
                client,
                Toolkit.create(builtins=False, extra_tools=[ask]),
                store,
                sweep=0.02,
                poll=0.02,
                on_result=on_result,
            ) as host,
        ):
            halted = await host.run("go")
            assert halted.pending is not None
            await host.answer(Answer(halted.pending.id, True))
            while not told:
                await anyio.lowlevel.checkpoint()
    (record,) = [r for r in caplog.records if r.getMessage().startswith("on_result raised")]
    assert record.run_id == halted.run_id  # type: ignore[attr-defined]
