"""Tool sources composed into a toolkit: order, names, opening, closing, and leaks.

The sources are real: your functions, an HTTP tool against a loopback server, the
built-ins, and the demo MCP server of tests/mcp_servers started over stdio by the toolkit.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, ClassVar

import anyio
import pytest
from aiohttp import web

from tests.conftest import assert_no_leaks
from tests.mcp_servers.fixtures import child_pids, config, stdio_server
from tests.shared import loopback
from toolnexus_async import (
    BuiltinTools,
    HttpTools,
    LlmClient,
    NativeTools,
    Tool,
    Toolkit,
    ToolResult,
    ToolReturn,
    ToolSource,
    UsageError,
    define_tool,
    http_tool,
    require_approval,
)
from toolnexus_async.mcp import McpTools
from toolnexus_async.testing import reply, tool_call
from toolnexus_async.tools.builtin import BUILTIN_NAMES

DEMO = config(demo={**stdio_server(), "tools": {"echo": True, "add": True}})


def shout(text: str) -> str:
    """Say it louder."""
    return text.upper()


def named(name: str, answer: str = "mine") -> Tool:
    async def fn() -> str:
        return answer

    return define_tool(name=name, description=f"The tool {name}.")(fn)


class Recorded:
    """A user-written source: offers ``tools``, and writes down its opening and closing."""

    def __init__(self, name: str, log: list[str], *tools: Tool, fail: bool = False) -> None:
        self.name, self.log, self.fail = name, log, fail
        self._tools = list(tools)

    async def __aenter__(self) -> Recorded:
        if self.fail:
            self.log.append(f"{self.name} failed")
            raise OSError(f"{self.name} cannot open")
        self.log.append(f"{self.name} opened")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.log.append(f"{self.name} closed")

    def tools(self) -> Sequence[Tool]:
        return self._tools

    def __repr__(self) -> str:
        return f"Recorded({self.name})"


class Live(Recorded):
    """A user-written live source: its tools change while it is open."""

    changed: Callable[[], None] | None = None

    def watch(self, changed: Callable[[], None]) -> None:
        self.changed = changed

    def offer(self, *tools: Tool) -> None:
        self._tools = list(tools)
        assert self.changed is not None
        self.changed()


async def test_several_sources_compose_in_order_and_a_model_calls_them():
    """Functions, an HTTP tool, two built-ins and an MCP server: one toolkit, the tools in
    the sources' order; leaving closes the server's process and every session."""
    before = child_pids()

    async def weather(request: web.Request) -> web.Response:
        return web.Response(text=f"sunny in {request.match_info['city']}")

    app = web.Application()
    app.router.add_get("/weather/{city}", weather)

    def model(messages: list[Any], tools: list[Any]) -> Any:
        if isinstance(messages[-1], ToolReturn):
            return f"the sum is {messages[-1].output}"
        return reply(tool_call("demo_add", {"a": 20, "b": 22}))

    async with loopback(app) as url:
        forecast = http_tool(
            "forecast",
            "The weather in a city.",
            "GET",
            url + "/weather/{city}",
            {"type": "object", "properties": {"city": {"type": "string"}}},
            allow_hosts=["127.0.0.1"],
        )
        builtins = BuiltinTools(
            disable=[n for n in BUILTIN_NAMES if n not in ("read", "todowrite")]
        )
        async with (
            Toolkit.compose(
                NativeTools(shout), HttpTools(forecast), builtins, McpTools(DEMO)
            ) as tk,
            LlmClient.in_process(model) as client,
        ):
            assert [t.name for t in tk.tools()] == [
                "shout",
                "forecast",
                "read",
                "todowrite",
                "demo_echo",
                "demo_add",
            ]
            assert (await tk.execute("shout", {"text": "hi"})).output == "HI"
            assert (await tk.execute("forecast", {"city": "Oslo"})).output == "sunny in Oslo"
            assert (await tk.execute("demo_echo", {"text": "x"})).output == "x"
            assert tk.mcp_status["demo"].tools == ("demo_echo", "demo_add")
            done = await client.run("add", tk)
            assert done.text == "the sum is 42"
        assert builtins.session.closed
    with pytest.raises(UsageError, match="this toolkit is closed"):
        await tk.execute("shout", {"text": "hi"})
    assert child_pids() == before
    assert_no_leaks()


async def test_a_user_written_source_opens_in_order_and_closes_in_reverse():
    log: list[str] = []
    first = Recorded("first", log, named("a"))
    second = Recorded("second", log, named("b", "theirs"))
    assert isinstance(first, ToolSource)
    async with Toolkit.compose(first, second) as tk:
        assert log == ["first opened", "second opened"]
        assert tk.sources == (first, second)
        assert (await tk.execute("b", {})).output == "theirs"
    assert log == ["first opened", "second opened", "second closed", "first closed"]


async def test_a_live_source_changes_in_place_and_never_takes_a_name(
    caplog: pytest.LogCaptureFixture,
):
    """A live source's tools are read again when it says so: a tool it still offers keeps
    its place, a new one comes last, and one with a taken name is left out, with a
    warning."""
    log: list[str] = []
    live = Live("live", log, named("x"), named("y"))
    async with Toolkit.compose(live, NativeTools(named("mine"))) as tk:
        assert [t.name for t in tk.tools()] == ["x", "y", "mine"]
        live.offer(named("y", "new y"), named("mine", "theirs"), named("z"))
        assert [t.name for t in tk.tools()] == ["y", "mine", "z"]
        assert (await tk.execute("y", {})).output == "new y"
        assert (await tk.execute("mine", {})).output == "mine"
        assert tk.specs == tuple(tk.tools())
    assert "tool 'mine' of Recorded(live) is left out: the name is taken by NativeTools(mine)" in (
        caplog.text
    )


async def test_two_sources_with_one_name_are_refused_and_the_first_is_closed():
    log: list[str] = []
    first = Recorded("first", log, named("same"))
    second = Recorded("second", log, named("same"))
    tk = Toolkit.compose(first, second)
    with pytest.raises(
        UsageError,
        match=r"two tool sources offer a tool named 'same': Recorded\(first\) and "
        r"Recorded\(second\)",
    ):
        async with tk:
            pass
    assert log == ["first opened", "second opened", "second closed", "first closed"]
    with pytest.raises(UsageError, match="this toolkit is closed"):
        await tk.execute("same", {})
    with pytest.raises(UsageError, match="given two tools named 'same'"):
        NativeTools(named("same"), named("same"))
    # A tool registered directly holds its name too.
    direct = Toolkit.compose(NativeTools(named("same")))
    direct.register(named("same"))
    with pytest.raises(UsageError, match="a tool registered directly and NativeTools"):
        await direct.start()


async def test_a_failing_source_closes_the_open_ones_and_leaves_nothing_behind():
    """The MCP server opened before the failing source is closed (its process gone), the
    source after it is never opened, and the error names the source."""
    before = child_pids()
    log: list[str] = []
    mcp = McpTools(DEMO)
    tk = Toolkit.compose(
        Recorded("first", log), mcp, Recorded("broken", log, fail=True), Recorded("last", log)
    )
    with pytest.raises(OSError, match="broken cannot open") as raised:
        async with tk:
            pass
    assert "(while opening the tool source Recorded(broken))" in (raised.value.__notes__ or [])
    assert log == ["first opened", "broken failed", "first closed"]
    assert mcp.connections[0].session is None
    assert child_pids() == before
    assert_no_leaks()


async def test_cancelled_while_a_source_opens_nothing_is_left_behind():
    before = child_pids()
    log: list[str] = []
    slow = {"command": [sys.executable, "-c", "import time; time.sleep(60)"]}
    tk = Toolkit.compose(Recorded("first", log), McpTools(config(slow=slow)))
    with anyio.move_on_after(1) as scope:
        await tk.start()
    assert scope.cancelled_caught
    assert log == ["first opened", "first closed"]
    await tk.aclose()
    assert child_pids() == before
    assert_no_leaks()


async def test_a_composed_toolkit_is_refused_before_it_is_entered():
    tk = Toolkit.compose(NativeTools(shout))
    with pytest.raises(UsageError, match="this toolkit is not open yet"):
        await tk.execute("shout", {"text": "hi"})
    with pytest.raises(UsageError, match="this toolkit is not open yet"):
        tk.specs  # noqa: B018 - reading it is the test
    async with tk:
        assert (await tk.execute("shout", {"text": "hi"})).output == "HI"


def test_what_is_not_a_source_is_refused_when_composed():
    with pytest.raises(UsageError, match=r"is not a tool source.*wrap plain tools"):
        Toolkit.compose(shout)  # type: ignore[arg-type]
    source = NativeTools(shout)
    with pytest.raises(UsageError, match="is given twice"):
        Toolkit.compose(source, source)
    with pytest.raises(UsageError, match="unknown built-in tool"):
        BuiltinTools(disable=["nope"])
    with pytest.raises(UsageError, match="http_tool"):
        HttpTools(named("x"))  # type: ignore[arg-type]


async def test_create_is_the_standard_sources_composed():
    """``Toolkit.create`` gives what composing its sources by hand gives: the same tools in
    the same order, rendered alike, the same MCP status."""

    class Mine:
        name, description, source = "bash", "My own bash.", "custom"
        input_schema: ClassVar[dict[str, Any]] = {"type": "object"}

        async def execute(self, args: dict[str, Any], ctx: Any = None) -> ToolResult:
            return ToolResult.ok("mine")

    mine = Mine()
    switches = {"tools": {"webfetch": False, "question": False}}
    async with (
        Toolkit.create(switches, [mine], mcp=DEMO, approve="allow-all") as made,
        Toolkit.compose(
            BuiltinTools(disable=["webfetch", "question", "bash"], approve="allow-all"),
            NativeTools(mine),
            McpTools(DEMO),
        ) as composed,
    ):
        assert [t.name for t in made.tools()] == [t.name for t in composed.tools()]
        assert made.to_openai() == composed.to_openai()
        assert made.mcp_status == composed.mcp_status
        assert (await made.execute("bash", {})).output == "mine"
    assert_no_leaks()


def test_an_approval_for_a_source_not_open_yet_says_when_its_tools_join():
    """``require_approval`` naming an MCP tool of a toolkit not entered yet: the error says
    the sources' tools join when it is entered (the engine asks the registry, not MCP)."""
    tk = Toolkit.create(builtins=False, mcp=DEMO)
    with pytest.raises(UsageError, match=r"\(its sources' tools join when it is entered\)"):
        require_approval(["demo_echo"], toolkit=tk)
    plain = Toolkit.compose(NativeTools(shout))
    with pytest.raises(UsageError, match=r"the tools are: none \(its sources' tools join"):
        require_approval(["shout2"], toolkit=plain)
