"""serve relays an older MCP server's inline question (2025-11-25 ``elicitation/create``)
to its page while the process lives, marked ``"durable": false`` (issue 35, item 5).

The MCP server is the SDK-written demo (tests/mcp_servers/demo.py) with ``DEMO_LEGACY=1``:
it speaks the handshake era only and asks inline, inside the call. The model
(tests/mcp_servers/agent.py) calls the tool its prompt names. The API tests run the app on
aiohttp's test server; the restart and page tests run this module as a serve process
(``python -m tests.test_mcp_serve_inline STORE TOKEN CONFIG LEASE``), stopped with SIGINT
or SIGKILL, and drive the page in Chromium as tests/test_serve_page.py does.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest

from tests.mcp_servers.agent import model
from tests.mcp_servers.fixtures import config, stdio_server
from tests.test_serve_api import TOKEN, events, post, serving
from toolnexus_async import LlmClient
from toolnexus_async.durable import MemoryRunStore
from toolnexus_async.serve import ServeInbox
from toolnexus_async.serve._inline import INLINE_PREFIX
from toolnexus_async.serve.demo import serve_demo_app

T = TypeVar("T")

LIMIT = 60
CITY = {"city": "Rome"}


def mcp_client(inbox: ServeInbox) -> LlmClient:
    return LlmClient.in_process(model, wait_for=inbox)


def legacy(log: Path) -> dict[str, Any]:
    return config(old=stdio_server(DEMO_LEGACY="1", DEMO_OUTCOMES=str(log)))


def outcomes(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_the_mcp_client_and_serve_agree_on_the_inline_id_prefix() -> None:
    from mcp_types import ElicitRequestFormParams

    from toolnexus_async.mcp._questions import INLINE_PREFIX as MCP_PREFIX
    from toolnexus_async.mcp._questions import inline_request

    asked = inline_request(ElicitRequestFormParams(message="?", requested_schema={}))
    assert MCP_PREFIX == INLINE_PREFIX and asked.id.startswith(INLINE_PREFIX)


async def test_an_inline_question_is_listed_streamed_and_answered_through_the_api(
    tmp_path: Path,
) -> None:
    log = tmp_path / "outcomes.jsonl"
    app = serve_demo_app(MemoryRunStore(), make_client=mcp_client, token=TOKEN, mcp=legacy(log))
    with anyio.fail_after(LIMIT):
        async with serving(app) as http, events(http) as stream:
            # A request the store keeps, beside it: the listing merges both.
            status, kept = await post(http, "/runs", {"prompt": "check_login {}"})
            assert status == 202
            await stream.until("pending", run_id=kept["id"])
            status, started = await post(http, "/runs", {"prompt": f"old_book {json.dumps(CITY)}"})
            assert status == 202
            run_id = started["id"]
            pending = await stream.until("pending", run_id=run_id)
            request = pending["request"]
            assert stream.ids[-1] is None  # no place in the store's sequence: no id line
            assert request["id"].startswith(INLINE_PREFIX)
            assert (request["kind"], request["prompt"]) == (
                "input",
                "Which seat for the trip to Rome?",
            )
            assert request["durable"] is False and request["run_id"] == run_id
            assert request["display"]["prompt"]

            async with http.get("/requests") as reply:
                listing = await reply.json()
            first, second = listing["requests"]
            assert first["id"] == request["id"] and first["durable"] is False
            assert first["run_id"] == run_id and first["display"] == request["display"]
            assert second["kind"] == "authorization" and "durable" not in second
            assert listing["total"] == 2
            assert listing["counts"] == {"authorization": 1, "input": 1}
            for query, ids in (
                ("?kind=input", [request["id"]]),
                ("?kind=authorization", [second["id"]]),
                (f"?run={run_id}", [request["id"]]),
                ("?q=SEAT+FOR", [request["id"]]),
            ):
                async with http.get(f"/requests{query}") as reply:
                    page = await reply.json()
                assert [r["id"] for r in page["requests"]] == ids, query
                assert page["total"] == len(ids) and page["counts"] == listing["counts"]

            # A reconnecting client resumes from the store's last id: the inline events are
            # not replayed (they have none), so it reads the listing, which has them.
            async with http.get("/runs?limit=1") as reply:
                assert reply.status == 200
            last = next(seq for seq in reversed(stream.ids) if seq is not None)
            async with http.get("/events", headers={"Last-Event-ID": str(last)}) as resumed:
                assert resumed.status == 200

            unknown = INLINE_PREFIX + "0" * 32
            status, refused = await post(http, f"/requests/{unknown}/answer", {"ok": True})
            assert status == 404 and "only the server process" in refused["error"]

            answer = {"ok": True, "data": {"seat": "aisle"}}
            assert await post(http, f"/requests/{request['id']}/answer", answer) == (
                200,
                {"id": request["id"], "ok": True},
            )
            answered = await stream.until("answered", request_id=request["id"])
            assert answered["ok"] is True and answered["durable"] is False
            assert answered["run_id"] == run_id
            status, again = await post(http, f"/requests/{request['id']}/answer", answer)
            assert status == 409 and "answered already" in again["error"]
            done = await stream.until("done", run_id=run_id)
            assert done["text"] == "booked Rome, seat aisle"
            async with http.get("/requests") as reply:
                assert [r["id"] for r in (await reply.json())["requests"]] == [second["id"]]
            async with http.get(f"/runs/{run_id}") as reply:
                [step] = (await reply.json())["steps"]
            assert step["name"] == "old_book" and step["output"] == "booked Rome, seat aisle"
    assert outcomes(log) == [{"tool": "book", "action": "accept", "content": {"seat": "aisle"}}]


async def test_a_declined_inline_question_reaches_the_server_as_decline(tmp_path: Path) -> None:
    log = tmp_path / "outcomes.jsonl"
    app = serve_demo_app(MemoryRunStore(), make_client=mcp_client, token=TOKEN, mcp=legacy(log))
    with anyio.fail_after(LIMIT):
        async with serving(app) as http, events(http) as stream:
            _, started = await post(http, "/runs", {"prompt": f"old_book {json.dumps(CITY)}"})
            request = (await stream.until("pending", run_id=started["id"]))["request"]
            body = {"ok": False, "reason": "declined"}
            assert (await post(http, f"/requests/{request['id']}/answer", body))[0] == 200
            answered = await stream.until("answered", request_id=request["id"])
            assert (answered["ok"], answered["reason"]) == (False, "declined")
            done = await stream.until("done", run_id=started["id"])
    assert done["text"] == "book: declined"
    assert outcomes(log) == [{"tool": "book", "action": "decline", "content": None}]


# -- a serve process: stopped and started again, and its page ------------------------------


async def _serve(store: str, token: str, mcp: str, lease: str) -> None:
    from toolnexus_async.serve import run_server

    app = serve_demo_app(
        store, make_client=mcp_client, token=token, mcp=mcp, lease=float(lease), park_timeout=3600
    )

    def ready(url: str) -> None:
        print(f"Open the inbox: {url}/?token={token}", flush=True)

    await run_server(app, port=0, on_ready=ready)


class Api:
    def __init__(self, base: str, token: str) -> None:
        self.base, self.token = base, token

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.base}{path}", data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=30) as reply:
                return reply.status, json.loads(reply.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def inline(self) -> list[dict[str, Any]]:
        _, listing = self.call("GET", "/requests")
        return [r for r in listing["requests"] if r.get("durable") is False]

    def until(self, what: str, check: Callable[[], T]) -> T:
        """Poll until ``check()`` is truthy, for 30 s at most (a hang guard)."""
        deadline = time.monotonic() + 30
        while not (found := check()):
            assert time.monotonic() < deadline, f"no {what} in 30 s"
            time.sleep(0.05)
        return found


def serve_process(tmp_path: Path, token: str, log: Path, lease: str = "30") -> Any:
    from tests.test_serve_browser import ServeProcess

    cfg = tmp_path / "mcp.json"
    cfg.write_text(json.dumps(legacy(log)))
    store = tmp_path / "runs.sqlite"
    module = "tests.test_mcp_serve_inline"
    command = [sys.executable, "-m", module, str(store), token, str(cfg), lease]
    return ServeProcess(store, command)


def test_a_clean_restart_ends_the_question_and_the_call_gets_cancel(tmp_path: Path) -> None:
    """Stopped (SIGINT) with the question open: the server is answered ``cancel``, the tool
    returns what the server makes of that, and the run ends; the new process knows the
    question no more (404 saying why) and lists nothing."""
    from toolnexus_async.serve import new_token

    log, token = tmp_path / "outcomes.jsonl", new_token()
    with serve_process(tmp_path, token, log) as server:
        api = Api(server.base, token)
        status, started = api.call("POST", "/runs", {"prompt": f"old_book {json.dumps(CITY)}"})
        assert status == 202
        [asked] = api.until("inline question", api.inline)
        assert asked["run_id"] == started["id"]
    assert outcomes(log) == [{"tool": "book", "action": "cancel", "content": None}]
    with serve_process(tmp_path, token, log) as server:
        api = Api(server.base, token)
        assert api.inline() == []
        status, refused = api.call("POST", f"/requests/{asked['id']}/answer", {"ok": True})
        assert status == 404 and "only the server process" in refused["error"]
        status, run = api.call("GET", f"/runs/{started['id']}")
        assert (run["status"], run["text"]) == ("done", "book: cancelled")


def test_after_kill_9_the_call_runs_again_and_asks_a_new_question(tmp_path: Path) -> None:
    """Killed with the question open: it died with the process. The next process takes the
    run over (its lease ran out) and runs the call again, as any call cut by a crash: the
    server asks again, a new question with a new id, which completes the run."""
    from toolnexus_async.serve import new_token

    log, token = tmp_path / "outcomes.jsonl", new_token()
    killed = serve_process(tmp_path, token, log, lease="1").__enter__()
    try:
        api = Api(killed.base, token)
        _, started = api.call("POST", "/runs", {"prompt": f"old_book {json.dumps(CITY)}"})
        [first] = api.until("inline question", api.inline)
    finally:
        killed.process.kill()
        killed.process.wait()
        assert killed.process.stdout is not None
        killed.process.stdout.close()
    with serve_process(tmp_path, token, log, lease="1") as server:
        api = Api(server.base, token)
        [second] = api.until("question asked again", api.inline)
        assert second["id"] != first["id"] and second["run_id"] == started["id"]
        assert api.call("POST", f"/requests/{first['id']}/answer", {"ok": True})[0] == 404
        answer = {"ok": True, "data": {"seat": "window"}}
        assert api.call("POST", f"/requests/{second['id']}/answer", answer)[0] == 200
        run = api.until(
            "end of the run",
            lambda: (r := api.call("GET", f"/runs/{started['id']}")[1])["status"] == "done" and r,
        )
        assert run["text"] == "booked Rome, seat window"


def test_an_inline_question_is_answered_on_the_page(tmp_path: Path) -> None:
    """The card says the question ends if the server restarts; filled in and submitted on
    the page, its answer reaches the server and the tool's result the run."""
    from tests.test_serve_browser import MISSING, launch

    if MISSING is not None:
        pytest.fail(f"CI must install the browser test's tools: {MISSING}", pytrace=False)
    from playwright.sync_api import expect, sync_playwright

    from toolnexus_async.serve import new_token

    log, token = tmp_path / "outcomes.jsonl", new_token()
    with serve_process(tmp_path, token, log) as server, sync_playwright() as pw:
        api, browser = Api(server.base, token), launch(pw)
        try:
            page = browser.new_page()
            errors: list[object] = []
            page.on("pageerror", lambda error: errors.append(error))
            page.goto(server.url)
            expect(page.locator("#connection")).to_have_text("Live")  # the question's event
            _, started = api.call("POST", "/runs", {"prompt": f"old_book {json.dumps(CITY)}"})
            card = page.locator('#requests > li[data-durable="false"]')
            expect(card).to_have_count(1)
            expect(card.locator(".inline-note")).to_have_text("Ends if the server restarts")
            expect(card).to_contain_text("Which seat for the trip to Rome?")
            expect(card).to_have_attribute("data-run", started["id"])
            card.locator('input[name="seat"]').fill("window")
            card.get_by_role("button", name="Submit").click()
            expect(card).to_have_count(0)
            run = page.locator(f'#runs > li[data-run="{started["id"]}"]')
            expect(run.locator(".status")).to_have_text("done")
            expect(run).to_contain_text("booked Rome, seat window")
            assert errors == []
        finally:
            browser.close()
    assert outcomes(log) == [{"tool": "book", "action": "accept", "content": {"seat": "window"}}]


if __name__ == "__main__":
    store_arg, token_arg, mcp_arg, lease_arg = sys.argv[1:5]
    anyio.run(_serve, store_arg, token_arg, mcp_arg, lease_arg)
