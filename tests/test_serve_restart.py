"""The approval inbox across a restart: runs saved in a SQLite file outlive the server.

A first app serves a SQLite store file in ``tmp_path`` and is shut down with runs still
waiting (spilled after ``park_timeout``, or parked in memory, which the shutdown saves).
A second app on the same file lists them, and an answer over HTTP resumes each one to its
end. Nothing sleeps to synchronise; every wait is for an event, under ``anyio.fail_after``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from tests.test_serve_api import TOKEN, answer_demo_from, events, post, serving
from toolnexus_async import Toolkit
from toolnexus_async.durable import SqliteRunStore
from toolnexus_async.serve import create_app
from toolnexus_async.serve._app import SERVE
from toolnexus_async.serve.demo import demo_client, serve_demo_app, serve_demo_tools

LIMIT = 15


class WatchedSqliteStore(SqliteRunStore):
    """A SQLite store that says when a run halted into it (spilled)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.saved: list[str] = []
        self.changed = anyio.Event()

    async def halt(self, run_id: str, owner: str) -> None:
        await super().halt(run_id, owner)
        self.saved.append(run_id)
        self.changed.set()
        self.changed = anyio.Event()


# What the API shows since issue 34, beside what these tests check; and since issue 39, a
# run's output schema and output (a step has an output of its own: not left out there).
NEW = ("created", "updated", "requests", "turn", "request", "answer", "answers")
RUN_NEW = (*NEW, "output_schema", "output")


async def stored_requests(path: Path) -> list[str]:
    async with SqliteRunStore(path) as store:
        return [r.id for r in await store.requests()]


async def get(http: Any, path: str) -> tuple[int, Any]:
    async with http.get(path) as reply:
        return reply.status, await reply.json()


async def test_a_spilled_run_finishes_on_a_restarted_server(tmp_path: Path):
    path = tmp_path / "runs.sqlite"
    with anyio.fail_after(LIMIT):
        # The first server: the run waits longer than park_timeout and goes to the file.
        async with (
            WatchedSqliteStore(path) as store,
            Toolkit.create(builtins=False, extra_tools=serve_demo_tools()) as toolkit,
        ):
            app = create_app(
                make_client=demo_client,
                toolkit=toolkit,
                store=store,
                park_timeout=0.05,
                token=TOKEN,
            )
            async with serving(app) as http, events(http) as stream:
                run_id = (await post(http, "/runs", {"prompt": "Dinner, but slowly"}))[1]["id"]
                login = (await stream.until("pending", run_id=run_id))["request"]
                while not store.saved:
                    await store.changed.wait()
        assert await stored_requests(path) == [login["id"]]

        # The second server, on the same file: it knows the run and resumes it.
        async with serving(serve_demo_app(path, token=TOKEN)) as http, events(http) as stream:
            status, run = await get(http, f"/runs/{run_id}")
            run["steps"] = [{k: v for k, v in s.items() if k not in NEW} for s in run["steps"]]
            old = {k: v for k, v in run.items() if k not in RUN_NEW}
            assert run["requests"] == [login["id"]]
            assert (status, old) == (
                200,
                {
                    "id": run_id,
                    "status": "pending",
                    "prompt": "Dinner, but slowly",
                    "text": None,
                    "error": None,
                    "declined": False,
                    # Rebuilt from the store: the step that waits, with no output yet.
                    "steps": [
                        {
                            "id": "serve_demo_1",
                            "name": "check_login",
                            "arguments": {},
                            "output": None,
                            "is_error": False,
                            "declined": False,
                        }
                    ],
                },
            )
            assert (await get(http, "/requests"))[1]["requests"] == [{**login, "run_id": run_id}]
            done = await answer_demo_from(http, stream, run_id, {"request": login})
            assert done["status"] == "done" and "Sakura for 4" in done["text"]
            status, run = await get(http, f"/runs/{run_id}")
            assert (status, run["status"], run["text"]) == (200, "done", done["text"])
            steps = [(s["name"], s["output"] is not None) for s in run["steps"]]
            assert steps == [("check_login", True), ("question", True), ("book_table", True)]
            assert (await get(http, "/requests"))[1]["requests"] == []
        assert await stored_requests(path) == []

        # A third server: the request was answered before, so answering it again is 409.
        async with serving(serve_demo_app(path, token=TOKEN)) as http:
            status, error = await post(http, f"/requests/{login['id']}/answer", {"ok": True})
            assert status == 409 and "answered already" in error["error"]
            # Finished runs are kept in the store (within a bound): a restart still shows it.
            status, run = await get(http, f"/runs/{run_id}")
            assert (status, run["status"], run["text"]) == (200, "done", done["text"])
            # Its steps too, in full: read from the run's final transcript in the store.
            steps = [(s["name"], s["output"] is not None) for s in run["steps"]]
            assert steps == [("check_login", True), ("question", True), ("book_table", True)]


