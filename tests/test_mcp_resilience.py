"""MCP servers as they fail: replies too large, processes killed, calls that hang, tool
lists that change, and what reaches the model from a result that is not text.

The server is tests/mcp_servers/demo.py (the SDK's own ``MCPServer``), over stdio started
by the toolkit or over streamable HTTP on loopback started by the test. The reference
server from npm gets the same checks in tests/test_mcp_everything.py.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
import pytest

from tests.conftest import assert_no_leaks
from tests.mcp_servers.agent import model
from tests.mcp_servers.fixtures import child_pids, config, http_server, stdio_server
from toolnexus_async import Answer, LlmClient, Request, Toolkit, UsageError
from toolnexus_async.mcp import parse_config
from toolnexus_async.mcp._tool import McpTool

LIMIT = 60  # seconds any of these tests may take; each wait below is far shorter
MIB = 1024 * 1024


def connection_of(tk: Toolkit, name: str) -> Any:
    tool = tk.get(name)
    assert isinstance(tool, McpTool)
    return tool.connection


def _exited(pid: int) -> None:
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    except ChildProcessError:
        pass  # already reaped: it has exited


async def wait_exited(pid: int) -> None:
    """Wait until the process ``pid`` (a child of this one) has exited, without reaping
    it: the event loop's child watcher reaps it for the SDK that started it."""
    await anyio.to_thread.run_sync(_exited, pid, abandon_on_cancel=True)


@asynccontextmanager
async def signals(path: Path) -> AsyncIterator[anyio.abc.ObjectReceiveStream[str]]:
    """What the demo server's ``hang`` says on the Unix socket ``path`` (DEMO_SIGNAL)."""
    send, receive = anyio.create_memory_object_stream[str](16)

    async def serve(listener: anyio.abc.SocketListener) -> None:
        async with listener:
            while True:
                peer = await listener.accept()
                async with peer:
                    await send.send((await peer.receive()).decode().strip())

    async with anyio.create_task_group() as group, send, receive:
        group.start_soon(serve, await anyio.create_unix_listener(path))
        yield receive
        group.cancel_scope.cancel()


def test_the_new_limits_are_read_from_the_config_and_checked():
    [plain] = parse_config({"s": {"url": "http://x/mcp"}})
    assert (plain.call_timeout, plain.max_reply) == (300.0, 16 * MIB)
    [tuned] = parse_config({"s": {"url": "http://x/mcp", "callTimeout": 0, "maxReplyBytes": 9}})
    assert (tuned.call_timeout, tuned.max_reply) == (None, 9)
    [local] = parse_config({"s": {"command": ["x"], "callTimeout": 1500}})
    assert local.call_timeout == 1.5
    for server, problem in [
        ({"command": ["x"], "callTimeout": -1}, "callTimeout must be a number"),
        ({"command": ["x"], "callTimeout": True}, "callTimeout must be a number"),
        ({"url": "http://x", "maxReplyBytes": 0}, "maxReplyBytes must be a positive"),
        ({"url": "http://x", "maxReplyBytes": 1.5}, "maxReplyBytes must be a positive"),
        ({"command": ["x"], "maxReplyBytes": 10}, "maxReplyBytes bounds a remote"),
    ]:
        with pytest.raises(UsageError, match=f"'s': {problem}"):
            parse_config({"s": server})


async def test_a_reply_over_the_limit_fails_that_call_and_the_session_lives_on():
    with http_server() as url, anyio.fail_after(LIMIT):
        servers = config(
            web={"url": url},  # the default limit, 16 MiB
            small={"url": url, "maxReplyBytes": 64 * 1024},
        )
        async with Toolkit.create(builtins=False, mcp=servers) as tk:
            big = await tk.execute("web_big", {"size": 2 * MIB})
            assert (len(big.output), big.is_error) == (2 * MIB, False)
            after = await tk.execute("web_echo", {"text": "after"})
            assert (after.output, after.is_error) == ("after", False)

            over = await tk.execute("small_big", {"size": 100_000})
            assert over.is_error and "MCP tool 'big' of server 'small'" in over.output
            assert "exceeded the 65536 byte limit" in over.output
            still = await tk.execute("small_echo", {"text": "still here"})
            assert (still.output, still.is_error) == ("still here", False)
            status = tk.mcp_status["small"]
            assert (status.state, status.reconnects, status.ended) == ("connected", 0, None)
            assert status.transport == "streamable-http"
    assert_no_leaks()


