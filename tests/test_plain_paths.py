"""The plain paths of a run against the general ones they stand for (issue 41, C = 500).

A run with no hooks around its requests and calls, no stream and no journal takes shorter
paths than the general ones (see ``Engine._drive``, ``Engine.drive_new`` and
``ToolRegistry.execute_call``). Each test runs the same scenario down both ways (the
general one forced by a hook that changes nothing) and asks for the same results, errors,
metric events and log records.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import attrs

from tests.conftest import openai_reply
from toolnexus_async import (
    Hooks,
    LlmClient,
    ToolContext,
    Toolkit,
    define_tool,
)
from toolnexus_async._core.http import HttpRequest, HttpResponse
from toolnexus_async._engine.engine import RunSpec
from toolnexus_async.testing import MockTransport, json_response

KEY = "sk-plain-paths-0123456789"
USAGE = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


async def look(city: str) -> str:
    """Look a city up.

    Args:
        city: the city.
    """
    return f"{city}: 21 C"


async def whoami(ctx: ToolContext) -> str:
    """Say which call this is."""
    return json.dumps([ctx.call_id, ctx.run_id, ctx.tool_name, ctx.turn, ctx.idempotency_key])


async def boom(n: int) -> str:
    """Fail.

    Args:
        n: a number.
    """
    raise ValueError(f"no {n}")


def toolkit() -> Toolkit:
    tools = [define_tool(look), define_tool(whoami), define_tool(boom)]
    return Toolkit.create(builtins=False, extra_tools=tools)


def scenario(request: HttpRequest) -> HttpResponse:
    """Turn 1: three calls (one raises); turn 2: the results, joined."""
    messages = json.loads(request.content)["messages"]
    results = [m["content"] for m in messages if m["role"] == "tool"]
    if results:
        return json_response(openai_reply(" | ".join(results), usage=USAGE))
    calls: list[tuple[str, str, dict[str, Any] | str]] = [
        ("c1", "look", {"city": "Paris"}),
        ("c2", "whoami", {}),
        ("c3", "boom", {"n": 7}),
    ]
    return json_response(openai_reply(None, calls, usage=USAGE))


def noop(*args: Any) -> None:
    return None


# Hooks that change nothing, but take every general path: the model turn's (after_llm) and
# the call's (before_tool).
GENERAL = {"after_llm": noop, "before_tool": noop}


def client(
    handler: Callable[[HttpRequest], HttpResponse], events: list[Any], general: bool, **kw: Any
) -> LlmClient:
    hooks = Hooks(on_metric=events.append, **(GENERAL if general else {}))
    return LlmClient(
        "http://127.0.0.1:9/v1",
        model="m",
        api_key=KEY,
        transport=MockTransport(handler),
        hooks=hooks,
        **kw,
    )


def timeless(events: list[Any]) -> list[Any]:
    return [attrs.evolve(event, seconds=0.0) for event in events]


async def test_drive_new_is_drive_of_a_spec() -> None:
    outcomes = []
    for by_spec in (False, True):
        events: list[Any] = []
        async with client(scenario, events, False) as c, toolkit() as tk:
            if by_spec:
                loop = c.engine.new_loop("go", run_id="run_same")
                result = await c.engine.drive(RunSpec(loop, tk))
            else:
                result = await c.engine.drive_new(c.engine.new_loop("go", run_id="run_same"), tk)
        outcomes.append((result, timeless(events)))
    assert outcomes[0] == outcomes[1]
