"""The ASGI adapter (``toolnexus_async.serve.asgi.UiEndpoints``) mounted in a FastAPI app
served by uvicorn: the AG-UI and AI SDK scenarios of test_ui_agui and test_ui_aisdk,
through the same node clients, restarts and the AI SDK's reconnects included; and its
auth, the token or the host's own callback, checked before anything is read.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
import uvicorn
from fastapi import FastAPI
from starlette.requests import Request

from tests import test_ui_agui, test_ui_aisdk
from tests.conftest import assert_no_leaks
from tests.ui_app import LIMIT, TOKEN, ui_client, ui_toolkit
from toolnexus_async import UsageError
from toolnexus_async.durable import SqliteRunStore
from toolnexus_async.serve.asgi import UiEndpoints


@asynccontextmanager
async def uvicorn_serving(app: Any) -> AsyncIterator[str]:
    """``app`` under uvicorn on a loopback port (listening before uvicorn starts, so no
    client waits for it to bind); its base url. Stopped, with its lifespan, on exit."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, lifespan="on", log_level="warning"))
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, [sock])
            try:
                yield f"http://127.0.0.1:{port}"
            finally:
                server.should_exit = True
    finally:
        sock.close()


def mounted(path: Path, toolkit: Any, **auth: Any) -> FastAPI:
    """A FastAPI app mounting the endpoints at /agent, on the SQLite file ``path``."""
    store = SqliteRunStore(path)
    endpoints = UiEndpoints(make_client=ui_client, toolkit=toolkit, store=store, **auth)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with store, endpoints:
            yield

    api = FastAPI(lifespan=lifespan)
    api.mount("/agent", endpoints.app)
    return api


@asynccontextmanager
async def serving(path: Path) -> AsyncIterator[str]:
    async with (
        ui_toolkit() as toolkit,
        uvicorn_serving(mounted(path, toolkit, token=TOKEN)) as base,
    ):
        yield base + "/agent"


async def test_ag_ui_scenario_mounted_in_fastapi_under_uvicorn(tmp_path: Path):
    await test_ui_agui.scenario(serving, tmp_path / "runs.sqlite")
    assert_no_leaks()


async def test_ai_sdk_scenario_mounted_in_fastapi_under_uvicorn(tmp_path: Path):
    await test_ui_aisdk.scenario(serving, tmp_path / "runs.sqlite")
    assert_no_leaks()


async def test_ai_sdk_reconnects_mounted_in_fastapi_under_uvicorn(tmp_path: Path):
    await test_ui_aisdk.reconnects(serving, tmp_path / "runs.sqlite")
    assert_no_leaks()


async def test_the_token_or_the_host_s_callback_is_checked_before_anything(tmp_path: Path):
    def authorize(request: Request) -> bool:
        return request.headers.get("x-user") == "ana"

    body = {
        "threadId": "t-auth",
        "runId": "r1",
        "messages": [{"id": "u", "role": "user", "content": "shop"}],
    }
    with anyio.fail_after(LIMIT):
        async with ui_toolkit() as toolkit, aiohttp.ClientSession() as http:
            app = mounted(tmp_path / "a.sqlite", toolkit, authorize=authorize)
            async with uvicorn_serving(app) as base:
                async with http.post(base + "/agent/ag-ui", json=body) as reply:
                    assert (reply.status, await reply.json()) == (401, {"error": "not authorised"})
                async with http.get(base + "/agent/ai-sdk/chat/t-auth/stream") as reply:
                    assert reply.status == 401
                headers = {"x-user": "ana"}
                async with http.post(base + "/agent/ag-ui", json=body, headers=headers) as reply:
                    assert reply.status == 200
                    assert reply.headers["Content-Type"] == "text/event-stream"
                    text = await reply.text()
                assert '"type":"RUN_STARTED"' in text and '"outcome":{"type":"interrupt"' in text
                async with http.post(base + "/agent/ag-ui", data=b"{}", headers=headers) as reply:
                    assert reply.status == 415
            app = mounted(tmp_path / "b.sqlite", toolkit, token=TOKEN)
            async with uvicorn_serving(app) as base:
                wrong = {"Authorization": "Bearer " + "x" * len(TOKEN)}
                async with http.post(base + "/agent/ag-ui", json=body, headers=wrong) as reply:
                    assert reply.status == 401
                    assert TOKEN not in await reply.text()
    assert_no_leaks()
    with pytest.raises(UsageError, match="exactly one of"):
        UiEndpoints(make_client=ui_client, toolkit=toolkit, store=SqliteRunStore(tmp_path / "c"))
