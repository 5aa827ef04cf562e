"""``serve`` with MCP servers (``--mcp FILE``): their questions are requests on the page.

The app runs on aiohttp's test server with the serve tests' helpers (tests/test_serve_api.py)
and the SDK-written demo MCP server (tests/mcp_servers/demo.py) over stdio.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import anyio
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from tests.mcp_servers.agent import model
from tests.mcp_servers.fixtures import config, stdio_server
from tests.test_serve_api import TOKEN, events, post, serving
from toolnexus_async import LlmClient
from toolnexus_async._cli import main
from toolnexus_async.durable import MemoryRunStore
from toolnexus_async.serve import TOKEN_ENV, ServeInbox
from toolnexus_async.serve._app import SERVE
from toolnexus_async.serve.demo import serve_demo_app

LIMIT = 60


def mcp_client(inbox: ServeInbox) -> LlmClient:
    return LlmClient.in_process(model, wait_for=inbox)


async def test_the_page_lists_an_mcp_question_and_its_answer_completes_the_call(tmp_path: Path):
    log = tmp_path / "outcomes.jsonl"
    app = serve_demo_app(
        MemoryRunStore(),
        make_client=mcp_client,
        token=TOKEN,
        mcp=config(demo=stdio_server(DEMO_OUTCOMES=str(log))),
    )
    with anyio.fail_after(LIMIT):
        async with serving(app) as http, events(http) as stream:
            status, started = await post(http, "/runs", {"prompt": 'demo_book {"city": "Rome"}'})
            assert status == 202
            run_id = started["id"]
            pending = await stream.until("pending", run_id=run_id)
            request = pending["request"]
            assert (request["kind"], request["prompt"]) == (
                "input",
                "Which seat for the trip to Rome?",
            )
            assert request["data"]["schema"]["properties"]["seat"]["type"] == "string"
            async with http.get("/requests") as reply:
                [listed] = (await reply.json())["requests"]
            assert listed["id"] == request["id"] and listed["data"]["schema"]
            answer = {"ok": True, "data": {"seat": "aisle"}}
            assert await post(http, f"/requests/{request['id']}/answer", answer) == (
                200,
                {"id": request["id"], "ok": True},
            )
            done = await stream.until("done", run_id=run_id)
    assert done["text"] == "booked Rome, seat aisle"
    assert json.loads(log.read_text()) == {
        "tool": "book",
        "action": "accept",
        "content": {"seat": "aisle"},
    }


def test_serve_mcp_loads_the_config_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    import toolnexus_async.serve as serve

    cfg = tmp_path / "mcp.json"
    cfg.write_text(json.dumps(config(demo=stdio_server())))
    seen: dict[str, Any] = {}

    async def started(app: web.Application, **kwargs: Any) -> None:
        async with TestClient(TestServer(app)):  # startup connects the servers
            seen.update(app[SERVE].toolkit.mcp_status)
            seen["tools"] = sorted(tool.name for tool in app[SERVE].toolkit.tools())

    monkeypatch.setattr(serve, "run_server", started)
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    store = tmp_path / "runs.sqlite"
    assert main(["serve", "--store", str(store), "--mcp", str(cfg)]) == 0
    assert seen["demo"].state == "connected"
    assert "demo_book" in seen["tools"] and "check_login" in seen["tools"]


def test_serve_mcp_with_a_bad_config_says_what_is_wrong(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    import toolnexus_async.serve as serve

    def must_not_serve(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("served with a bad MCP config")

    monkeypatch.setattr(serve, "run_server", must_not_serve)
    cfg = tmp_path / "mcp.json"
    cfg.write_text(json.dumps({"mcpServers": {"demo": {"command": 7}}}))
    assert main(["serve", "--store", str(tmp_path / "runs.sqlite"), "--mcp", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "MCP server 'demo': command must be a list" in err


async def test_serve_needs_no_restart_when_an_mcp_server_process_dies():
    from tests.mcp_servers.fixtures import child_pids
    from tests.test_mcp_resilience import wait_exited

    before = child_pids()
    app = serve_demo_app(
        MemoryRunStore(),
        make_client=mcp_client,
        token=TOKEN,
        mcp=config(demo=stdio_server()),
    )
    with anyio.fail_after(LIMIT):
        async with serving(app) as http, events(http) as stream:
            [pid] = child_pids() - before
            os.kill(pid, signal.SIGKILL)
            await wait_exited(pid)
            # echo says it only reads (readOnlyHint): were the end of the old process not
            # yet read when the call is sent, it is sent again on the new one.
            status, started = await post(http, "/runs", {"prompt": 'demo_echo {"text": "up"}'})
            assert status == 202
            done = await stream.until("done", run_id=started["id"])
            assert done["text"] == "up"
            assert app[SERVE].toolkit.mcp_status["demo"].reconnects == 1
    assert child_pids() == before
