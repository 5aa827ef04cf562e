"""The inbox while its run store is away: 503 with Retry-After, one log line each way, the
health probes, and a stop that gives busy runs their grace.

The HTTP tests serve a real app on 127.0.0.1 (``tests.test_serve_api.serving``) over a
:class:`FaultyStore`: the memory store, whose calls behind the routes raise the
:class:`StoreUnavailableError` (or another store error) a test puts in ``fault``. The
stores' own faults, on a real database that goes away, are pinned by their own tests;
here it is what the server makes of them. Nothing sleeps to synchronise: a test waits for
the event that says what it needs. The grace tests run a real server in a child process
and stop it with SIGTERM, as Kubernetes does.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
from yarl import URL

from tests.test_serve_api import LIMIT, demo_app, events, post, serving
from toolnexus_async import (
    Answer,
    AssistantMessage,
    DamagedRunError,
    LlmClient,
    Message,
    StoreError,
    StoreUnavailableError,
    ToolCall,
    Toolkit,
    ToolReturn,
    UsageError,
    define_tool,
)
from toolnexus_async._cli import main
from toolnexus_async.durable import Accepted, MemoryRunStore, SqliteRunStore
from toolnexus_async.serve import TOKEN_ENV, create_app, run_server
from toolnexus_async.serve._app import SERVE
from toolnexus_async.serve.demo import demo_client

# What a PostgreSQL store says when its server is down (it names the server, never a
# password), and the hint it gives.
DOWN = (
    "postgresql db.example:5432/inbox: failed: ConnectionRefusedError: [Errno 111] "
    "Connect call failed (the database is unavailable now)"
)
SERVE_LOG = "toolnexus_async.serve"


class FaultyStore(MemoryRunStore):
    """A memory store whose calls behind the routes (``start`` behind ``POST /runs``,
    ``accept`` behind an answer, the listings, ``load`` and ``ping``) raise ``fault``
    while it is set. ``ping_ok`` is set by each ping that succeeds; ``hang`` makes a ping
    wait for ever (a store that does not answer)."""

    def __init__(self) -> None:
        super().__init__()
        self.fault: StoreError | None = None
        self.hang = False
        self.ping_ok = anyio.Event()

    def _check(self) -> None:
        if self.fault is not None:
            raise self.fault

    async def start(self, state: Any, owner: str, lease_until: float, turn: int = 0) -> None:
        self._check()
        await super().start(state, owner, lease_until, turn)

    async def accept(
        self, answer: Answer, now: float, *, delivered: bool = False, by: str | None = None
    ) -> Accepted:
        self._check()
        return await super().accept(answer, now, delivered=delivered, by=by)

    async def outstanding(self, now: float | None = None) -> Any:
        self._check()
        return await super().outstanding(now)

    async def load(self, run_id: str) -> Any:
        self._check()
        return await super().load(run_id)

    async def list_runs(self, query: Any) -> Any:
        self._check()
        return await super().list_runs(query)

    async def list_requests(self, query: Any) -> Any:
        self._check()
        return await super().list_requests(query)

    async def run_view(self, run_id: str) -> Any:
        self._check()
        return await super().run_view(run_id)

    async def ping(self) -> None:
        if self.hang:
            await anyio.Event().wait()
        self._check()
        await super().ping()
        # Set before this returns: the pinger has taken the result in by the time a
        # waiter runs.
        self.ping_ok.set()
        self.ping_ok = anyio.Event()


def down(retry_after: float = 2.5) -> StoreUnavailableError:
    return StoreUnavailableError(DOWN, retry_after=retry_after)


async def reply_of(http: Any, method: str, path: str, body: Any = None) -> tuple[int, Any, Any]:
    """(status, JSON body, headers) of one request."""
    async with http.request(method, path, json=body) as reply:
        return reply.status, await reply.json(), reply.headers


async def parked_run(http: Any) -> tuple[str, str]:
    """A demo run waiting for its login: (run id, request id)."""
    async with events(http) as stream:
        run_id = (await post(http, "/runs", {"prompt": "Dinner for two"}))[1]["id"]
        login = (await stream.until("pending", run_id=run_id))["request"]
    return run_id, login["id"]


def assert_unavailable(status: int, body: Any, headers: Any, *, seconds: str = "3") -> None:
    assert status == 503, body
    assert headers["Retry-After"] == seconds  # 2.5 s, in whole seconds, rounded up
    assert body == {"error": f"the run store is unavailable ({DOWN}); try again in {seconds} s"}, (
        body
    )


async def test_each_store_route_is_503_with_retry_after_while_down_and_works_after():
    """POST /runs, GET /runs, GET /requests and POST /requests/{id}/answer while the store
    is down:
    503, Retry-After, the JSON error that names the store's server; once it is back, each
    works, and the answer that failed is taken when sent again."""
    with anyio.fail_after(LIMIT):
        async with FaultyStore() as store, serving(demo_app(store)) as http:
            run_id, request_id = await parked_run(http)
            store.fault = down()
            answer = f"/requests/{request_id}/answer"
            assert_unavailable(*await reply_of(http, "POST", "/runs", {"prompt": "Lunch"}))
            assert_unavailable(*await reply_of(http, "GET", "/requests"))
            assert_unavailable(*await reply_of(http, "POST", answer, {"ok": True}))
            async with http.get("/readyz") as reply:
                assert reply.status == 503 and reply.headers["Retry-After"] == "3"
                assert await reply.json() == {"status": "unavailable"}
            async with http.get("/healthz") as reply:  # the process still serves
                assert (reply.status, await reply.json()) == (200, {"status": "ok"})
            # The store is the source of truth for every read (issue 34): no stale listing.
            assert_unavailable(*await reply_of(http, "GET", "/runs"))
            assert_unavailable(*await reply_of(http, "GET", f"/runs/{run_id}"))

            store.fault = None
            status, listing, _ = await reply_of(http, "GET", "/requests")
            assert status == 200 and [r["id"] for r in listing["requests"]] == [request_id]
            assert await post(http, answer, {"ok": True}) == (200, {"id": request_id, "ok": True})
            assert (await post(http, "/runs", {"prompt": "Lunch"}))[0] == 202
            async with http.get("/readyz") as reply:
                assert (reply.status, await reply.json()) == (200, {"status": "ready"})


async def test_retry_after_is_whole_seconds_and_at_least_one():
    with anyio.fail_after(LIMIT):
        async with FaultyStore() as store, serving(demo_app(store)) as http:
            for hint, seconds in ((0.01, "1"), (0.0, "1"), (1.0, "1"), (7.2, "8")):
                store.fault = down(hint)
                status, body, headers = await reply_of(http, "GET", "/requests")
                assert_unavailable(status, body, headers, seconds=seconds)


async def test_get_run_reading_the_store_is_503_while_it_is_down():
    with anyio.fail_after(LIMIT):
        async with FaultyStore() as store, serving(demo_app(store)) as http:
            run_id, _ = await parked_run(http)
            store.fault = down()
            assert_unavailable(*await reply_of(http, "GET", f"/runs/{run_id}"))


async def test_an_outage_is_logged_once_when_it_starts_and_once_when_it_ends(caplog):
    """Many failing requests: one WARNING when it starts, no traceback; the probe sees the
    store back without any request, and says so once, with how long it lasted."""
    caplog.set_level(logging.INFO, logger=SERVE_LOG)
    with anyio.fail_after(LIMIT):
        async with FaultyStore() as store, serving(demo_app(store)) as http:
            _, request_id = await parked_run(http)
            store.fault = down()
            for _ in range(10):
                assert (await reply_of(http, "GET", "/requests"))[0] == 503
                assert (await reply_of(http, "POST", "/runs", {"prompt": "x"}))[0] == 503
                answer = f"/requests/{request_id}/answer"
                assert (await reply_of(http, "POST", answer, {"ok": True}))[0] == 503
                assert (await reply_of(http, "GET", "/readyz"))[0] == 503
            store.fault = None
            await store.ping_ok.wait()  # the probe's ping: no request was sent
            told = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
            assert len(told) == 2, told
            assert re.fullmatch(
                rf"worker \S+: the run store is unavailable \({re.escape(DOWN)}\); runs wait, "
                "and what needs the store is refused, until it is back",
                told[0],
            )
            assert re.fullmatch(r"worker \S+: the run store is back after \d+\.\d s", told[1])
            assert not any(r.exc_info for r in caplog.records)

            # A second outage is told again; this time the readiness check sees its end.
            caplog.clear()
            store.fault = down()
            assert (await reply_of(http, "GET", "/readyz"))[0] == 503
            assert (await reply_of(http, "GET", "/requests"))[0] == 503
            store.fault = None
            assert (await reply_of(http, "GET", "/readyz"))[0] == 200
            told = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
            assert len(told) == 2, told
            assert "the run store is unavailable" in told[0]
            assert "the run store is back" in told[1]


async def test_a_healthy_store_is_not_reported(caplog):
    """Requests that succeed log no outage, and a ping's success ends none."""
    caplog.set_level(logging.INFO, logger=SERVE_LOG)
    with anyio.fail_after(LIMIT):
        async with FaultyStore() as store, serving(demo_app(store)) as http:
            await parked_run(http)
            assert (await reply_of(http, "GET", "/readyz"))[0] == 200
            assert (await reply_of(http, "GET", "/requests"))[0] == 200
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_the_probes_need_no_token_and_hold_no_data():
    with anyio.fail_after(LIMIT):
        async with FaultyStore() as store, serving(demo_app(store), headers=None) as http:
            for path, body in (("/healthz", {"status": "ok"}), ("/readyz", {"status": "ready"})):
                async with http.get(path) as reply:
                    assert (reply.status, await reply.json()) == (200, body)
                    assert reply.headers["Cache-Control"] == "no-store"
                    assert reply.headers["X-Frame-Options"] == "DENY"
                # A load balancer asks by the address it reaches the server at.
                async with http.get(path, headers={"Host": "10.1.2.3:8080"}) as reply:
                    assert reply.status == 200
                async with http.get(path, headers={"Host": "evil.example"}) as reply:
                    assert reply.status == 403  # the host check stays
                async with http.post(path, json={}) as reply:
                    assert reply.status == 401  # only GET is exempt
            for path in ("/runs", "/requests", "/metrics", "/healthz/", "/readyz/x"):
                async with http.get(path) as reply:
                    assert reply.status == 401, path
            store.fault = down()
            async with http.get("/readyz") as reply:
                assert reply.status == 503
                text = await reply.text()
            assert text == '{"status": "unavailable"}' and "db.example" not in text


