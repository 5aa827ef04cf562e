"""Security settings fail closed: a setting that decides what runs unasked, given the wrong
type or a name that is no tool, is a ``UsageError`` naming what is known, never a setting
that quietly guards nothing (issue 33).

``require_approval`` is checked when it is built, against a toolkit given up front, and
against the run's toolkit when a run starts (where the tool must not run). The built-in
switches of ``Toolkit.create``, an MCP server's ``tools`` drop-list and the inbox's
``allowed_hosts`` follow the same rule. Tools and servers are real; the model is scripted.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.conftest import assert_no_leaks
from tests.mcp_servers.fixtures import config, stdio_server
from toolnexus_async import (
    Answer,
    Hooks,
    LlmClient,
    Request,
    Toolkit,
    UsageError,
    define_tool,
    require_approval,
)
from toolnexus_async.durable import MemoryRunStore
from toolnexus_async.serve import create_app, new_token
from toolnexus_async.serve.demo import demo_client, serve_demo_tools
from toolnexus_async.testing import ScriptedModel, reply, tool_call

LIMIT = 10  # seconds; only reached when the rule under test is broken


def pay_tool(paid: list[dict[str, Any]]) -> Any:
    @define_tool
    async def pay(amount: int) -> str:
        """Pay ``amount``."""
        paid.append({"amount": amount})
        return f"paid {amount}"

    return pay


# --- require_approval: what it is given ------------------------------------------------------


@pytest.mark.parametrize("tools", ["pay", b"pay"])
def test_require_approval_refuses_a_string(tools: Any) -> None:
    """Iterated, "pay" would guard the tools "p", "a" and "y", and pay would run unasked."""
    with pytest.raises(UsageError, match=r"pass a list of tool names.*require_approval\(\["):
        require_approval(tools)


@pytest.mark.parametrize("tools", [[], (), set()])
def test_require_approval_refuses_an_empty_list(tools: Any) -> None:
    with pytest.raises(UsageError, match="no tool names, so it would guard nothing"):
        require_approval(tools)


@pytest.mark.parametrize("item", [3, None, b"pay", ["pay"]])
def test_require_approval_refuses_a_name_that_is_not_a_string(item: Any) -> None:
    with pytest.raises(UsageError, match=r"a tool name must be a str, got"):
        require_approval(["pay", item])


def test_require_approval_refuses_what_is_not_a_list() -> None:
    with pytest.raises(UsageError, match="got int; pass a list of tool names"):
        require_approval(5)  # type: ignore[arg-type]


# --- require_approval: names that are no tool -------------------------------------------------


def test_require_approval_given_a_toolkit_refuses_an_unknown_name_at_once() -> None:
    toolkit = Toolkit(tools=[pay_tool([])])
    with pytest.raises(UsageError) as raised:
        require_approval(["pya"], toolkit=toolkit)
    message = str(raised.value)
    assert "'pya'" in message and "the tools are: 'pay'" in message
    gate = require_approval(["pay"], toolkit=toolkit)  # a name the toolkit has is fine
    assert gate is not None


def test_require_approval_toolkit_must_be_a_toolkit() -> None:
    with pytest.raises(UsageError, match="toolkit must be a Toolkit, got list"):
        require_approval(["pay"], toolkit=["pay"])  # type: ignore[arg-type]


async def run_gated(gate: Any, paid: list[dict[str, Any]], entry: str) -> ScriptedModel:
    """A run whose model calls ``pay``, behind ``gate``, approved at once if asked."""

    async def approve(request: Request) -> Answer:
        return Answer(request.id, True)

    model = ScriptedModel(reply(tool_call("pay", {"amount": 30})), "paid")
    with anyio.fail_after(LIMIT):
        async with (
            Toolkit.create(builtins=False, extra_tools=[pay_tool(paid)]) as toolkit,
            LlmClient.in_process(model, hooks=Hooks(before_tool=gate), wait_for=approve) as client,
        ):
            if entry == "run":
                await client.run("pay the bill", toolkit)
            elif entry == "stream":
                async with client.stream("pay the bill", toolkit) as events:
                    async for _ in events:
                        pass
            else:
                async with client.start("pay the bill", toolkit) as run:
                    await run.result()
    return model


@pytest.mark.parametrize("entry", ["run", "stream", "start"])
async def test_an_unknown_name_met_at_run_time_fails_the_run_before_the_tool_runs(
    entry: str,
) -> None:
    """The gate meets its toolkit when the run starts: the run fails with UsageError
    naming the tools there; the model is not asked and pay never runs."""
    paid: list[dict[str, Any]] = []
    with pytest.raises(UsageError) as raised:
        await run_gated(require_approval(["pya"]), paid, entry)
    assert "'pya'" in str(raised.value) and "the tools are: 'pay'" in str(raised.value)
    assert paid == []
    assert_no_leaks()


async def test_a_gate_naming_its_tools_right_still_asks_and_runs() -> None:
    paid: list[dict[str, Any]] = []
    model = await run_gated(require_approval(["pay"]), paid, "run")
    assert paid == [{"amount": 30}] and len(model.requests) == 2


async def test_an_unknown_name_is_refused_by_each_run_with_its_own_toolkit() -> None:
    """One client, two toolkits: the run on the toolkit without the tool fails."""
    paid: list[dict[str, Any]] = []
    gate = require_approval(["pay"])
    model = ScriptedModel("nothing to pay", "nothing to pay")
    async with (
        Toolkit.create(builtins=False, extra_tools=[pay_tool(paid)]) as with_pay,
        Toolkit.create(builtins=False) as without,
        LlmClient.in_process(model, hooks=Hooks(before_tool=gate)) as client,
    ):
        assert (await client.run("hi", with_pay)).status == "done"
        with pytest.raises(UsageError, match="'pay', which the toolkit does not have"):
            await client.run("hi", without)
    assert len(model.requests) == 1  # the failing run asked the model nothing


# --- Toolkit.create(builtins=...) ------------------------------------------------------------


@pytest.mark.parametrize("switch", [0, None, "off", "false"])
def test_a_builtin_switch_that_is_not_a_bool_is_refused(switch: Any) -> None:
    """Read as "anything but False is on", {"bash": 0} left bash on."""
    with pytest.raises(UsageError, match=r"builtins\['tools'\]\['bash'\] must be True or False"):
        Toolkit.create(builtins={"tools": {"bash": switch}})


def test_an_unknown_builtin_is_refused_naming_the_builtins() -> None:
    with pytest.raises(UsageError, match=r"built-in tool\(s\): bsh; the built-ins are bash, read"):
        Toolkit.create(builtins={"tools": {"bsh": False}})


# --- an MCP server's tools list ---------------------------------------------------------------


async def test_an_mcp_drop_list_naming_no_tool_of_the_server_fails_the_server(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """{"eco": False} meant echo: loading the server would let echo run. It fails instead,
    its status naming the tools it offers, and none of its tools is loaded."""
    servers = config(demo={**stdio_server(), "tools": {"eco": False}})
    with anyio.fail_after(LIMIT):
        async with Toolkit.create(builtins=False, mcp=servers) as toolkit:
            status = toolkit.mcp_status["demo"]
            assert status.state == "failed" and status.tools == ()
            assert status.error is not None
            assert "drops 'eco', which it does not offer" in status.error
            assert "'echo'" in status.error
            assert len(toolkit) == 0
    assert "MCP server 'demo' failed: its tools list drops 'eco'" in caplog.text
    assert_no_leaks()


async def test_an_mcp_drop_list_naming_the_servers_tools_loads_the_rest() -> None:
    servers = config(demo={**stdio_server(), "tools": {"echo": False}})
    with anyio.fail_after(LIMIT):
        async with Toolkit.create(builtins=False, mcp=servers) as toolkit:
            assert toolkit.mcp_status["demo"].state == "connected"
            assert "demo_add" in toolkit and "demo_echo" not in toolkit


# --- the inbox's allowed_hosts ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("hosts", "problem"),
    [
        ("wiki", "must be a list of host names, got the string 'wiki'"),
        ([5], r"a host name \(a str\), got 5"),
    ],
)
def test_allowed_hosts_refuses_a_string_and_a_name_that_is_not_one(
    hosts: Any, problem: str
) -> None:
    """Iterated, "wiki" would allow the hosts "w", "i" and "k"."""
    with pytest.raises(UsageError, match=problem):
        create_app(
            make_client=demo_client,
            toolkit=Toolkit.create(builtins=False, extra_tools=serve_demo_tools()),
            store=MemoryRunStore(),
            token=new_token(),
            allowed_hosts=hosts,
        )
