"""The routes of the serve app: starting, listing and showing runs, listing and answering
requests, the probes, the event stream, the metrics and the page's files.

Rule of this module: each handler reads the app's state through :data:`SERVE` and refuses
bad input with :class:`ApiError` (a JSON error); an answer goes through
:func:`~._state.hand_over`, whichever route brought it. The app's assembly and lifecycle
are ``_app``'s.
"""

from __future__ import annotations

import mimetypes
import re
from pathlib import Path

import anyio
from aiohttp import web

from .._core.errors import UnknownRequestError
from .._core.types import Answer
from ._bodies import ApiError, is_text, only, read_json_object
from ._events import stream_events
from ._guard import principal_of
from ._outage import OUTAGE, retry_after
from ._queries import cursor_of, request_query, run_query
from ._runs import run_detail, run_item, shown
from ._state import SERVE, hand_over, start_run

STATIC_DIR = Path(__file__).resolve().parent / "static"
OPENAPI = STATIC_DIR.parent / "openapi.json"

MAX_PROMPT = 10_000
REASONS = ("declined", "cancelled", "expired")

_STATIC_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")
_METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_NO_STORE = {"Cache-Control": "no-store"}


# -- runs ---------------------------------------------------------------------------------------


async def post_run(request: web.Request) -> web.Response:
    """``POST /runs {"prompt": str, "output_schema"?: object}``: start a run (its output
    validated against the schema, when one is given); 202 with its id."""
    serve = request.app[SERVE]
    body = await read_json_object(request)
    only(body, ("prompt", "output_schema"))
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise ApiError(422, "'prompt' must be a string")
    if not prompt.strip():
        raise ApiError(422, "'prompt' must not be empty")
    if len(prompt) > MAX_PROMPT:
        raise ApiError(422, f"'prompt' is longer than {MAX_PROMPT} characters")
    schema = body.get("output_schema")
    if schema is not None and not isinstance(schema, dict):
        raise ApiError(400, "'output_schema' must be a JSON Schema object")
    begun = await start_run(serve, prompt, output_schema=schema)
    return web.json_response({"id": begun.run_id, "status": "running"}, status=202)


async def list_runs(request: web.Request) -> web.Response:
    """``GET /runs``: a page of the store's runs, newest first, with the total and counts."""
    serve = request.app[SERVE]
    page = await serve.store.list_runs(run_query(request.query))
    return web.json_response(
        {
            "runs": [run_item(item) for item in page.runs],
            "next": cursor_of("r", page.next),
            "total": page.total,
            "counts": page.counts,
        }
    )


async def get_run(request: web.Request) -> web.Response:
    """``GET /runs/{id}``: one run as the store has it, with its whole history."""
    serve = request.app[SERVE]
    run_id = request.match_info["id"]
    if not is_text(run_id):
        raise ApiError(404, f"no run {run_id!r}")
    try:
        view = await serve.store.run_view(run_id)
    except UnknownRequestError:
        raise ApiError(404, f"no run {run_id!r}") from None
    return web.json_response(run_detail(view))


# -- requests -----------------------------------------------------------------------------------


async def list_requests(request: web.Request) -> web.Response:
    """``GET /requests``: a page of the outstanding requests, oldest first, parked or
    spilled, on any worker, with the total and counts per kind; the first page starts with
    this process's inline questions."""
    serve = request.app[SERVE]
    query = request_query(request.query)
    page = await serve.store.list_requests(query)
    listing = {
        "requests": [shown(s.request, run_id=s.run_id) for s in page.requests],
        "next": cursor_of("q", page.next),
        "total": page.total,
        "counts": dict(page.counts),
    }
    if serve.inline is not None:
        serve.inline.add_to(listing, query)  # this process's MCP inline questions
    return web.json_response(listing)