async def test_readyz_waits_for_the_store_no_longer_than_the_store_timeout(caplog):
    caplog.set_level(logging.WARNING, logger=SERVE_LOG)
    with anyio.fail_after(LIMIT):
        async with (
            FaultyStore() as store,
            serving(demo_app(store, store_timeout=0.2), headers=None) as http,
        ):
            store.hang = True
            started = anyio.current_time()
            async with http.get("/readyz") as reply:
                assert reply.status == 503 and reply.headers["Retry-After"] == "1"
                assert await reply.json() == {"status": "unavailable"}
            assert anyio.current_time() - started < 2
            store.hang = False
    assert "the run store is unavailable (the run store did not answer within 0.2 s)" in (
        caplog.text
    )


async def test_a_damaged_run_is_409_and_another_store_error_500(caplog):
    """An answer to a run that cannot be read back: 409 naming it. A store error that is
    not a passing fault: 500 saying the store failed, in its words; neither is an
    outage."""
    caplog.set_level(logging.WARNING, logger=SERVE_LOG)
    with anyio.fail_after(LIMIT):
        async with FaultyStore() as store, serving(demo_app(store)) as http:
            run_id, request_id = await parked_run(http)
            answer = f"/requests/{request_id}/answer"
            damaged = f"stored run {run_id!r} cannot be read back: bad JSON; marked failed"
            store.fault = DamagedRunError(run_id, damaged)
            assert await post(http, answer, {"ok": True}) == (409, {"error": damaged})
            store.fault = StoreError("memory run store: a constraint failed")
            status, body = await post(http, answer, {"ok": True})
            assert (status, body) == (
                500,
                {"error": "the run store failed: memory run store: a constraint failed"},
            )
            store.fault = None
            assert await post(http, answer, {"ok": True}) == (200, {"id": request_id, "ok": True})
    assert "unavailable" not in caplog.text
    assert "the run store failed: memory run store: a constraint failed" in caplog.text


