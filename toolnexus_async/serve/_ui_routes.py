"""The front-end protocols' routes of the serve app (aiohttp): ``POST /ag-ui``, and the
AI SDK's ``POST /ai-sdk/chat`` and ``GET /ai-sdk/chat/{id}/stream``.

Rule of this module: a handler checks the body (a malformed one is a JSON error, as on
every route), then streams what ``_ui`` sends, framed as server-sent events; a protocol's
refusal (an unknown interrupt, an expired one) is an event of the stream, not a status.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..ui import agui, aisdk
from ..ui.answers import Refusal
from ._bodies import ApiError, read_json_object
from ._state import SERVE
from ._ui import follow_aisdk, reconnect_aisdk, run_agui, run_aisdk

__all__ = ("SSE_HEADERS", "get_chat_stream", "post_agui", "post_chat")

SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # tell nginx-style proxies not to buffer the stream
}


async def post_agui(request: web.Request) -> web.StreamResponse:
    """``POST /ag-ui``: a ``RunAgentInput`` in, the AG-UI events of its thread's run out."""
    serve = request.app[SERVE]
    body = await read_json_object(request)
    try:
        given = agui.parse_input(body)
    except Refusal as exc:
        raise ApiError(422, str(exc)) from None
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)

    async def send(event: dict[str, Any]) -> None:
        await response.write(agui.encode(event))

    try:
        await run_agui(serve, given, send)
        await response.write_eof()
    except ConnectionError:
        pass  # the client left; the run goes on, and the same input follows it again
    return response


async def post_chat(request: web.Request) -> web.StreamResponse:
    """``POST /ai-sdk/chat``: ``useChat``'s request in, the UI message stream of its run out."""
    serve = request.app[SERVE]
    body = await read_json_object(request)
    try:
        given = aisdk.parse_chat(body)
    except Refusal as exc:
        raise ApiError(422, str(exc)) from None
    response = web.StreamResponse(headers={**SSE_HEADERS, **aisdk.HEADERS})
    await response.prepare(request)

    async def send(part: dict[str, Any]) -> None:
        await response.write(aisdk.encode(part))

    try:
        await run_aisdk(serve, given, send)
        await response.write(aisdk.DONE)
        await response.write_eof()
    except ConnectionError:
        pass  # the client left; the run goes on, and it may reconnect
    return response


async def get_chat_stream(request: web.Request) -> web.StreamResponse:
    """``GET /ai-sdk/chat/{id}/stream``: a reconnecting client follows what its run does
    from now on; 204 when the run does nothing now (it waits, or ended)."""
    serve = request.app[SERVE]
    chat_id = request.match_info["id"]
    stream = await reconnect_aisdk(serve, chat_id)
    if stream is None:
        return web.Response(status=204)
    response = web.StreamResponse(headers={**SSE_HEADERS, **aisdk.HEADERS})
    await response.prepare(request)

    async def send(part: dict[str, Any]) -> None:
        await response.write(aisdk.encode(part))

    try:
        await follow_aisdk(serve, chat_id, stream, send)
        await response.write(aisdk.DONE)
        await response.write_eof()
    except ConnectionError:
        pass
    return response
