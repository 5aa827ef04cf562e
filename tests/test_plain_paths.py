"""The plain paths of a run against the general ones they stand for (issue 41, C = 500).

A run with no hooks around its requests and calls, no stream and no journal takes shorter
paths than the general ones (see ``Engine._drive``, ``Engine.drive_new`` and
``ToolRegistry.execute_call``). Each test runs the same scenario down both ways (the
general one forced by a hook that changes nothing) and asks for the same results, errors,
metric events and log records.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import attrs
import pytest

from tests.conftest import assert_no_leaks, openai_reply
from toolnexus_async import (
    Answer,
    Hooks,
    Limits,
    LlmClient,
    ProtocolError,
    ProviderError,
    Request,
    RetryPolicy,
    ToolContext,
    Toolkit,
    ToolResult,
    TransportError,
    define_tool,
    require_approval,
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


@pytest.mark.parametrize("limits", [None, Limits(timeout=60)], ids=["no-timeout", "timeout"])
async def test_a_plain_run_ends_as_the_general_one_does(
    caplog: pytest.LogCaptureFixture, limits: Limits | None
) -> None:
    outcomes = []
    for general in (False, True):
        events: list[Any] = []
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="toolnexus_async"):
            async with client(scenario, events, general, limits=limits) as c, toolkit() as tk:
                result = await c.run("go", tk, run_id="run_same")
        raised = [(r.getMessage(), getattr(r, "run_id", None)) for r in caplog.records]
        outcomes.append((result, timeless(events), raised))
    assert outcomes[0] == outcomes[1]
    result, events, raised = outcomes[0]
    whoami_said = json.loads(result.tool_calls[1].result.output)
    assert whoami_said[:4] == ["c2", "run_same", "whoami", 1]
    assert result.tool_calls[2].result.output == "tool 'boom' raised ValueError: no 7"
    assert raised and all(run_id == "run_same" for _, run_id in raised)
    assert_no_leaks()


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


def failing(kind: str) -> Callable[[HttpRequest], HttpResponse]:
    """Fails its first request (as ``kind`` says), then plays the scenario."""
    seen: list[HttpRequest] = []

    def handler(request: HttpRequest) -> HttpResponse:
        seen.append(request)
        if len(seen) > 1:
            return scenario(request)
        if kind == "transport":
            error = TransportError(f"connection reset, key {KEY}")
            error.__cause__ = OSError(104, f"reset by {KEY}")
            raise error
        if kind == "provider":
            return json_response({"error": {"message": f"busy for {KEY}"}}, status=503)
        return HttpResponse(200, {}, f"not json {KEY}".encode())

    return handler


def shown(error: BaseException) -> tuple[Any, ...]:
    cause = error.__cause__
    return (
        type(error),
        str(error),
        type(cause),
        getattr(cause, "errno", None),
        str(cause) if cause is not None else None,
        error.__context__,
        error.__suppress_context__,
        getattr(getattr(error, "run", None), "limit", None),
    )


@pytest.mark.parametrize("kind", ["transport", "provider", "protocol"])
async def test_a_plain_turn_fails_and_retries_as_the_general_one(kind: str) -> None:
    outcomes = []
    for general in (False, True):
        # Given up at once: the error itself, as the run's caller sees it.
        events: list[Any] = []
        no_retry = RetryPolicy(retries=0)
        async with client(failing(kind), events, general, retry=no_retry) as c, toolkit() as tk:
            with pytest.raises((TransportError, ProviderError, ProtocolError)) as caught:
                await c.run("go", tk, run_id="run_same")
        assert KEY not in repr(shown(caught.value))
        # Retried: the run goes on as if the first attempt had not failed.
        retried: list[Any] = []
        retry = RetryPolicy(retries=1, base_delay=0, jitter=0, on_error=lambda error, n: "retry")
        async with client(failing(kind), retried, general, retry=retry) as c, toolkit() as tk:
            result = await c.run("go", tk, run_id="run_same")
        outcomes.append((shown(caught.value), timeless(events), result, timeless(retried)))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0][-1] == "model_error"  # error.run: the run as it stood
    assert_no_leaks()


async def test_a_toolkit_that_overrides_execute_is_still_asked() -> None:
    asked: list[ToolContext | None] = []

    class Watched(Toolkit):
        def execute(self, name: str, args: dict[str, Any], ctx: ToolContext | None = None) -> Any:
            asked.append(ctx)
            return super().execute(name, args, ctx)

    events: list[Any] = []
    tk = Watched.create(builtins=False, extra_tools=[define_tool(look)])

    def one_call(request: HttpRequest) -> HttpResponse:
        if b'"role":"tool"' in request.content:
            return json_response(openai_reply("done", usage=USAGE))
        return json_response(openai_reply(None, [("c1", "look", {"city": "Oslo"})], usage=USAGE))

    async with client(one_call, events, False) as c, tk:
        result = await c.run("go", tk, run_id="run_w")
    assert result.text == "done"
    assert asked == [ToolContext(call_id="c1", run_id="run_w", tool_name="look", turn=1)]


async def test_a_tool_of_another_class_is_given_its_context() -> None:
    class Plain:
        name = "plain"
        description = "A tool that is not define_tool's."
        source = "native"

        def __init__(self) -> None:
            self.input_schema: dict[str, Any] = {"type": "object", "properties": {}}
            self.seen: list[ToolContext | None] = []

        async def execute(self, args: dict[str, Any], ctx: ToolContext | None = None) -> Any:
            self.seen.append(ctx)
            return ToolResult.ok("ok")

    tool = Plain()
    tk = Toolkit.create(builtins=False, extra_tools=[tool])
    direct = await tk.execute_call("plain", {}, "c9", "run_p", 2)
    assert direct == ToolResult.ok("ok")
    assert tool.seen == [ToolContext(call_id="c9", run_id="run_p", tool_name="plain", turn=2)]


def gate_prompt(name: str, args: Any) -> str:
    if name == "boom":
        raise RuntimeError("no prompt for boom")  # the gate raises: an error result
    return f"run {name}?"


def approver(asked: list[Request], ok: bool) -> Callable[[Request], Any]:
    async def approve(request: Request) -> Answer:
        asked.append(attrs.evolve(request, id="req"))
        return Answer(request.id, ok)

    return approve


@pytest.mark.parametrize("ok", [True, False], ids=["approved", "declined"])
async def test_a_lone_gate_is_asked_as_the_general_path_asks_it(
    caplog: pytest.LogCaptureFixture, ok: bool
) -> None:
    # A require_approval gate as the only tool hook is asked by Executor.run_one itself,
    # before and after the approval; an after_tool that changes nothing forces _invoke.
    gate = require_approval(["look", "whoami", "boom"], prompt=gate_prompt)
    outcomes = []
    for general in (False, True):
        events: list[Any] = []
        asked: list[Request] = []
        caplog.clear()
        hooks = Hooks(
            on_metric=events.append, before_tool=gate, after_tool=noop if general else None
        )
        with caplog.at_level(logging.WARNING, logger="toolnexus_async"):
            async with (
                LlmClient(
                    "http://127.0.0.1:9/v1",
                    model="m",
                    api_key=KEY,
                    transport=MockTransport(scenario),
                    hooks=hooks,
                    wait_for=approver(asked, ok),
                ) as c,
                toolkit() as tk,
            ):
                result = await c.run("go", tk, run_id="run_same")
        raised = [(r.getMessage(), getattr(r, "run_id", None)) for r in caplog.records]
        records = [attrs.evolve(r, request=None) for r in result.tool_calls]
        outcomes.append((result.text, records, asked, timeless(events), raised))
    assert outcomes[0] == outcomes[1]
    _, records, asked, _, _ = outcomes[0]
    assert [r.prompt for r in asked] == ["run look?", "run whoami?"]
    assert records[2].result.output == (
        "before_tool hook raised RuntimeError for 'boom': no prompt for boom"
    )
    assert ("21 C" in records[0].result.output) is ok
    assert_no_leaks()


@pytest.mark.parametrize("editable", [False, True])
def test_a_gate_holds_a_call_with_what_tool_result_pending_gives(editable: bool) -> None:
    gate = require_approval(["look"], editable=editable)
    held = gate.verdict("look", {"city": "Paris"}, None)  # type: ignore[attr-defined]
    assert isinstance(held, ToolResult)
    request = held.metadata["pending"] if held.metadata else None
    assert isinstance(request, Request)
    assert held == ToolResult.pending(request)