def test_grace_and_store_timeout_are_checked_by_create_app():
    toolkit = Toolkit.create(builtins=False)
    store = MemoryRunStore()  # never opened: nothing to close
    app_with = functools.partial(
        create_app, make_client=demo_client, toolkit=toolkit, store=store, insecure_no_auth=True
    )
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(UsageError, match="grace must be 0 or more seconds"):
            app_with(grace=bad)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(UsageError, match="store_timeout must be > 0 seconds"):
            app_with(store_timeout=bad)
    assert app_with(grace=0)[SERVE].grace == 0


# -- the command line ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "grace", "timeout"),
    [([], 30.0, 10.0), (["--grace", "0", "--store-timeout", "2.5"], 0.0, 2.5)],
)
def test_serve_hands_the_grace_and_the_store_timeout_on(
    monkeypatch, tmp_path, argv, grace, timeout
):
    """--grace reaches the app and aiohttp's wait for open requests; --store-timeout the
    store (its calls) and the app (its readiness check)."""
    import toolnexus_async.serve as serve
    from toolnexus_async.serve._outage import OUTAGE

    seen: dict[str, Any] = {}
    opened: list[float] = []
    real_open = serve.open_store

    def open_store(where: str, *, timeout: float = 10.0) -> Any:
        opened.append(timeout)
        return real_open(where, timeout=timeout)

    async def fake_run_server(app: Any, **kwargs: Any) -> None:
        seen["app"] = app
        seen.update(kwargs)

    monkeypatch.setattr(serve, "open_store", open_store)
    monkeypatch.setattr(serve, "run_server", fake_run_server)
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert main(["serve", "--store", str(tmp_path / "runs.sqlite"), *argv]) == 0
    assert seen["shutdown_timeout"] == grace and seen["app"][SERVE].grace == grace
    assert opened == [timeout]
    assert seen["app"][OUTAGE]._timeout == timeout


