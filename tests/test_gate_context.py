"""A ``require_approval`` gate is called without a :class:`ToolContext` (it reads only the
answer), and the tools behind it get their context made only when they run: what they are
told must be exactly what a run under any other ``before_tool`` hook tells them.

Each run is done twice, once with the gate itself (the executor's path without a context)
and once with the same gate behind a hook of the user's (the general path, which builds the
context for the hook and hands the tool that one), and the tools' contexts compared.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.conftest import assert_no_leaks
from toolnexus_async import (
    Answer,
    Hooks,
    LlmClient,
    Request,
    Tool,
    ToolContext,
    Toolkit,
    ToolResult,
    define_tool,
    require_approval,
)
from toolnexus_async._engine.hooks import call_hook
from toolnexus_async.testing import ScriptedModel, reply, tool_call

LIMIT = 5  # seconds; only reached when the rule under test is broken


class ClassTool:
    """A tool class of the user's: handed its context by the toolkit's ``execute``."""

    source = "custom"
    description = "records its context"
    input_schema: dict[str, Any] = {"type": "object", "properties": {}}  # noqa: RUF012

    def __init__(self, name: str, seen: list[tuple[str, ToolContext | None]]) -> None:
        self.name = name
        self._seen = seen

    async def execute(self, args: dict[str, Any], ctx: ToolContext | None = None) -> ToolResult:
        self._seen.append((self.name, ctx))
        return ToolResult.ok(f"{self.name} ran")


async def run(through_user_hook: bool, approve: bool) -> tuple[str, list[Any], list[Any]]:
    """The run's id, the tools' contexts (by tool) and the gate's verdicts."""
    seen: list[tuple[str, ToolContext | None]] = []

    async def weather(city: str, ctx: ToolContext) -> str:  # define_tool's path
        """The weather in a city."""
        seen.append(("weather", ctx))
        return f"sunny in {city}"

    async def add(a: int, b: int, ctx: ToolContext) -> int:
        """Add two numbers."""
        seen.append(("add", ctx))
        return a + b

    gate = require_approval(["add", "deploy"])
    verdicts: list[Any] = []

    async def user_hook(name: str, args: dict[str, Any], ctx: ToolContext) -> Any:
        verdict = await call_hook(gate, name, args, ctx)
        verdicts.append((name, None if verdict is None else type(verdict).__name__))
        return verdict

    async def wait_for(request: Request) -> Answer:
        return Answer(request.id, approve)

    tools: list[Tool] = [define_tool(weather), define_tool(add), ClassTool("deploy", seen)]
    tools.append(ClassTool("status", seen))
    model = ScriptedModel(
        reply(
            tool_call("weather", {"city": "Oslo"}, id="c1"),
            tool_call("add", {"a": 1, "b": 2}, id="c2"),
            tool_call("deploy", {}, id="c3"),
            tool_call("status", {}, id="c4"),
        ),
        "done",
    )
    hooks = Hooks(before_tool=user_hook if through_user_hook else gate)
    with anyio.fail_after(LIMIT):
        async with (
            Toolkit.create(builtins=False, extra_tools=tools) as tk,
            LlmClient.in_process(model, model="scripted", hooks=hooks, wait_for=wait_for) as client,
        ):
            result = await client.run("go", tk)
    return result.run_id, sorted(seen, key=lambda s: s[0]), verdicts


@pytest.mark.parametrize("approve", [True, False])
async def test_tools_behind_a_gate_get_the_context_a_user_hook_would_give_them(
    approve: bool,
) -> None:
    fast_id, fast, _ = await run(through_user_hook=False, approve=approve)
    slow_id, slow, verdicts = await run(through_user_hook=True, approve=approve)
    ran = ["add", "deploy", "status", "weather"] if approve else ["status", "weather"]
    assert [name for name, _ in fast] == ran
    assert [name for name, _ in slow] == ran
    calls = {"weather": "c1", "add": "c2", "deploy": "c3", "status": "c4"}
    for (name, got), (_, general) in zip(fast, slow, strict=True):
        assert general == ToolContext(None, calls[name], slow_id, name, None, 1)
        assert got == ToolContext(None, calls[name], fast_id, name, None, 1), name
    # The gate itself asked for the same two, under both paths.
    assert [v for v in verdicts if v[1] is not None][:2] == [
        ("add", "ToolResult"),
        ("deploy", "ToolResult"),
    ]
    assert_no_leaks()
