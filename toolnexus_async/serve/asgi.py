"""serve's runs behind AG-UI and the AI SDK's UI message stream, as an ASGI application a
FastAPI or Starlette service mounts (``pip install -e '.[asgi]'`` in a checkout).

Rules of this module:

- :class:`UiEndpoints` is what ``create_app`` is for aiohttp, less the inbox's page and
  API: the same runs (the store's, on any worker), started and answered the same way
  (``_state.start_run``, ``_state.hand_over``), the same protocols (``_ui``). It owns its
  client, durable host and task group between ``async with`` and its end, which the host
  app's lifespan holds: a mounted application's own lifespan is not run by Starlette.
- Every request is authorised before anything is read: the bearer token (compared in
  constant time), or the host's own ``authorize(request)`` callback (its sessions, its
  OAuth). Without either it refuses to start, unless made with ``insecure_no_auth=True``.
  The host and origin checks of the inbox are the host app's (its CORS, its proxies).
- Bodies are read within ``max_body`` and checked by the inbox's rules (``_bodies``);
  every error is JSON ``{"error": ...}``. A stream ends when its run waits or ends, the
  server stops, or the client leaves (its task is cancelled; the run goes on).
"""

from __future__ import annotations

import contextlib
import hmac
import inspect
import math
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Self

import anyio

try:
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route, Router
    from starlette.types import Receive, Scope, Send
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError(
        "toolnexus_async.serve.asgi needs Starlette: pip install -e '.[asgi]' in a "
        "checkout of toolnexus-async"
    ) from exc

from .._core.errors import UsageError
from .._core.ui import agui, aisdk
from .._core.ui.answers import Refusal
from ..durable import RunStore
from ..tools._standard import Toolkit
from ._app import GRACE, MAX_ACTIVE_RUNS, running
from ._bodies import ApiError, decode_object
from ._events import EventBus
from ._outage import StoreOutage
from ._routes import STATIC_DIR
from ._sessions import check_token
from ._state import MakeClient, ServeState
from ._ui import follow_aisdk, reconnect_aisdk, run_agui, run_aisdk
from ._ui_routes import CHAT_HEADERS, SSE_HEADERS

__all__ = ("Authorize", "UiEndpoints")

# (request) -> whether it may use the endpoints; sync or async. The host's own check.
Authorize = Callable[[Request], bool | str | Awaitable[bool | str]]

_Emit = Callable[[dict[str, Any]], Awaitable[None]]