async def test_runs_parked_in_memory_are_saved_at_shutdown_and_resume_after(tmp_path: Path):
    """park_timeout is far away, yet shutting down loses nothing: the parked runs are saved
    and the next server lists them (with a new run of its own, in arrival order)."""
    path = tmp_path / "runs.sqlite"
    with anyio.fail_after(LIMIT):
        async with serving(serve_demo_app(path, token=TOKEN)) as http, events(http) as stream:
            first = (await post(http, "/runs", {"prompt": "one"}))[1]["id"]
            login = (await stream.until("pending", run_id=first))["request"]
            # The second run gets one step further: it waits on its question.
            second = (await post(http, "/runs", {"prompt": "two"}))[1]["id"]
            second_login = (await stream.until("pending", run_id=second))["request"]
            await post(http, f"/requests/{second_login['id']}/answer", {"ok": True})
            question = (await stream.until("pending", run_id=second))["request"]
            assert question["kind"] == "question"
        assert await stored_requests(path) == [login["id"], question["id"]]

        async with serving(serve_demo_app(path, token=TOKEN)) as http, events(http) as stream:
            third = (await post(http, "/runs", {"prompt": "three"}))[1]["id"]
            third_login = (await stream.until("pending", run_id=third))["request"]
            assert (listed := (await get(http, "/requests"))[1])
            assert [(r["id"], r["run_id"]) for r in listed["requests"]] == [
                (login["id"], first),
                (question["id"], second),
                (third_login["id"], third),
            ]
            assert [(r["id"], r["status"]) for r in (await get(http, "/runs"))[1]["runs"]] == [
                (third, "pending"),
                (second, "pending"),
                (first, "pending"),
            ]

            # The second run resumes at its question: login is not asked again.
            answer = {"ok": True, "data": {"answers": ["Luigi's", "2"]}}
            assert (await post(http, f"/requests/{question['id']}/answer", answer))[0] == 200
            approval = (await stream.until("pending", run_id=second))["request"]
            assert approval["kind"] == "approval" and "Luigi's" in approval["prompt"]
            assert (await post(http, f"/requests/{approval['id']}/answer", {"ok": True}))[0] == 200
            done = await stream.until("done", run_id=second)
            assert "Luigi's for 2" in done["text"]

            done = await answer_demo_from(http, stream, first, {"request": login})
            assert done["status"] == "done"
        # The third run, parked at shutdown, is the only one left in the file.
        assert await stored_requests(path) == [third_login["id"]]


async def test_a_run_posted_while_the_server_stops_is_kept_and_goes_on_after_a_restart(
    tmp_path: Path,
):
    """A POST /runs that comes after the server's runs can no longer start (it is
    stopping): the 202 stands, for the run is in the store, and the next server on the
    file goes on with it once the first one's lease on it has run out."""
    path = tmp_path / "runs.sqlite"
    with anyio.fail_after(LIMIT):
        app = serve_demo_app(path, token=TOKEN, lease=0.2)
        async with serving(app) as http:
            runs = app[SERVE].runs
            assert runs is not None
            runs.close()  # no run is going: its holder leaves, and no run can start here
            while runs._group is not None:
                await anyio.lowlevel.checkpoint()
            status, started = await post(http, "/runs", {"prompt": "Dinner, as we close"})
            assert status == 202
            run_id = started["id"]
            assert (await get(http, f"/runs/{run_id}"))[1]["status"] == "running"

        async with serving(serve_demo_app(path, token=TOKEN)) as http, events(http) as stream:
            login = (await stream.until("pending", run_id=run_id))["request"]
            assert login["kind"] == "authorization"
            assert (await get(http, "/requests"))[1]["requests"] == [{**login, "run_id": run_id}]