async def post_answer(request: web.Request) -> web.Response:
    """``POST /requests/{id}/answer {"ok": bool, "data"?, "reason"?}``: wake its run."""
    serve = request.app[SERVE]
    request_id = request.match_info["id"]
    if not is_text(request_id):
        # No request has such an id, and a store need not be asked (PostgreSQL refuses NUL);
        # worded as the store's own 404, so a client sees one message for an unknown id.
        raise ApiError(404, f"no run waits for request {request_id!r}")
    body = await read_json_object(request)
    only(body, ("id", "ok", "data", "reason"))
    if body.get("id", request_id) != request_id:
        raise ApiError(422, f"the body names request {body['id']!r}, the path {request_id!r}")
    reason = body.get("reason")
    if reason is not None and reason not in REASONS:
        raise ApiError(422, f"'reason' must be one of {', '.join(REASONS)}, got {reason!r}")
    try:
        answer = Answer.from_dict({**body, "id": request_id})
    except ValueError as exc:  # PayloadError
        raise ApiError(422, str(exc)) from None
    await hand_over(serve, answer, principal_of(request))
    return web.json_response({"id": request_id, "ok": answer.ok})


# -- probes -------------------------------------------------------------------------------------


async def healthz(request: web.Request) -> web.Response:
    """``GET /healthz``: 200 while the process serves requests (liveness)."""
    return web.json_response({"status": "ok"}, headers=_NO_STORE)


async def readyz(request: web.Request) -> web.Response:
    """``GET /readyz``: 200 while the store answers a ping in time, else 503 (readiness)."""
    if request.app[SERVE].closing:
        return _unready(1)
    fault = await request.app[OUTAGE].ping()
    if fault is not None:
        return _unready(retry_after(fault))
    return web.json_response({"status": "ready"}, headers=_NO_STORE)


def _unready(seconds: int) -> web.Response:
    # No reason in the body: it is served without the token, and the store's message
    # names its server. The log has it.
    headers = {**_NO_STORE, "Retry-After": str(seconds)}
    return web.json_response({"status": "unavailable"}, status=503, headers=headers)


# -- streams, metrics, files --------------------------------------------------------------------


async def events(request: web.Request) -> web.StreamResponse:
    """``GET /events``: the server-sent event stream (every run's events, from the store)."""
    serve = request.app[SERVE]
    feed = serve.feed
    if feed is None or serve.closing:
        raise ApiError(503, "the server is shutting down")
    return await stream_events(request, serve.bus, feed.cursor, feed.replay)


async def metrics(request: web.Request) -> web.Response:
    """``GET /metrics``: the client's Prometheus text."""
    client = request.app[SERVE].client
    text = client.metrics() if client is not None else ""
    return web.Response(body=text.encode(), headers={"Content-Type": _METRICS_TYPE})


async def openapi(request: web.Request) -> web.Response:
    """``GET /openapi.json``: the API description."""
    return await _file(OPENAPI.parent, OPENAPI.name)


async def index(request: web.Request) -> web.Response:
    """``GET /``: the page."""
    return await _file(request.app[SERVE].static, "index.html")


async def static(request: web.Request) -> web.Response:
    """``GET /static/{name}``: the page's scripts and styles."""
    return await _file(request.app[SERVE].static, request.match_info["name"])


async def _file(folder: Path, name: str) -> web.Response:
    # One plain file name, no separators and no leading dot: nothing outside the folder.
    # Read whole and awaited (the files are small): unlike FileResponse, which closes its
    # file in an executor job nobody waits for, this leaves nothing running behind.
    if not _STATIC_NAME.fullmatch(name):
        raise ApiError(404, f"no file {name!r}")
    try:
        body = await anyio.Path(folder, name).read_bytes()
    except OSError:  # missing, a directory, unreadable
        raise ApiError(404, f"no file {name!r}") from None
    kind = mimetypes.guess_type(name)[0] or "application/octet-stream"
    text = kind.startswith("text/") or kind in ("application/javascript", "application/json")
    return web.Response(
        body=body,
        content_type=kind,
        charset="utf-8" if text else None,
        headers={"Cache-Control": "no-cache"},
    )
