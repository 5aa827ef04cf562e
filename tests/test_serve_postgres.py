"""Two servers on one PostgreSQL database are one inbox (a real server: tests/pg.py).

A run started on server A is listed by server B and shown on B's event stream (told by
the database, read back from it); answered through B, it wakes on A at once; every answer
is announced once on each stream, whichever server took it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import anyio
from aiohttp.test_utils import TestClient

from tests.conftest import assert_no_leaks
from tests.test_serve_api import AUTH, LIMIT, GuardedTestServer, demo_app, events, post
from toolnexus_async.durable import PostgresRunStore

DEMO_ANSWERS: list[dict[str, Any]] = [
    {"ok": True},  # log in
    {"ok": True, "data": {"answers": ["Sakura", "4"]}},  # which table
    {"ok": True},  # the deposit
]


async def test_a_run_on_one_server_is_seen_and_answered_on_the_other(pg_dsn: str):
    with anyio.fail_after(LIMIT):
        async with (
            PostgresRunStore(pg_dsn) as store_a,
            PostgresRunStore(pg_dsn) as store_b,
            TestClient(GuardedTestServer(demo_app(store_a)), headers=AUTH) as a,
            TestClient(GuardedTestServer(demo_app(store_b)), headers=AUTH) as b,
            events(a) as on_a,
            events(b) as on_b,
        ):
            status, started = await post(a, "/runs", {"prompt": "Dinner for my team"})
            assert status == 202
            run_id = started["id"]
            asked: list[str] = []
            for turn, body in enumerate(DEMO_ANSWERS):
                pending = await on_b.until("pending", run_id=run_id)  # raised on A
                request_id = pending["request"]["id"]
                asked.append(request_id)
                async with b.get("/requests") as listed:
                    assert [r["id"] for r in (await listed.json())["requests"]] == [request_id]
                by = b if turn % 2 == 0 else a  # answered through B, A, B
                assert await post(by, f"/requests/{request_id}/answer", body) == (
                    200,
                    {"id": request_id, "ok": True},
                )
                for stream in (on_a, on_b):
                    answered = await stream.until("answered", request_id=request_id)
                    assert {"request_id": request_id, "ok": True}.items() <= answered.items()
            done = await on_a.until("done", run_id=run_id)
            assert done["status"] == "done" and "Sakura for 4" in done["text"]

            # A second run's first request reaches B after every announcement of the first
            # run's answers would have: none came twice.
            _, again = await post(a, "/runs", {"prompt": "Lunch"})
            await on_b.until("pending", run_id=again["id"])
            for stream in (on_a, on_b):
                answered = Counter(d["request_id"] for n, d in stream.seen if n == "answered")
                assert answered == Counter(asked)
            assert [d["request"]["id"] for n, d in on_b.seen if n == "pending"][:3] == asked
    assert_no_leaks()


async def test_nul_is_refused_before_postgresql_sees_it(pg_dsn: str):
    """PostgreSQL's text cannot hold U+0000: a prompt or an answer holding it is a 422 and
    an id holding it a 404, never a 500 carrying the database's error."""
    with anyio.fail_after(LIMIT):
        async with (
            PostgresRunStore(pg_dsn) as store,
            TestClient(GuardedTestServer(demo_app(store)), headers=AUTH) as http,
            events(http) as stream,
        ):
            status, error = await post(http, "/runs", {"prompt": "Dinner\u0000 for two"})
            assert status == 422 and "U+0000" in error["error"]
            status, error = await post(http, "/requests/req_%00x/answer", {"ok": True})
            assert (status, error) == (404, {"error": "no run waits for request 'req_\\x00x'"})
            status, started = await post(http, "/runs", {"prompt": "Dinner for two"})
            assert status == 202
            request = (await stream.until("pending", run_id=started["id"]))["request"]
            path = f"/requests/{request['id']}/answer"
            status, error = await post(http, path, {"ok": True, "data": {"x": "a\u0000b"}})
            assert status == 422 and "U+0000" in error["error"]
            async with http.get("/requests") as listed:  # still waiting for a real answer
                assert [r["id"] for r in (await listed.json())["requests"]] == [request["id"]]
    assert_no_leaks()
