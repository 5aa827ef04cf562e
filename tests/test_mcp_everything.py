"""The reference MCP server ``@modelcontextprotocol/server-everything`` (TypeScript SDK,
protocol 2025-11-25), from npm: over stdio, streamable HTTP and the legacy HTTP+SSE
transport, on loopback, started by the tests.

It is installed into tests/node/ by ``npm ci`` (.ci/run); without it these tests skip on a
developer's machine and fail under ``CI=true``.
"""

from __future__ import annotations

import os
import signal

import anyio

from tests.conftest import assert_no_leaks
from tests.mcp_servers.agent import model
from tests.mcp_servers.everything import http_everything, stdio_everything
from tests.mcp_servers.fixtures import child_pids, config
from tests.test_mcp_resilience import wait_exited
from toolnexus_async import LlmClient, Toolkit

LIMIT = 90
MIB = 1024 * 1024


async def test_over_stdio_links_reach_the_model_task_only_tools_are_not_offered_and_a_kill_heals():
    before = child_pids()
    with anyio.fail_after(LIMIT):
        async with (
            Toolkit.create(builtins=False, mcp=config(ev=stdio_everything())) as tk,
            LlmClient.in_process(model) as client,
        ):
            status = tk.mcp_status["ev"]
            assert (status.state, status.protocol, status.transport) == (
                "connected",
                "2025-11-25",
                "stdio",
            )
            # Its research tool needs task mode: not offered, and the status says so.
            assert status.unsupported == ("simulate-research-query",)
            assert "ev_simulate-research-query" not in tk and "ev_echo" in tk

            done = await client.run('ev_get-resource-links {"count": 2}', tk)
            # The URI, name and type of each link, as the server sent them.
            assert done.text.splitlines()[1:] == [
                '[resource_link demo://resource/dynamic/blob/1 name="Blob Resource 1" '
                'type=text/plain description="Resource 1: plaintext resource"]',
                '[resource_link demo://resource/dynamic/text/2 name="Text Resource 2" '
                'type=text/plain description="Resource 2: plaintext resource"]',
            ]

            [pid] = child_pids() - before
            os.kill(pid, signal.SIGKILL)
            await wait_exited(pid)
            again = await tk.execute("ev_echo", {"message": "again"})
            assert (again.output, again.is_error) == ("Echo: again", False)
            assert tk.mcp_status["ev"].reconnects == 1
    assert child_pids() == before
    assert_no_leaks()


async def test_over_http_a_2_mib_result_then_a_call_a_cut_call_then_a_call_a_restart_then_a_call():
    with http_everything() as server, anyio.fail_after(LIMIT):
        servers = config(
            ev={"url": server.url},
            small={"url": server.url, "maxReplyBytes": 64 * 1024},
            short={"url": server.url, "callTimeout": 1000},
        )
        async with Toolkit.create(builtins=False, mcp=servers) as tk:
            status = tk.mcp_status["ev"]
            assert (status.state, status.transport) == ("connected", "streamable-http")
            # The reply is an SSE event of over 2 MiB, past the SDK's default of 1 MiB.
            big = await tk.execute("ev_echo", {"message": "x" * (2 * MIB)})
            assert (len(big.output), big.is_error) == (2 * MIB + len("Echo: "), False)
            after = await tk.execute("ev_echo", {"message": "after"})
            assert (after.output, after.is_error) == ("Echo: after", False)

            # Over a server's own limit: that call fails, the next one works.
            over = await tk.execute("small_echo", {"message": "x" * 100_000})
            assert over.is_error and "exceeded the 65536 byte limit" in over.output
            assert (await tk.execute("small_echo", {"message": "ok"})).output == "Echo: ok"

            # A call that would take 30 s is cut at its limit of 1 s.
            slow = {"duration": 30, "steps": 3}
            cut = await tk.execute("short_trigger-long-running-operation", slow)
            assert cut.is_error and cut.output.startswith(
                "MCP tool 'trigger-long-running-operation' of server 'short': no answer within 1 s"
            )
            assert (await tk.execute("short_echo", {"message": "on"})).output == "Echo: on"

            # The server process is killed and started again on the same port: it has
            # forgotten the session, and the next call works on a new one.
            server.kill()
            server.start()
            back = await tk.execute("ev_echo", {"message": "back"})
            assert (back.output, back.is_error) == ("Echo: back", False)
            status = tk.mcp_status["ev"]
            assert (status.state, status.reconnects) == ("connected", 1)
            assert status.ended is not None and "the session stopped working" in status.ended
            summed = await tk.execute("ev_get-sum", {"a": 1, "b": 2})
            assert summed.output == "The sum of 1 and 2 is 3."
    assert_no_leaks()


async def test_a_legacy_sse_server_is_reached_over_its_own_transport():
    with http_everything("sse") as server, anyio.fail_after(LIMIT):
        async with Toolkit.create(builtins=False, mcp=config(old={"url": server.url})) as tk:
            status = tk.mcp_status["old"]
            assert (status.state, status.transport) == ("connected", "sse")
            echoed = await tk.execute("old_echo", {"message": "legacy"})
            assert (echoed.output, echoed.is_error) == ("Echo: legacy", False)
    assert_no_leaks()


async def test_a_url_that_speaks_no_mcp_transport_says_both_failed():
    with http_everything() as server, anyio.fail_after(LIMIT):
        nowhere = server.url.replace("/mcp", "/nothing-here")
        async with Toolkit.create(builtins=False, mcp=config(x={"url": nowhere})) as tk:
            status = tk.mcp_status["x"]
            assert status.state == "failed" and status.error is not None
            assert status.error.startswith("it does not speak streamable HTTP (")
            assert "nor the legacy HTTP+SSE transport (" in status.error
