"""serve's ``GET /oauth/callback``: the sign-in of a remote MCP server, answered by the
redirect that the authorization server sends the person's browser to.

The servers are those of tests/test_mcp_oauth.py (examples/mcp_oauth_servers.py); the app
runs on aiohttp's test server with the serve tests' helpers, its store a SQLite file whose
``mcp_tokens`` keep the sign-in. The callback needs no serve token (the browser comes from
another site, without the session cookie): the one-use state is its credential.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import anyio

from tests.test_mcp_oauth import SIGNED_IN, follow, guarded, model, oauth_servers
from tests.test_serve_api import TOKEN, events, post, serving
from toolnexus_async import LlmClient, Request
from toolnexus_async.durable import SqliteRunStore
from toolnexus_async.serve import ServeInbox
from toolnexus_async.serve.demo import serve_demo_app

LIMIT = 60


def signing_client(inbox: ServeInbox) -> LlmClient:
    return LlmClient.in_process(model, wait_for=inbox)


async def test_the_callback_answers_the_sign_in_once_and_refuses_a_wrong_state(tmp_path: Path):
    with oauth_servers() as (_, url):
        store = SqliteRunStore(tmp_path / "runs.db")
        app = serve_demo_app(store, make_client=signing_client, token=TOKEN, mcp=guarded(url))
        with anyio.fail_after(LIMIT):
            async with serving(app) as http, events(http) as stream:
                prompt = {"prompt": "guarded_sign_in guarded_whoami"}
                status, started = await post(http, "/runs", prompt)
                assert status == 202
                pending = await stream.until("pending", run_id=started["id"])
                request = Request.from_dict(pending["request"])
                assert request.kind == "authorization" and request.url
                query = urlsplit(await follow(request)).query
                callback = f"/oauth/callback?{query}"
                # No token, no cookie: as a browser sent here by another site.
                async with http.get(callback.replace("state=", "state=wrong")) as reply:
                    assert reply.status == 400
                    assert "no sign-in under way has this state" in await reply.text()
                async with http.get(callback) as reply:
                    page = await reply.text()
                    assert (reply.status, "Signed in" in page) == (200, True)
                    assert "code=" not in page and query not in page
                done = await stream.until("done", run_id=started["id"])
                assert done["text"] == SIGNED_IN
                async with http.get(callback) as reply:  # a state works once
                    assert reply.status == 400
                kept = await store.mcp_token(f"mcp-oauth guarded {url}")
                assert kept is not None and "access_token" in kept
                async with http.post(callback) as reply:  # the route is GET only
                    assert reply.status == 405