async def test_a_killed_server_process_is_started_again_by_the_next_call():
    before = child_pids()
    with anyio.fail_after(LIMIT):
        async with Toolkit.create(builtins=False, mcp=config(demo=stdio_server())) as tk:
            [pid] = child_pids() - before
            os.kill(pid, signal.SIGKILL)
            await wait_exited(pid)
            # Whether or not the toolkit has read the end of its output yet, the next
            # call works: on a new process.
            again = await tk.execute("demo_echo", {"text": "again"})
            assert (again.output, again.is_error) == ("again", False)
            status = tk.mcp_status["demo"]
            assert (status.state, status.reconnects) == ("connected", 1)
            assert status.ended == "its process ended"
            [new_pid] = child_pids() - before
            assert new_pid != pid
            added = await tk.execute("demo_add", {"a": 1, "b": 2})
            assert added.output == "3"
    assert child_pids() == before
    assert_no_leaks()


async def test_start_connects_again_a_server_that_failed(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("TNX_DEMO_LATER", raising=False)
    server = stdio_server(DEMO_NAME="${TNX_DEMO_LATER}")
    with anyio.fail_after(LIMIT):
        async with Toolkit.create(builtins=False, mcp=config(demo=server)) as tk:
            assert tk.mcp_status["demo"].state == "failed" and "demo_echo" not in tk
            monkeypatch.setenv("TNX_DEMO_LATER", "later")
            await tk.start()
            status = tk.mcp_status["demo"]
            assert (status.state, status.reconnects) == ("connected", 0)
            assert (await tk.execute("demo_echo", {"text": "hi"})).output == "hi"
    assert_no_leaks()


async def test_reconnecting_is_bounded_and_start_tries_again_at_once(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setenv("TNX_DEMO_NAME", "demo")
    server = stdio_server(DEMO_NAME="${TNX_DEMO_NAME}")
    before = child_pids()
    with anyio.fail_after(LIMIT):
        async with Toolkit.create(builtins=False, mcp=config(demo=server)) as tk:
            [pid] = child_pids() - before
            # The variable goes: the server can no longer be started.
            monkeypatch.delenv("TNX_DEMO_NAME")
            os.kill(pid, signal.SIGKILL)
            await wait_exited(pid)
            # echo only reads (readOnlyHint): sent on a dead process before the toolkit
            # read its end, it is sent again after connecting, which fails here.
            failed = await tk.execute("demo_echo", {"text": "hi"})
            assert failed.is_error and "the server is not available" in failed.output
            assert "TNX_DEMO_NAME is not set" in failed.output
            assert "(after 3 attempts)" in failed.output
            # Calls in the cool-down fail at once, saying when it is tried again.
            soon = await tk.execute("demo_add", {"a": 1, "b": 2})
            assert soon.is_error and "it is tried again in 30 s" in soon.output
            status = tk.mcp_status["demo"]
            assert status.state == "failed" and status.tools  # its tools wait for it
            # start() does not wait for the cool-down.
            monkeypatch.setenv("TNX_DEMO_NAME", "demo")
            await tk.start()
            assert (await tk.execute("demo_add", {"a": 1, "b": 2})).output == "3"
            assert tk.mcp_status["demo"].reconnects == 1
    assert child_pids() == before
    assert_no_leaks()


async def test_a_persons_time_on_an_inline_question_is_not_the_calls(tmp_path: Path):
    async def slow_person(request: Request) -> Answer:
        await anyio.sleep(1.0)  # a person slower than the call's whole limit
        return Answer(request.id, True, {"seat": "window"})

    server = {**stdio_server(DEMO_LEGACY="1"), "callTimeout": 500}
    with anyio.fail_after(LIMIT):
        async with Toolkit.create(
            builtins=False, mcp=config(demo=server), wait_for=slow_person
        ) as tk:
            booked = await tk.execute("demo_book", {"city": "Oslo"})
            assert (booked.output, booked.is_error) == ("booked Oslo, seat window", False)
    assert_no_leaks()


async def test_a_hung_call_is_cut_at_its_limit_and_the_server_is_told(tmp_path: Path):
    path = tmp_path / "signal.sock"
    server = {**stdio_server(DEMO_SIGNAL=str(path)), "callTimeout": 300}
    with anyio.fail_after(LIMIT):
        async with (
            signals(path) as heard,
            Toolkit.create(builtins=False, mcp=config(demo=server)) as tk,
            LlmClient.in_process(model) as client,
        ):
            cut = await tk.execute("demo_hang", {})
            assert cut.is_error
            assert cut.output == (
                "MCP tool 'hang' of server 'demo': no answer within 0.3 s (its callTimeout); "
                "the server was told to cancel the call"
            )
            assert [await heard.receive(), await heard.receive()] == ["started", "cancelled"]
            # The session lives on.
            assert (await tk.execute("demo_echo", {"text": "on"})).output == "on"

            # A run cancelled mid-call tells the server too.
            async with anyio.create_task_group() as group:
                group.start_soon(client.run, "demo_hang {}", tk)
                assert await heard.receive() == "started"
                group.cancel_scope.cancel()
            assert await heard.receive() == "cancelled"
            assert tk.mcp_status["demo"].state == "connected"
    assert_no_leaks()


@pytest.mark.parametrize("legacy", [False, True], ids=["2026-07-28", "2025-11-25"])
async def test_a_changed_tool_list_is_read_again(legacy: bool):
    server = stdio_server(DEMO_LEGACY="1") if legacy else stdio_server()
    with anyio.fail_after(LIMIT):
        async with Toolkit.create(builtins=False, mcp=config(demo=server)) as tk:
            assert "demo_pair" in tk and "demo_extra" not in tk
            listing = connection_of(tk, "demo_grow").next_listing()
            assert (await tk.execute("demo_grow", {})).output == "grown"
            await listing.wait()
            assert "demo_extra" in tk and "demo_pair" not in tk
            assert "demo_extra" in tk.mcp_status["demo"].tools
            assert (await tk.execute("demo_extra", {})).output == "extra here"
            names = [tool.name for tool in tk.tools()]
            assert names.index("demo_echo") == 0  # the tools it kept kept their places
    assert_no_leaks()


async def test_resource_links_and_embedded_resources_reach_the_model():
    with anyio.fail_after(LIMIT):
        async with (
            Toolkit.create(builtins=False, mcp=config(demo=stdio_server())) as tk,
            LlmClient.in_process(model) as client,
        ):
            done = await client.run("demo_links {}", tk)
    assert done.text == (  # the agent's model ends with what the tool returned it
        "two resources\n"
        '[resource_link file:///srv/reports/q3.csv name="Q3 report" type=text/csv]\n'
        "[resource memo://today type=text/markdown]\n# Memo"
    )


async def test_schema_defaults_fill_what_an_accepted_form_leaves_out(tmp_path: Path):
    log = tmp_path / "outcomes.jsonl"
    asked: list[Request] = []

    async def person(request: Request) -> Answer:
        asked.append(request)
        return Answer(request.id, True, {"seat": "aisle", "bags": 2})

    legacy = stdio_server(DEMO_LEGACY="1", DEMO_OUTCOMES=str(log))
    modern = stdio_server(DEMO_OUTCOMES=str(log))
    with anyio.fail_after(LIMIT):
        # An older server asks inline: the toolkit's wait_for answers.
        async with Toolkit.create(builtins=False, mcp=config(demo=legacy), wait_for=person) as tk:
            assert (await tk.execute("demo_prefs", {})).output == "prefs: accept"
        # A 2026-07-28 server's question is a suspension: the run's wait_for answers.
        async with (
            Toolkit.create(builtins=False, mcp=config(demo=modern)) as tk,
            LlmClient.in_process(model, wait_for=person) as client,
        ):
            done = await client.run("demo_prefs {}", tk)
        assert done.text == "prefs: accept"
    filled = {"seat": "aisle", "meal": "vegetarian", "bags": 2}
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert records == [{"tool": "prefs", "action": "accept", "content": filled}] * 2
    schemas = [(request.data or {})["schema"] for request in asked]
    assert [schema["properties"]["meal"]["default"] for schema in schemas] == ["vegetarian"] * 2
