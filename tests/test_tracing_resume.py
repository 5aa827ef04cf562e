"""A halted run, stored, then resumed by another process, continues its trace.

This process runs the agent until it halts on an approval and saves it to a SQLite store;
a fresh interpreter (the child script below) resumes it from the file with the answer,
traced into its own in-memory exporter, and prints its spans. The resumed run's span is a
child of the halted run's, in the same trace, and the wait between the two processes is a
span from the halt to the resume.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.conftest import assert_no_leaks
from toolnexus_async import LlmClient, Tracing
from toolnexus_async.durable import SqliteRunStore

# The agent both processes run: its tools and its model.
AGENT = '''
from toolnexus_async import Request, ToolContext, Toolkit, ToolResult, ToolReturn, define_tool
from toolnexus_async.testing import reply, tool_call


@define_tool
async def lookup(invoice: str) -> str:
    """Find an invoice."""
    return f"{invoice}: 30 EUR"


@define_tool
async def pay(amount: int, ctx: ToolContext | None = None) -> ToolResult:
    """Pay; needs approval."""
    if ctx is None or ctx.answer is None:
        return ToolResult.pending(Request("", "approval", f"Pay {amount} EUR?"))
    return ToolResult.ok(f"paid {amount}")


TOOLKIT = Toolkit.create(builtins=False, extra_tools=[lookup, pay])


def model(messages, tools):
    if isinstance(messages[-1], ToolReturn):
        return " | ".join(m.output for m in messages if isinstance(m, ToolReturn))
    return reply(None, tool_call("lookup", {"invoice": "INV-1"}, id="c1"),
                 tool_call("pay", {"amount": 30}, id="c2"))
'''

CHILD = """
import json, sys

import anyio
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agent import TOOLKIT, model
from toolnexus_async import Answer, LlmClient, Tracing
from toolnexus_async.durable import SqliteRunStore, resume_stored

DB, REQUEST = sys.argv[1:3]


async def resume():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = Tracing(tracer_provider=provider)
    async with SqliteRunStore(DB) as store, LlmClient.in_process(model, tracing=tracing) as client:
        result = await resume_stored(client, TOOLKIT, store, Answer(REQUEST, True))
    spans = [
        {
            "name": s.name,
            "trace_id": s.context.trace_id,
            "span_id": s.context.span_id,
            "parent": s.parent.span_id if s.parent else None,
            "start": s.start_time,
            "attributes": dict(s.attributes),
        }
        for s in exporter.get_finished_spans()
    ]
    print(json.dumps({"text": result.text, "spans": spans}), flush=True)


anyio.run(resume)
"""

LIMIT = 60  # a fresh interpreter imports aiohttp and OpenTelemetry


def child_env(where: Path) -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join([str(where), root, os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


def local_agent(where: Path) -> Any:
    """The agent module, imported here as the child imports it."""
    namespace: dict[str, Any] = {}
    exec(compile(AGENT, str(where / "agent.py"), "exec"), namespace)
    return namespace


async def test_a_halted_run_resumed_by_another_process_continues_its_trace(
    tmp_path: Path,
) -> None:
    (tmp_path / "agent.py").write_text(AGENT)
    (tmp_path / "child.py").write_text(CHILD)
    agent = local_agent(tmp_path)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    db = tmp_path / "runs.db"
    async with (
        SqliteRunStore(db) as store,
        LlmClient.in_process(agent["model"], tracing=Tracing(tracer_provider=provider)) as client,
    ):
        halted = await client.run("pay INV-1", agent["TOOLKIT"])
        await store.save(halted)
    assert halted.status == "pending" and halted.pending is not None
    (first,) = [s for s in exporter.get_finished_spans() if s.name == "invoke_agent"]

    with anyio.fail_after(LIMIT):
        done = await anyio.run_process(
            [sys.executable, "-W", "error", str(tmp_path / "child.py"), str(db), halted.pending.id],
            env=child_env(tmp_path),
            check=False,
        )
    assert done.returncode == 0, done.stderr.decode()
    out = json.loads(done.stdout)
    assert out["text"] == "INV-1: 30 EUR | paid 30"
    spans = out["spans"]
    (resumed,) = [s for s in spans if s["name"] == "invoke_agent"]
    # The same trace, the halted run's span as the parent.
    assert resumed["trace_id"] == first.context.trace_id
    assert resumed["parent"] == first.context.span_id
    assert resumed["attributes"]["toolnexus.run.resumed"] is True
    assert resumed["attributes"]["toolnexus.run.id"] == halted.run_id
    others = [s for s in spans if s is not resumed]
    assert {s["trace_id"] for s in others} == {first.context.trace_id}
    assert {s["parent"] for s in others} == {resumed["span_id"]}
    # The wait across the two processes: from the halt to the resume, approved.
    (wait,) = [s for s in spans if s["name"] == "wait approval"]
    assert wait["attributes"]["toolnexus.tool.call.id"] == "c2"
    assert wait["attributes"]["toolnexus.request.id"] == halted.pending.id
    assert wait["attributes"]["toolnexus.wait.outcome"] == "approved"
    assert wait["attributes"]["toolnexus.wait.resumed"] is True
    assert first.end_time is not None and wait["start"] <= first.end_time
    assert wait["attributes"]["toolnexus.wait.seconds"] > 0
    # The answered call ran again in the child, the completed one did not.
    assert [
        s["attributes"]["gen_ai.tool.call.id"]
        for s in spans
        if s["name"].startswith("execute_tool")
    ] == ["c2"]
    provider.shutdown()
    assert_no_leaks()
