"""Every way of getting a run's result is typed by its ``output_type``: mypy --strict checks
this file (``mypy --strict`` in CI reads tests/), so each ``assert_type`` below is a claim
mypy verifies, and each test runs too. ``output_type=T`` gives ``RunResult[T]`` (and
``RunStream[T]``, ``RunHandle[T]``, ``BegunRun[T]``), no ``output_type`` ``RunResult[str]``,
whose ``output`` is the text; a JSON Schema dict or a union gives ``RunResult[Any]``."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, assert_type

import anyio
import pytest

from toolnexus_async import (
    Answer,
    LlmClient,
    Request,
    RunResult,
    RunStream,
    StreamDone,
    ToolContext,
    Toolkit,
    ToolResult,
    define_tool,
)
from toolnexus_async.durable import BegunRun, DurableHost, SqliteRunStore, resume_stored
from toolnexus_async.testing import ScriptedModel, reply, tool_call


@dataclasses.dataclass
class Point:
    x: int
    y: int


@dataclasses.dataclass
class Label:
    name: str


POINT = '{"x": 1, "y": 2}'


def no_tools() -> Toolkit:
    return Toolkit.create(builtins=False)


@define_tool
async def approve(ctx: ToolContext | None = None) -> ToolResult:
    """Needs a yes."""
    if ctx is None or ctx.answer is None:
        return ToolResult.pending(Request("", "approval", "Go?"))
    return ToolResult.ok("approved")


async def test_the_client_entries_are_typed_by_the_output_type():
    async with LlmClient.in_process(lambda m, t: POINT) as client, no_tools() as toolkit:
        typed = await client.run("go", toolkit, output_type=Point, output_retries=2)
        plain = await client.run("go", toolkit)
        schema = await client.run("go", toolkit, output_type={"type": "object"})
        union = await client.run("go", toolkit, output_type=Point | Label)
        asked = await client.ask("go", toolkit, output_type=Point)
        asked_plain = await client.ask("go", toolkit, conversation_id="c1")
        async with client.stream("go", toolkit, output_type=Point) as events:
            streamed = [event async for event in events]
        async with client.stream("go", toolkit) as plain_events:
            plain_streamed = [event async for event in plain_events]
        async with client.start("go", toolkit, output_type=Point) as handle:
            held = await handle.result()
        async with client.start("go", toolkit) as plain_handle:
            held_plain = await plain_handle.result()
    assert_type(typed, RunResult[Point])
    assert_type(typed.output, Point | None)
    assert_type(plain, RunResult[str])
    assert_type(plain.output, str | None)
    assert_type(schema, RunResult[Any])
    assert_type(union, RunResult[Any])
    assert_type(asked, RunResult[Point])
    assert_type(asked_plain, RunResult[str])
    assert_type(held, RunResult[Point])
    assert_type(held_plain, RunResult[str])
    done, plain_done = streamed[-1], plain_streamed[-1]
    assert isinstance(done, StreamDone) and isinstance(plain_done, StreamDone)
    assert_type(done, StreamDone[Point])
    assert_type(done.result.output, Point | None)
    assert_type(plain_done.result, RunResult[str])
    for point in (typed.output, asked.output, held.output, done.result.output):
        assert point == Point(1, 2)
    assert union.output == Point(1, 2)
    assert schema.output == {"x": 1, "y": 2}
    # No output type: a done run's output is its text.
    for text in (plain.output, asked_plain.output, held_plain.output, plain_done.result.output):
        assert text == POINT
    # The output keywords are taken as **options: a misspelt one is still refused.
    async with LlmClient.in_process(lambda m, t: POINT) as client, no_tools() as toolkit:
        with pytest.raises(TypeError, match="unexpected keyword argument 'output_retry'"):
            await client.run("go", toolkit, output_type=Point, output_retry=2)  # type: ignore[call-overload]
        with pytest.raises(TypeError, match="ask\\(\\) got an unexpected keyword"):
            await client.ask("go", toolkit, output_methd="tool")  # type: ignore[call-overload]


async def test_a_plain_runs_output_is_its_text_only_once_done():
    async with (
        LlmClient.in_process(ScriptedModel(reply(tool_call("approve")))) as client,
        Toolkit.create(builtins=False, extra_tools=[approve]) as toolkit,
    ):
        halted = await client.run("go", toolkit)
    assert (halted.status, halted.output) == ("pending", None)
    again = RunResult.from_dict(halted.to_dict())
    assert again.output is None and again == halted
    async with LlmClient.in_process(lambda m, t: "yes") as client, no_tools() as toolkit:
        done = await client.run("go", toolkit)
    assert done.output == "yes"
    assert RunResult.from_dict(done.to_dict()) == done  # read back, its output is its text
    assert "output" not in done.to_dict()  # the JSON of a run without an output type is as it was


async def test_the_host_and_resuming_are_typed_by_the_output_type(tmp_path: Path):
    asks = ScriptedModel(*(reply(tool_call("approve")) for _ in range(3)))
    async with (
        LlmClient.in_process(asks) as client,
        Toolkit.create(builtins=False, extra_tools=[approve]) as toolkit,
        SqliteRunStore(tmp_path / "runs.db") as store,
        DurableHost(client, toolkit, store) as host,
    ):
        halted = await host.run("go", output_type=Point)
        halted_plain = await host.run("go")
        begun = await host.begin("go", output_type=Point)
        assert_type(begun, BegunRun[Point])
        assert_type(host.stream("go", output_type=Point), RunStream[Point])
        assert_type(host.stream("go"), RunStream[str])
        first = await begun.run()
    assert_type(halted, RunResult[Point])
    assert_type(halted_plain, RunResult[str])
    assert_type(first, RunResult[Point])
    assert halted.pending is not None and first.pending is not None
    async with (
        LlmClient.in_process(lambda m, t: POINT) as client,
        Toolkit.create(builtins=False, extra_tools=[approve]) as toolkit,
    ):
        yes = Answer(halted.pending.id, True)
        resumed = await client.resume(halted, toolkit, answers=yes, output_type=Point)
        # Read back from its JSON form: the schema is there, the Python type is not.
        again = RunResult.from_dict(halted.to_dict())
        untyped = await client.resume(again, toolkit, answers=yes)
        async with SqliteRunStore(tmp_path / "runs.db") as store:
            stored = await resume_stored(
                client, toolkit, store, Answer(first.pending.id, True), output_type=Point
            )
    assert_type(resumed, RunResult[Point])
    assert_type(untyped, RunResult[Any])
    assert_type(stored, RunResult[Point])
    assert resumed.output == stored.output == Point(1, 2)
    assert untyped.output == {"x": 1, "y": 2}  # the stored schema's JSON, not built


async def test_a_run_can_be_handed_to_a_task_group_as_it_is():
    """``start_soon(client.run, prompt, toolkit)`` type-checks: the overload without an
    output type comes first and is not generic."""
    results: list[RunResult[str]] = []

    async def keep(prompt: str, toolkit: Toolkit) -> None:
        results.append(await client.run(prompt, toolkit))

    async with LlmClient.in_process(lambda m, t: "hi") as client, no_tools() as toolkit:
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.run, "go", toolkit)
            tg.start_soon(keep, "go", toolkit)
    assert [r.output for r in results] == ["hi"]


async def test_a_hosts_run_can_be_handed_to_a_task_group_as_it_is(tmp_path: Path):
    """``start_soon(host.run, prompt)`` type-checks too: the host's run hands back a
    coroutine (anyio's ``start_soon`` takes nothing else), not a bare awaitable."""
    async with (
        LlmClient.in_process(lambda m, t: "hi") as client,
        no_tools() as toolkit,
        SqliteRunStore(tmp_path / "runs.db") as store,
        DurableHost(client, toolkit, store) as host,
    ):
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.run, "go")
        assert [run.status for run in await store.runs()] == ["done"]
