"""Lists that scale, through the HTTP API, on SQLite and on PostgreSQL (issue 34).

``GET /runs`` and ``GET /requests`` are pages (``limit`` and an opaque ``cursor``),
filtered by status, kind and run, searched by prompt, with the total matching and counts
over everything; ``POST /runs`` beyond ``max_active_runs`` is 429 with ``Retry-After``.
Every run here is real: an in-process model on the app's store (``store``: a SQLite file
or a PostgreSQL database of tests/pg.py).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.test_serve_api import LIMIT, app_with, events, post, serving
from tests.test_serve_crash import eventually
from toolnexus_async import (
    AssistantMessage,
    Request,
    ToolCall,
    ToolContext,
    ToolResult,
    UsageError,
    define_tool,
)
from toolnexus_async.durable import PostgresRunStore, RunStore, SqliteRunStore
from toolnexus_async.serve._routes import OPENAPI


@pytest.fixture(params=["sqlite", "postgres"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A SQLite file's path, or a fresh PostgreSQL database's DSN (tests/pg.py)."""
    if request.param == "sqlite":
        return str(tmp_path / "runs.sqlite")
    return str(request.getfixturevalue("pg_dsn"))


@pytest.fixture
async def store(where: str) -> AsyncIterator[RunStore]:
    opened = PostgresRunStore(where) if where.startswith("postgresql") else SqliteRunStore(where)
    async with opened:
        yield opened


@define_tool
async def ask(kind: str, ctx: ToolContext | None = None) -> ToolResult:
    """Ask a person something of ``kind``; goes on once answered."""
    if ctx is None or ctx.answer is None:
        return ToolResult.pending(Request("", kind, f"Please {kind}"))
    return ToolResult.ok("answered")


def model(messages: list[Any], tools: list[Any]) -> AssistantMessage:
    """``"ask <kind> ..."`` asks once, then ends; ``"fail"`` raises; anything else ends."""
    prompt = messages[0].text
    if prompt == "fail":
        raise RuntimeError("the model fell over")
    if prompt.startswith("ask ") and not any(getattr(m, "call_id", None) for m in messages):
        return AssistantMessage(None, (ToolCall("c1", "ask", {"kind": prompt.split()[1]}),))
    return AssistantMessage(f"done: {prompt}")


# (prompt, the kind of request it waits for, or how it ends)
RUNS = [
    ("ask approval the Crème Brûlée order", "approval"),
    ("ask question which table", "question"),
    ("plain one", "done"),
    ("ask approval a refund", "approval"),
    ("fail", "error"),
    ("ask input a name", "input"),
    ("plain two", "done"),
    ("ask approval a payment", "approval"),
    ("ask question what time", "question"),
    ("plain three", "done"),
    ("ask approval a transfer", "approval"),
]


async def get(http: Any, path: str, **params: str) -> tuple[int, Any]:
    async with http.get(path, params=params) as reply:
        return reply.status, await reply.json()


async def pages(http: Any, path: str, key: str, **params: str) -> list[list[dict[str, Any]]]:
    """Every page of a list, following ``next``."""
    got: list[list[dict[str, Any]]] = []
    cursor = ""
    while True:
        status, body = await get(http, path, **params, cursor=cursor)
        assert status == 200, body
        got.append(body[key])
        if body["next"] is None:
            return got
        cursor = body["next"]


async def started(http: Any) -> tuple[list[str], dict[str, str]]:
    """Start :data:`RUNS` in order and wait until each parked or ended: the run ids in
    order, and the request id each asking run waits on."""
    async with events(http) as stream:
        ids = []
        for prompt, _ in RUNS:
            status, body = await post(http, "/runs", {"prompt": prompt})
            assert status == 202, body
            ids.append(body["id"])
        waiting: dict[str, str] = {}
        ended: set[str] = set()
        while len(waiting) + len(ended) < len(RUNS):
            name, data = await stream.next()
            if name == "pending":
                waiting[data["run_id"]] = data["request"]["id"]
            elif name in ("done", "failed"):
                ended.add(data["run_id"])
    return ids, waiting