class UiEndpoints:
    """The AG-UI and AI SDK endpoints of serve's runs, as an ASGI application
    (:attr:`app`), open between ``async with`` and its end::

        endpoints = UiEndpoints(make_client=..., toolkit=toolkit, store=store, token=TOKEN)

        @contextlib.asynccontextmanager
        async def lifespan(app):
            async with store, endpoints:
                yield

        api = FastAPI(lifespan=lifespan)
        api.mount("/agent", endpoints.app)  # POST /agent/ag-ui, POST /agent/ai-sdk/chat

    Args:
        make_client, toolkit, store, park_timeout, lease, grace, max_active_runs,
            max_body, store_timeout: as for :func:`~toolnexus_async.serve.create_app`.
        token: the bearer token every request must carry (``Authorization: Bearer``).
        authorize: the host's own check instead, ``(request) -> bool | str`` (sync or
            async), given the Starlette request: False is 401; a name (a user id, say) is
            whom the request's answers are recorded as given by (``answered_by``), True
            records them as ``"host"``.
        insecure_no_auth: serve without either, for tests on your own machine.
    """

    def __init__(
        self,
        *,
        make_client: MakeClient,
        toolkit: Toolkit,
        store: RunStore,
        token: str | None = None,
        authorize: Authorize | None = None,
        insecure_no_auth: bool = False,
        park_timeout: float = 300.0,
        lease: float = 30.0,
        grace: float = GRACE,
        max_active_runs: int = MAX_ACTIVE_RUNS,
        max_body: int = 64 * 1024,
        store_timeout: float = 10.0,
    ) -> None:
        given = (token is not None) + (authorize is not None) + bool(insecure_no_auth)
        if given != 1:
            raise UsageError(
                "UiEndpoints needs exactly one of token=, authorize= or insecure_no_auth=True"
            )
        if not park_timeout > 0 or not lease > 0 or not 0 <= grace < math.inf:
            raise UsageError("park_timeout and lease must be > 0 seconds, grace 0 or more")
        if max_body < 1 or max_active_runs < 1:
            raise UsageError("max_body and max_active_runs must be at least 1")
        self._token = None if token is None else check_token(token)
        self._authorize = authorize
        self._max_body = max_body
        self._serve = ServeState(
            make_client,
            toolkit,
            store,
            park_timeout,
            lease,
            grace,
            STATIC_DIR,
            EventBus(),
            max_active_runs,
        )
        self._outage = StoreOutage(store, timeout=store_timeout)
        self._life: contextlib.AbstractAsyncContextManager[None] | None = None
        self.app = Router(
            routes=[
                Route("/ag-ui", self._agui, methods=["POST"]),
                Route("/ai-sdk/chat", self._chat, methods=["POST"]),
                Route("/ai-sdk/chat/{id}/stream", self._reconnect, methods=["GET"]),
            ]
        )

    def __repr__(self) -> str:
        how = "token" if self._token else "authorize" if self._authorize else "no auth"
        return f"UiEndpoints({how})"

    async def __aenter__(self) -> Self:
        if self._life is not None:
            raise UsageError("these UiEndpoints are open already")
        life = running(self._serve, self._outage)
        await life.__aenter__()
        self._life = life
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        life, self._life = self._life, None
        if life is not None:
            self._serve.closing = True
            await life.__aexit__(exc_type, exc, tb)

    # -- the routes -----------------------------------------------------------------------

    async def _agui(self, request: Request) -> Response:
        return await self._protocol(request, agui.parse_input, run_agui, agui.encode, SSE_HEADERS)

    async def _chat(self, request: Request) -> Response:
        return await self._protocol(
            request, aisdk.parse_chat, run_aisdk, aisdk.encode, CHAT_HEADERS, aisdk.DONE
        )

    async def _protocol(
        self,
        request: Request,
        parse: Callable[[dict[str, Any]], Any],
        run: Callable[..., Awaitable[None]],
        encode: Callable[[dict[str, Any]], bytes],
        headers: dict[str, str],
        done: bytes | None = None,
    ) -> Response:
        """A protocol's stream for ``request``'s body, parsed by ``parse``, run by ``run``."""
        body = await self._body(request)
        if isinstance(body, Response):
            return body
        try:
            given = parse(body)
        except Refusal as exc:
            return _error(422, str(exc))
        serve = self._serve

        answered_by = self._principal(request)

        async def produce(emit: _Emit) -> None:
            await run(serve, given, emit, answered_by=answered_by)

        return _Stream(produce, encode, headers, done)

    async def _reconnect(self, request: Request) -> Response:
        refused = await self._refused(request)
        if refused is not None:
            return refused
        chat_id = request.path_params["id"]
        serve = self._serve
        if serve.closing:
            return _error(503, "the server is shutting down")
        stream = await reconnect_aisdk(serve, chat_id)
        if stream is None:
            return Response(status_code=204)
        found = stream

        async def produce(emit: _Emit) -> None:
            await follow_aisdk(serve, chat_id, found, emit)

        return _Stream(produce, aisdk.encode, CHAT_HEADERS, aisdk.DONE)

    # -- checks ---------------------------------------------------------------------------

    async def _refused(self, request: Request) -> Response | None:
        """401 unless the request is authorised."""
        if self._authorize is not None:
            allowed = self._authorize(request)
            if inspect.isawaitable(allowed):
                allowed = await allowed
            if allowed is True or (isinstance(allowed, str) and allowed):
                request.state.toolnexus_principal = allowed if isinstance(allowed, str) else "host"
                return None
            return _error(401, "not authorised")
        if self._token is None:
            return None  # insecure_no_auth
        scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
        given = credentials.strip() if scheme.lower() == "bearer" else ""
        if hmac.compare_digest(given.encode("utf-8", "backslashreplace"), self._token.encode()):
            return None
        return _error(401, "send the token as Authorization: Bearer <token>")

    def _principal(self, request: Request) -> str:
        """Who an admitted request's answers are recorded as given by (``answered_by``):
        what ``authorize`` returned when it returned a name (``"host"`` for True), ``"api"``
        for the token, ``"anonymous"`` without auth. Never the token."""
        if self._authorize is not None:
            return str(getattr(request.state, "toolnexus_principal", "host"))
        return "api" if self._token is not None else "anonymous"

    async def _body(self, request: Request) -> dict[str, Any] | Response:
        """The request's JSON object, or the refusal (401, 413, 415, 422, 503)."""
        refused = await self._refused(request)
        if refused is not None:
            return refused
        if self._serve.closing or self._life is None:
            return _error(503, "the server is shutting down, or not started")
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            return _error(415, "send the body as JSON, with Content-Type: application/json")
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > self._max_body:
                return _error(413, f"the request body is larger than {self._max_body} bytes")
        try:
            return decode_object(bytes(raw))
        except ApiError as exc:
            return _error(exc.status, str(exc))


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


class _Stream(Response):
    """A server-sent event stream whose events ``produce`` emits; cancelled when the client
    leaves (the run it follows goes on)."""

    def __init__(
        self,
        produce: Callable[[_Emit], Awaitable[None]],
        encode: Callable[[dict[str, Any]], bytes],
        headers: dict[str, str],
        done: bytes | None = None,
    ) -> None:
        # Not Response.__init__, which would add a Content-Length of 0 to an empty body.
        self.status_code = 200
        self.background = None
        self.raw_headers = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        self._produce = produce
        self._encode = encode
        self._done = done

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})

        async def emit(event: dict[str, Any]) -> None:
            await send(
                {"type": "http.response.body", "body": self._encode(event), "more_body": True}
            )

        async with anyio.create_task_group() as tg:
            tg.start_soon(_until_gone, receive, tg.cancel_scope)
            await self._produce(emit)
            if self._done is not None:
                await send({"type": "http.response.body", "body": self._done, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            tg.cancel_scope.cancel()


async def _until_gone(receive: Receive, scope: anyio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()