async def test_serve_with_a_store_it_cannot_open_says_so_in_one_line(tmp_path):
    """A file that is no database (a path that can name none: tests/test_serve_log.py)."""
    (tmp_path / "runs.sqlite").write_text("not a database, " * 512)
    command = [sys.executable, "-m", "toolnexus_async", "serve", "--port", "0"]
    command += ["--store", str(tmp_path / "runs.sqlite")]
    with anyio.fail_after(60):
        done = await anyio.run_process(command, check=False)
    err = done.stderr.decode()
    assert done.returncode == 1, err
    assert err.startswith("toolnexus-async serve: ") and len(err.splitlines()) == 1, err
    assert "runs.sqlite" in err and "Traceback" not in err


# -- a clean stop: the grace -----------------------------------------------------------------

SLOW_SECONDS = 2.0
TOKEN = "grace-tests-token-0123456789"


def serve_slow_tool(store: str, grace: str, marker: str) -> None:
    """A child process: the inbox on ``store`` with one tool, ``slow``, that prints
    ``slow started``, works for :data:`SLOW_SECONDS` and then writes ``marker``; the model
    calls it once and ends. Served by ``run_server`` with ``grace`` seconds for both the
    app's busy runs and the open requests, as ``serve --grace`` does."""

    @define_tool
    async def slow() -> str:
        """Work for a while."""
        print("slow started", flush=True)
        await anyio.sleep(SLOW_SECONDS)  # the work itself, not a wait for another task
        Path(marker).write_text("finished")
        return "finished"

    def model(messages: list[Message], tools: Any) -> AssistantMessage:
        if any(isinstance(m, ToolReturn) for m in messages):
            return AssistantMessage("done")
        return AssistantMessage(None, (ToolCall("c1", "slow", {}),))

    async def serve() -> None:
        async with (
            SqliteRunStore(store) as runs,
            Toolkit.create(builtins=False, extra_tools=[slow]) as toolkit,
        ):
            app = create_app(
                make_client=lambda inbox: LlmClient.in_process(model, wait_for=inbox),
                toolkit=toolkit,
                store=runs,
                token=TOKEN,
                grace=float(grace),
            )
            await run_server(
                app,
                port=0,
                on_ready=lambda url: print(f"Open the inbox: {url}/", flush=True),
                shutdown_timeout=float(grace),
            )

    anyio.run(serve)