async def test_runs_are_paged_filtered_searched_and_counted(store: RunStore):
    with anyio.fail_after(LIMIT):
        async with serving(app_with(model, [ask], store)) as http:
            ids, _ = await started(http)
            newest_first = ids[::-1]
            # Pages of 4, newest first, every run once, and the last page says so.
            got = await pages(http, "/runs", "runs", limit="4")
            assert [len(page) for page in got] == [4, 4, 3]
            assert [r["id"] for page in got for r in page] == newest_first
            _, body = await get(http, "/runs", limit="4")
            counts = {"pending": 7, "done": 3, "error": 1}
            assert (body["total"], body["counts"]) == (11, counts)
            first = body["runs"][0]
            assert first["prompt"] == RUNS[-1][0] and first["status"] == "pending"
            assert len(first["requests"]) == 1 and first["created"] <= first["updated"]

            # Filters: one status, several (repeated or comma-separated), and the counts
            # stay those of every run.
            got = await pages(http, "/runs", "runs", limit="5", status="pending")
            assert [len(page) for page in got] == [5, 2]
            expected = [
                i for i, (_, how) in zip(ids, RUNS, strict=True) if how not in ("done", "error")
            ]
            assert [r["id"] for page in got for r in page] == expected[::-1]
            async with http.get("/runs?status=done&status=error") as reply:
                body = await reply.json()
            assert (body["total"], body["counts"]) == (4, counts)
            assert {r["status"] for r in body["runs"]} == {"done", "error"}
            _, body = await get(http, "/runs", status="done,error", limit="1")
            assert (body["total"], len(body["runs"])) == (4, 1)

            # Search: case-insensitive, Unicode included, with filters.
            _, body = await get(http, "/runs", q="CRÈME BRÛLÉE")
            assert [r["id"] for r in body["runs"]] == [ids[0]] and body["total"] == 1
            _, body = await get(http, "/runs", q="plain", status="done")
            assert body["total"] == 3
            _, body = await get(http, "/runs", q="nowhere")
            assert (body["runs"], body["next"], body["total"]) == ([], None, 0)

            # A failed run reads as the store has it.
            _, body = await get(http, "/runs", status="error")
            assert [(r["id"], r["error"] is not None) for r in body["runs"]] == [(ids[4], True)]


async def test_requests_are_paged_filtered_searched_and_counted(store: RunStore):
    with anyio.fail_after(LIMIT):
        async with serving(app_with(model, [ask], store)) as http:
            ids, waiting = await started(http)
            got = await pages(http, "/requests", "requests", limit="3")
            assert [len(page) for page in got] == [3, 3, 1]
            # The pages are the one listing, cut in order: every request once. Which run
            # parks first is the runs' race, not the order they were started in.
            _, whole = await get(http, "/requests", limit="500")
            paged = [r["id"] for page in got for r in page]
            assert paged == [r["id"] for r in whole["requests"]]
            assert sorted(paged) == sorted(waiting.values())
            _, body = await get(http, "/requests")
            counts = {"approval": 4, "question": 2, "input": 1}
            assert (body["total"], body["counts"], body["next"]) == (7, counts, None)
            (item,) = [r for r in body["requests"] if r["run_id"] == ids[0]]
            assert (item["kind"], item["run_id"], item["prompt"]) == (
                "approval",
                ids[0],
                "Please approval",
            )
            assert "display" in item

            _, body = await get(http, "/requests", kind="question")
            assert sorted(r["run_id"] for r in body["requests"]) == sorted([ids[1], ids[8]])
            assert (body["total"], body["counts"]) == (2, counts)
            _, body = await get(http, "/requests", kind="question,input", limit="2")
            assert body["total"] == 3 and body["next"] is not None
            _, body = await get(http, "/requests", run=ids[5])
            assert [r["id"] for r in body["requests"]] == [waiting[ids[5]]]
            _, body = await get(http, "/requests", q="PLEASE INPUT")
            assert [r["run_id"] for r in body["requests"]] == [ids[5]]

            # Answered: gone from the list and from the counts, its run done.
            answer = f"/requests/{waiting[ids[0]]}/answer"
            assert (await post(http, answer, {"ok": True}))[0] == 200
            _, body = await get(http, "/requests", kind="approval")
            assert waiting[ids[0]] not in [r["id"] for r in body["requests"]]
            assert (body["total"], body["counts"]["approval"]) == (3, 3)


