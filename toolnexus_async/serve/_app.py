"""``create_app``: the approval inbox as an aiohttp application (its assembly and lifespan;
the handlers are ``_routes``'s).

Rules of this module:

- Handlers validate, then act, then answer; they never await a run. A run is started in the
  app's task group; what it does is kept in the store, which every read and the event
  stream show (``_runs``, ``_feed``), whichever worker drives it.
- ``POST /runs`` admits at most ``max_active_runs`` runs started here and not yet ended or
  halted (429 with ``Retry-After`` beyond): each costs memory while it runs or is parked.
- Every background task (runs, resumes of spilled runs) lives in one anyio task group,
  opened by the app's cleanup context on startup and closed on shutdown: parked runs are
  saved to the store first, then whatever still runs is cancelled. Nothing is left behind.
  Startup and shutdown must therefore happen in the same task, as ``web.run_app``,
  ``AppRunner`` and aiohttp's ``TestClient`` do.
- Every error is JSON ``{"error": "..."}`` with the status the API documents; bodies are
  read and checked by ``_bodies`` before a handler acts on them. A store error that escapes
  a handler is mapped in one place, ``_outage.store_faults`` (503 while the store is
  unreachable), so no handler catches ``StoreError`` for that.
- A stop gives the runs still busy ``grace`` seconds, counted from the moment the server
  stops taking requests (``on_shutdown``), then cancels them; the next server on the
  store goes on with each from its last committed step.
- ``GET /healthz`` and ``GET /readyz`` say whether the process serves and whether its
  store answers, and nothing else: no address, no run.
- Nothing is served before ``_guard`` has checked the request's host, origin and token, and
  every response carries its security headers: the app is locked unless it was created
  with ``insecure_no_auth=True``.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import AsyncIterator, Iterable

import anyio
from aiohttp import web

from .._core.errors import UsageError
from .._engine.owner import TaskOwner
from ..durable import DurableHost, RunStore
from ..suspend import GcFreezer
from ..tools._standard import Toolkit
from ._bodies import MAX_BODY, ApiError, json_errors
from ._events import EventBus
from ._feed import EventFeed
from ._guard import GUARD, Guard, add_security_headers, guard_requests, log_out
from ._inline import InlineQuestions
from ._oauth import CALLBACK, oauth_callback
from ._outage import OUTAGE, StoreOutage, store_faults
from ._routes import (
    STATIC_DIR,
    events,
    get_run,
    healthz,
    index,
    list_requests,
    list_runs,
    metrics,
    openapi,
    post_answer,
    post_run,
    readyz,
    static,
)
from ._runs import ServeInbox
from ._state import SERVE, MakeClient, ServeState

__all__ = ("SERVE", "STATIC_DIR", "ApiError", "MakeClient", "create_app")

log = logging.getLogger("toolnexus_async.serve")


# Seconds a stop gives the runs still busy, by default: Kubernetes' default
# terminationGracePeriodSeconds, so that the stop fits in the time a pod is given.
GRACE = 30.0
# The freezer's pace of young collections (seconds): the lever measured in
# docs/performance.md (Loop stalls), which kept every stall under 30 ms with 100,000 runs
# parked.
FREEZE_YOUNG = 0.005
# Runs started here and not yet ended or halted, by default. A parked run costs about
# 9 KB (docs/performance.md) and one just started about 15 KiB (issue 34): 10,000 are
# 90 to 150 MiB, which fits a 512 MiB container beside the store's cache, while parking
# thousands (the point of this server) stays possible. Runs parked past park_timeout
# halt into the store and stop counting, so the bound is on memory, not on waiting runs.
MAX_ACTIVE_RUNS = 10_000


def create_app(
    *,
    make_client: MakeClient,
    toolkit: Toolkit,
    store: RunStore,
    park_timeout: float = 300.0,
    max_body: int = 64 * 1024,
    lease: float = 30.0,
    token: str | None = None,
    insecure_no_auth: bool = False,
    allowed_hosts: Iterable[str] = (),
    freeze_gc: bool = False,
    grace: float = GRACE,
    store_timeout: float = 10.0,
    max_active_runs: int = MAX_ACTIVE_RUNS,
    inline_questions: InlineQuestions | None = None,
) -> web.Application:
    """The approval-inbox web application.

    Args:
        make_client: called once at startup with the app's inbox; returns the
            :class:`LlmClient` that runs the prompts, created with ``wait_for=inbox``
            (else startup fails with :class:`UsageError`). The app closes it on shutdown.
        toolkit: the tools of every run (the caller keeps it open while the app runs).
        store: where runs parked longer than ``park_timeout`` seconds, and every parked
            run at shutdown, are saved; at startup the runs found there become answerable.
            The caller opens and closes it.
        park_timeout: seconds a run waits in memory before it is spilled to ``store``.
        max_body: the largest request body accepted, in bytes (413 above it).
        lease: seconds a run held by this server may go without a renewal before another
            server on the store (or this one, restarted) takes it over.
        token: what every request must carry (``Authorization: Bearer <token>``, or the
            session cookie ``GET /?token=<token>`` sets): 16 to 512 letters, digits or ``-._~``;
            :func:`new_token` makes one. Required unless ``insecure_no_auth``.
        insecure_no_auth: serve without a token check, for tests and experiments on your
            own machine (the host and origin checks and the headers stay).
        allowed_hosts: host names the ``Host`` header may carry besides the loopback names
            and IP literals (the name of a reverse proxy, say).
        freeze_gc: while the app runs, a :class:`~toolnexus_async.suspend.GcFreezer`
            (``young=0.005``, handing everything back whenever no run is parked) keeps the
            parked runs out of the collector's full passes, so that many parked runs do
            not stop the event loop for a full collection. It acts on the whole process,
            so it is off unless asked; ``toolnexus-async serve``, which owns its process,
            asks (``--no-freeze-gc`` does not).
        grace: seconds a stop gives the runs still busy (in a tool, or waiting for the
            model) to reach their next question or end, counted from the moment the
            server stops taking requests; then they are cancelled, and the next server on
            the store goes on with them. 0 or more, and finite.
        store_timeout: seconds ``GET /readyz`` (and the probe of a store that is down)
            waits for ``store.ping()``; give the store the same timeout for its calls
            (:func:`open_store` does).
        max_active_runs: the most runs started here (``POST /runs``) that may be running
            or parked at once; beyond it ``POST /runs`` answers 429 with ``Retry-After``.
        inline_questions: the :class:`InlineQuestions` given to ``toolkit`` as its
            ``wait_for``: the questions older MCP servers ask inside a call are then listed,
            streamed and answered like the store's requests, marked ``"durable": false``,
            while this process lives (docs/mcp.md). Without it such servers are not
            offered elicitation.
    """
    if not park_timeout > 0:  # NaN too
        raise UsageError(f"park_timeout must be > 0 seconds, got {park_timeout}")
    if not lease > 0:
        raise UsageError(f"lease must be > 0 seconds, got {lease}")
    if max_body < 1:
        raise UsageError(f"max_body must be at least 1 byte, got {max_body}")
    if not 0 <= grace < math.inf:
        raise UsageError(f"grace must be 0 or more seconds, and finite, got {grace}")
    if not 0 < store_timeout < math.inf:
        raise UsageError(f"store_timeout must be > 0 seconds, and finite, got {store_timeout}")
    if isinstance(max_active_runs, bool) or not isinstance(max_active_runs, int):
        raise UsageError(f"max_active_runs must be a whole number, got {max_active_runs!r}")
    if max_active_runs < 1:
        raise UsageError(f"max_active_runs must be at least 1, got {max_active_runs}")
    guard = Guard.create(token, insecure_no_auth=insecure_no_auth, allowed_hosts=allowed_hosts)
    app = web.Application(
        client_max_size=max_body, middlewares=[json_errors, guard_requests, store_faults]
    )
    app[GUARD] = guard
    app[MAX_BODY] = max_body
    app[OUTAGE] = StoreOutage(store, timeout=store_timeout)
    app.on_response_prepare.append(add_security_headers)
    bus = EventBus()
    app[SERVE] = ServeState(
        make_client,
        toolkit,
        store,
        park_timeout,
        lease,
        grace,
        STATIC_DIR,
        bus,
        max_active_runs,
        freeze_gc=freeze_gc,
        inline=inline_questions,
    )
    app.cleanup_ctx.append(_lifespan)
    app.on_shutdown.append(_stop_accepting)
    app.router.add_post("/runs", post_run)
    app.router.add_get("/runs", list_runs)
    app.router.add_get("/runs/{id}", get_run)
    app.router.add_get("/requests", list_requests)
    app.router.add_post("/requests/{id}/answer", post_answer)
    app.router.add_get("/events", events)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.json", openapi)
    app.router.add_get("/healthz", healthz)
    app.router.add_get(CALLBACK, oauth_callback)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/", index)
    app.router.add_post("/logout", log_out)
    app.router.add_get("/static/{name}", static)
    return app


async def _lifespan(app: web.Application) -> AsyncIterator[None]:
    serve = app[SERVE]
    inbox = ServeInbox(serve.park_timeout)
    client = serve.make_client(inbox)
    if client.wait_for is not inbox:
        await client.aclose()
        raise UsageError("make_client must create the LlmClient with wait_for=<the inbox given>")
    # The client is closed outside the task group, whose cancellation would cut its close.
    async with client:
        host = DurableHost(client, serve.toolkit, serve.store, lease=serve.lease)
        feed = EventFeed(serve.store, serve.bus)
        async with anyio.create_task_group() as tg, host:
            with _freezing(serve, inbox):
                app[OUTAGE].attach(host.store_health)  # one outage state, one log line
                tg.start_soon(app[OUTAGE].watch, name="the probe of the run store")
                await feed.open()
                tg.start_soon(feed.run, name="the event feed of the server")
                runs = await TaskOwner.open_in(tg, "the runs of the server")
                serve.client, serve.inbox, serve.host, serve.runs = client, inbox, host, runs
                serve.feed = feed
                if serve.inline is not None:
                    serve.inline.bus = serve.bus
                try:
                    yield
                finally:
                    feed.close()
                    serve.closing = True
                    serve.bus.close()
                    host.shutdown()  # parked runs halt (the store has them); busy ones are let go
                    if serve.inline is not None:  # their calls end now, not at the grace
                        serve.inline.halt_all()
                        serve.inline.bus = None
                    await _settle(serve, host)
                    tg.cancel_scope.cancel()
                    serve.runs = serve.host = None


async def _settle(serve: ServeState, host: DurableHost) -> None:
    """Wait for the busy runs to end or park, until the grace is over."""
    # Counted from on_shutdown when it ran: aiohttp waits for open requests in between,
    # and a grace restarted after that wait would let a stop outlast the time it is given.
    deadline = serve.stop_at if serve.stop_at is not None else anyio.current_time() + serve.grace
    with anyio.CancelScope(deadline=deadline) as scope:
        await host.settle(math.inf)  # the deadline, not a quiet spell, ends the wait
    if scope.cancelled_caught:
        log.warning(
            "the grace of %g s is over: the runs still busy are cancelled, and the next "
            "server on the store goes on with them",
            serve.grace,
        )


def _freezing(serve: ServeState, inbox: ServeInbox) -> contextlib.AbstractContextManager[object]:
    """The app's ``GcFreezer`` if it was asked for one (started on the loop, as its
    paced young collections need), else nothing. Everything frozen goes back to the
    collector whenever no run is parked, and at shutdown."""
    if not serve.freeze_gc:
        return contextlib.nullcontext()
    return GcFreezer(young=FREEZE_YOUNG, reclaim_when=lambda: len(inbox) == 0)


async def _stop_accepting(app: web.Application) -> None:
    # Before aiohttp waits for open handlers: event streams would otherwise hold it up.
    serve = app[SERVE]
    serve.closing = True
    if serve.stop_at is None:
        serve.stop_at = anyio.current_time() + serve.grace
    serve.bus.close()
