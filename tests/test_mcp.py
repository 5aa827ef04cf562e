"""MCP servers in the toolkit: config, stdio and streamable HTTP, results, status, leaks.

The servers are real: tests/mcp_servers/demo.py, written with the SDK's own server API,
started over stdio by the toolkit or over HTTP on loopback by the test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.conftest import assert_no_leaks
from tests.mcp_servers.fixtures import child_pids, config, http_server, stdio_server
from toolnexus_async import LlmClient, Toolkit, ToolReturn, UsageError, define_tool
from toolnexus_async.mcp import load_config, parse_config
from toolnexus_async.mcp._tool import tool_name
from toolnexus_async.testing import reply, tool_call

# -- config ----------------------------------------------------------------------------


def test_the_config_reads_every_spelling_of_upstreams_format():
    servers = parse_config(
        {
            "servers": {
                "files": {"command": "mcp-files", "args": ["/tmp"], "env": {"A": "1"}},
                "api": {"url": "https://example.com/mcp", "headers": {"X": "${TOKEN}"}},
                "old": {"type": "local", "command": ["x"], "disabled": True, "timeout": 500},
                "some": {"command": ["y"], "tools": {"echo": True}},
            }
        }
    )
    files, api, old, some = servers
    assert (files.type, files.command, dict(files.environment)) == (
        "local",
        ("mcp-files", "/tmp"),
        {"A": "1"},
    )
    assert (api.type, api.url, api.timeout) == ("remote", "https://example.com/mcp", 30.0)
    assert (old.enabled, old.timeout) == (False, 0.5)
    assert some.exposes("echo") and not some.exposes("add")
    drop = parse_config({"s": {"command": ["y"], "tools": {"echo": False}}})[0]
    assert not drop.exposes("echo") and drop.exposes("add")
    # A raw server map: the sibling sections of other ports are not servers.
    raw = parse_config(
        {"builtins": {}, "agents": {}, "a2a": {}, "mcpServer": {}, "s": stdio_server()}
    )
    assert [s.name for s in raw] == ["s"]


def test_header_and_environment_values_never_appear_in_a_repr():
    [api] = parse_config(
        {"api": {"url": "https://e.com/mcp", "headers": {"Auth": "Bearer s3cr3t"}}}
    )
    assert "s3cr3t" not in repr(api) and "Auth" in repr(api)


@pytest.mark.parametrize(
    ("server", "problem"),
    [
        ({"command": 3}, "'s': command must be a list"),
        ({}, "'s': needs a command"),
        ({"url": "ftp://x"}, "'s': url must be an http"),
        ({"command": ["x"], "timeout": -1}, "'s': timeout must be a positive"),
        ({"command": ["x"], "colour": "red"}, "'s': unknown field"),
        ({"command": ["x"], "enabled": "yes"}, "'s': enabled must be true or false"),
        ({"url": "http://x", "env": {"A": "b"}}, "'s': a remote server takes url"),
        ({"command": ["x"], "env": {"A": 1}}, "'s': environment must map"),
    ],
)
def test_a_wrong_config_names_the_server_and_the_field(server: Any, problem: str):
    with pytest.raises(UsageError, match=problem):
        parse_config({"mcpServers": {"s": server}})


def test_a_config_file_is_read_and_a_bad_one_is_named(tmp_path: Path):
    good = tmp_path / "mcp.json"
    good.write_text(json.dumps(config(demo=stdio_server())))
    assert [s.name for s in load_config(good)] == ["demo"]
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(UsageError, match=r"bad.json.*not JSON"):
        load_config(bad)
    with pytest.raises(UsageError, match="cannot read"):
        load_config(tmp_path / "absent.json")


def test_names_are_sanitised_kept_within_64_and_distinct():
    assert tool_name("my server", "get.item") == "my_server_get_item"
    long = tool_name("s" * 50, "t" * 50)
    assert len(long) == 64 and long == tool_name("s" * 50, "t" * 50)
    assert long != tool_name("s" * 50, "t" * 49 + "u")
    taken = {"a_b_c"}
    assert tool_name("a", "b.c", taken) != "a_b_c" and tool_name("a", "b.c", taken).startswith(
        "a_b_c_"
    )


def test_wait_for_without_mcp_is_refused():
    async def answer(request: Any) -> Any:
        raise AssertionError

    with pytest.raises(UsageError, match="pass mcp= too"):
        Toolkit.create(builtins=False, wait_for=answer)


# -- servers ---------------------------------------------------------------------------


async def check_demo(tk: Toolkit, prefix: str = "demo") -> None:
    for name in ("echo", "add", "stats", "fail", "book"):
        assert f"{prefix}_{name}" in tk
    tool = tk.get(f"{prefix}_add")
    assert tool is not None and tool.source == "mcp" and tool.description == "Add two integers."
    assert tool.input_schema["required"] == ["a", "b"]
    added = await tk.execute(f"{prefix}_add", {"a": 2, "b": 3})
    assert (added.output, added.is_error) == ("5", False)
    stats = await tk.execute(f"{prefix}_stats", {"numbers": [1, 2, 3]})
    assert json.loads(stats.output) == {"count": 3, "sum": 6.0} and not stats.is_error
    failed = await tk.execute(f"{prefix}_fail", {"reason": "testing"})
    assert failed.is_error and "failed on purpose: testing" in failed.output
    invalid = await tk.execute(f"{prefix}_add", {"a": "two"})
    assert invalid.is_error and "did not run" in invalid.output  # checked before the call


async def test_a_stdio_server_lists_and_calls_its_tools_and_leaves_nothing_behind(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setenv("TNX_MCP_SECRET", "s3cr3t-value")
    before = child_pids()
    server = stdio_server(DEMO_SECRET="${TNX_MCP_SECRET}", DEMO_NAME="demo")
    tk = Toolkit.create(builtins=False, mcp=config(demo=server))
    assert tk.mcp_status["demo"].error == "not started" and "demo_echo" not in tk
    async with tk:
        assert len(child_pids() - before) == 1  # the server process
        status = tk.mcp_status["demo"]
        assert (status.state, status.protocol, status.error) == ("connected", "2026-07-28", None)
        assert "demo_echo" in status.tools
        await check_demo(tk)
        # A value the server got from a ${NAME} is a secret; a literal one ("demo") is not.
        echoed = await tk.execute("demo_echo", {"text": "demo key=s3cr3t-value"})
        assert echoed.output == "demo key=[redacted]"
        tool = tk.get("demo_echo")
    assert child_pids() == before
    assert_no_leaks()
    assert tool is not None
    gone = await tool.execute({"text": "hi"})
    assert gone.is_error and "not available" in gone.output


async def test_a_streamable_http_server_with_expanded_headers(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("DEMO_TOKEN", "tok-123")
    with http_server() as url:
        remote = {"url": url, "headers": {"Authorization": "Bearer ${DEMO_TOKEN}"}}
        async with Toolkit.create(builtins=False, mcp=config(web=remote)) as tk:
            assert tk.mcp_status["web"].state == "connected"
            await check_demo(tk, "web")
            who = await tk.execute("web_whoami", {})
            # The header reached the server; the echoed secret is scrubbed from the result.
            assert who.output == "[redacted]"
    assert_no_leaks()


async def test_a_failing_server_is_reported_and_the_rest_of_the_toolkit_works(tmp_path: Path):
    servers = config(
        demo=stdio_server(DEMO_PAGE_SIZE="3"),  # its tools come in pages of three
        broken={"command": [sys.executable, "-c", "import sys; sys.exit(3)"], "timeout": 5000},
        missing={"command": [str(tmp_path / "no-such-program")]},
        secret={"url": "http://127.0.0.1:9/mcp", "headers": {"A": "${TNX_UNSET_VARIABLE}"}},
        off={"command": ["never-started"], "enabled": False},
        slow={"command": [sys.executable, "-c", "import time; time.sleep(60)"], "timeout": 300},
    )
    before = child_pids()
    os.environ.pop("TNX_UNSET_VARIABLE", None)
    async with Toolkit.create(builtins=False, mcp=servers) as tk:
        status = tk.mcp_status
        assert {name: s.state for name, s in status.items()} == {
            "demo": "connected",
            "broken": "failed",
            "missing": "failed",
            "secret": "failed",
            "off": "disabled",
            "slow": "failed",
        }
        assert "TNX_UNSET_VARIABLE is not set" in (status["secret"].error or "")
        assert "timed out after 0.3 s" in (status["slow"].error or "")
        assert status["missing"].tools == () and "no-such-program" in (
            status["missing"].error or ""
        )
        await check_demo(tk)
        assert len(status["demo"].tools) == 15  # every page of three was read
        # A server that dies mid-call: an error result, then its status says so, and the
        # next call starts it again.
        crashed = await tk.execute("demo_crash", {})
        assert crashed.is_error and "Connection closed" in crashed.output
        assert "its session ended during the call" in crashed.output
        gone = tk.mcp_status["demo"]
        assert (gone.state, gone.ended) == ("failed", "its process ended")
        assert "the next call connects again" in (gone.error or "")
        after = await tk.execute("demo_echo", {"text": "hi"})
        assert (after.output, after.is_error) == ("hi", False)
        back = tk.mcp_status["demo"]
        assert (back.state, back.reconnects, back.ended) == ("connected", 1, "its process ended")
    assert child_pids() == before
    assert_no_leaks()


async def test_tools_are_chosen_per_server_never_replace_a_tool_and_a_model_calls_them(
    caplog: pytest.LogCaptureFixture,
):
    chosen = {"add": True, "echo": True, "nosuch": True}
    servers = config(demo={**stdio_server(), "tools": chosen})

    @define_tool(name="demo_echo")
    async def mine(text: str) -> str:
        """Mine."""
        return "mine"

    def model(messages: list[Any], tools: list[Any]) -> Any:
        if isinstance(messages[-1], ToolReturn):
            return f"the sum is {messages[-1].output}"
        return reply(tool_call("demo_add", {"a": 20, "b": 22}))

    async with (
        Toolkit.create(builtins=False, extra_tools=[mine], mcp=servers) as tk,
        LlmClient.in_process(model) as client,
    ):
        assert sorted(t.name for t in tk.tools()) == ["demo_add", "demo_echo"]
        assert (await tk.execute("demo_echo", {"text": "x"})).output == "mine"
        assert tk.mcp_status["demo"].tools == ("demo_add",)
        done = await client.run("add", tk)
    assert done.text == "the sum is 42"
    assert "MCP server 'demo' has no tool 'nosuch'" in caplog.text


def test_without_the_sdk_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "mcp", None)  # what an absent package looks like
    with pytest.raises(UsageError, match=r"pip install -e '\.\[mcp\]' in the toolnexus-async"):
        Toolkit.create(builtins=False, mcp={"s": {"command": ["x"]}})


def test_importing_the_package_does_not_import_the_sdk():
    check = "import sys, toolnexus_async, toolnexus_async.mcp; assert 'mcp' not in sys.modules"
    done = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr


async def test_cancelled_while_connecting_leaves_no_process_or_task_behind():
    before = child_pids()
    slow = {"command": [sys.executable, "-c", "import time; time.sleep(60)"]}
    tk = Toolkit.create(builtins=False, mcp=config(slow=slow))
    with anyio.move_on_after(1) as scope:
        await tk.start()
    assert scope.cancelled_caught
    await tk.aclose()
    assert child_pids() == before
    assert_no_leaks()