@pytest.mark.parametrize(
    ("path", "query", "message"),
    [
        ("/runs", "limit=0", "'limit' must be a whole number from 1 to 500, got '0'"),
        ("/runs", "limit=501", "from 1 to 500"),
        ("/runs", "limit=ten", "from 1 to 500"),
        ("/requests", "limit=-1", "from 1 to 500"),
        ("/runs", "status=finished", "unknown status finished; a run is one of running"),
        ("/runs", "cursor=not-ours", "'cursor' is not one this list gave"),
        ("/requests", "cursor=cjE", "'cursor' is not one this list gave"),  # a /runs cursor
        ("/runs", "kind=approval", "unknown parameter(s) 'kind'; allowed: limit, cursor"),
        ("/requests", "status=pending", "unknown parameter(s) 'status'"),
        ("/runs", "q=" + "x" * 1001, "'q' must be text of at most 1000 characters"),
        ("/requests", "run=", "'run' must be a run id"),
    ],
)
async def test_a_bad_query_is_422_and_says_what_is_allowed(path: str, query: str, message: str):
    with anyio.fail_after(LIMIT):
        async with serving(app_with(model, [ask])) as http:
            async with http.get(f"{path}?{query}") as reply:
                assert reply.status == 422
                assert message in (await reply.json())["error"]


async def test_runs_beyond_max_active_runs_are_429_with_retry_after(store: RunStore):
    with anyio.fail_after(LIMIT):
        app = app_with(model, [ask], store, max_active_runs=2)
        async with serving(app) as http, events(http) as stream:
            first = (await post(http, "/runs", {"prompt": "ask approval one"}))[1]["id"]
            await post(http, "/runs", {"prompt": "ask approval two"})
            async with http.post("/runs", json={"prompt": "ask approval three"}) as reply:
                assert (reply.status, reply.headers["Retry-After"]) == (429, "1")
                assert "max-active-runs" in (await reply.json())["error"]
            _, body = await get(http, "/runs")
            assert body["total"] == 2  # the refused one was never kept
            request_id = (await stream.until("pending", run_id=first))["request"]["id"]
            await post(http, f"/requests/{request_id}/answer", {"ok": True})
            await stream.until("done", run_id=first)
            # Its task ends right after its end is kept: then there is room again.
            await eventually("room for a run", lambda: admitted(http))


async def admitted(http: Any) -> bool | None:
    return (await post(http, "/runs", {"prompt": "plain"}))[0] == 202 or None


def test_a_bad_max_active_runs_is_refused():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(UsageError, match="max_active_runs"):
            app_with(model, [ask], max_active_runs=bad)


def test_the_openapi_description_has_the_lists_parameters_and_the_429():
    spec = json.loads(OPENAPI.read_text())
    paths = spec["paths"]
    names = [p["name"] for p in paths["/runs"]["get"]["parameters"]]
    assert names == ["limit", "cursor", "status", "q"]
    names = [p["name"] for p in paths["/requests"]["get"]["parameters"]]
    assert names == ["limit", "cursor", "kind", "q", "run"]
    assert "Retry-After" in paths["/runs"]["post"]["responses"]["429"]["headers"]
    for listed in ("RunList", "RequestList"):
        assert spec["components"]["schemas"][listed]["required"][1:] == ["next", "total", "counts"]
    assert "Last-Event-ID" in paths["/events"]["get"]["description"]
