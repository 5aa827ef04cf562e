"""The front-end protocols' routes of the serve app (aiohttp): ``POST /ag-ui``, and the
AI SDK's ``POST /ai-sdk/chat`` and ``GET /ai-sdk/chat/{id}/stream``.

Rule of this module: a handler checks the body (a malformed one is a JSON error, as on
every route), then streams what ``_ui`` sends, framed as server-sent events; a protocol's
refusal (an unknown interrupt, an expired one) is an event of the stream, not a status.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from aiohttp import web

from .._core.ui import agui, aisdk
from .._core.ui.answers import Refusal
from ._bodies import ApiError, read_json_object
from ._guard import principal_of
from ._state import SERVE
from ._ui import Send, follow_aisdk, reconnect_aisdk, run_agui, run_aisdk

__all__ = ("CHAT_HEADERS", "SSE_HEADERS", "get_chat_stream", "post_agui", "post_chat")

SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # tell nginx-style proxies not to buffer the stream
}
CHAT_HEADERS = {**SSE_HEADERS, **aisdk.HEADERS}


async def post_agui(request: web.Request) -> web.StreamResponse:
    """``POST /ag-ui``: a ``RunAgentInput`` in, the AG-UI events of its thread's run out."""
    serve = request.app[SERVE]
    try:
        given = agui.parse_input(await read_json_object(request))
    except Refusal as exc:
        raise ApiError(422, str(exc)) from None
    produce = partial(run_agui, serve, given, answered_by=principal_of(request))
    return await _streamed(request, produce, agui.encode, SSE_HEADERS)


async def post_chat(request: web.Request) -> web.StreamResponse:
    """``POST /ai-sdk/chat``: ``useChat``'s request in, the UI message stream of its run out."""
    serve = request.app[SERVE]
    try:
        given = aisdk.parse_chat(await read_json_object(request))
    except Refusal as exc:
        raise ApiError(422, str(exc)) from None
    produce = partial(run_aisdk, serve, given, answered_by=principal_of(request))
    return await _streamed(request, produce, aisdk.encode, CHAT_HEADERS, aisdk.DONE)


async def get_chat_stream(request: web.Request) -> web.StreamResponse:
    """``GET /ai-sdk/chat/{id}/stream``: a reconnecting client gets its run's reply message
    again, whole, then follows the run until it waits or ends; 204 when there is no such run."""
    serve = request.app[SERVE]
    chat_id = request.match_info["id"]
    stream = await reconnect_aisdk(serve, chat_id)
    if stream is None:
        return web.Response(status=204)
    produce = partial(follow_aisdk, serve, chat_id, stream)
    return await _streamed(request, produce, aisdk.encode, CHAT_HEADERS, aisdk.DONE)


async def _streamed(
    request: web.Request,
    produce: Callable[[Send], Awaitable[None]],
    encode: Callable[[dict[str, Any]], bytes],
    headers: dict[str, str],
    done: bytes | None = None,
) -> web.StreamResponse:
    """The server-sent events ``produce`` sends, then ``done``."""
    response = web.StreamResponse(headers=headers)
    await response.prepare(request)

    async def send(event: dict[str, Any]) -> None:
        await response.write(encode(event))

    try:
        await produce(send)
        if done is not None:
            await response.write(done)
        await response.write_eof()
    except ConnectionError:
        pass  # the client left; the run goes on, and the same request follows it again
    return response