@pytest.mark.parametrize(("grace", "finished"), [(5.0, True), (0.5, False)])
async def test_sigterm_gives_a_busy_tool_its_grace_and_no_more(tmp_path, grace, finished):
    """A tool that takes 2 s, its server stopped with SIGTERM right after it started: it
    finishes (and its run is done in the store) with a grace of 5 s; with 0.5 s it is cut,
    the server says so in one line, and its run stays in the store, unfinished, for the
    next server."""
    store, marker = tmp_path / "runs.sqlite", tmp_path / "finished"
    code = (
        "import sys; from tests.test_serve_store_faults import serve_slow_tool; "
        "serve_slow_tool(*sys.argv[1:])"
    )
    command = [sys.executable, "-c", code, str(store), str(grace), str(marker)]
    root = Path(__file__).resolve().parent.parent
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    with anyio.fail_after(60):
        async with await anyio.open_process(command, env=env, cwd=root) as process:
            assert process.stdout is not None and process.stderr is not None
            out = b""
            while b"Open the inbox: " not in out or not out.endswith(b"\n"):
                out += await process.stdout.receive()
            url = URL(out.decode().split("Open the inbox: ")[1].split()[0])
            auth = {"Authorization": f"Bearer {TOKEN}"}
            async with aiohttp.ClientSession(headers=auth) as session:
                async with session.post(url / "runs", json={"prompt": "go"}) as reply:
                    assert reply.status == 202
                    run_id = (await reply.json())["id"]
            while b"slow started" not in out:
                out += await process.stdout.receive()
            process.send_signal(signal.SIGTERM)
            err = b"".join([chunk async for chunk in process.stderr]).decode()
            assert await process.wait() == 0, err
    assert "Traceback" not in err
    assert marker.exists() is finished
    async with SqliteRunStore(store) as runs:
        status = {r.run_id: r.status for r in await runs.runs()}[run_id]
    if finished:
        assert status == "done"
        assert "grace" not in err
    else:
        assert status == "running"  # let go, not failed: the next server goes on with it
        assert "the grace of 0.5 s is over" in err


class FaultyEverywhere(FaultyStore):
    """``FaultyStore`` whose host-side calls fail too (its look for answers to hand over,
    renewals): the durable host sees the outage as well as the requests do."""

    def __init__(self) -> None:
        super().__init__()
        self.host_met_it = anyio.Event()

    async def deliveries(self, owner: str) -> list[tuple[str, Answer]]:
        if self.fault is not None:
            self.host_met_it.set()
        self._check()
        return await super().deliveries(owner)

    async def renew(self, owner: str, lease_until: float) -> None:
        self._check()
        await super().renew(owner, lease_until)


async def test_the_host_and_the_requests_tell_one_outage_once(caplog):
    """The host's sweep and the server's requests both meet the outage: the process logs
    one line when it starts and one when it ends, not one per party."""
    caplog.set_level(logging.INFO)
    with anyio.fail_after(LIMIT):
        async with FaultyEverywhere() as store, serving(demo_app(store)) as http:
            await parked_run(http)
            store.fault = down()
            assert (await reply_of(http, "GET", "/requests"))[0] == 503
            await store.host_met_it.wait()  # the host met it too
            assert (await reply_of(http, "GET", "/readyz"))[0] == 503
            store.fault = None
            assert (await reply_of(http, "GET", "/readyz"))[0] == 200
    told = [r.getMessage() for r in caplog.records if "the run store is" in r.getMessage()]
    assert len(told) == 2, told
    assert "unavailable" in told[0] and "is back" in told[1]
