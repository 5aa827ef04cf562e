"""Request bodies and errors: a body is read within limits and refused before anything happens.

Rules of this module:

- A body is read only when sent as ``application/json`` (415: a page of another site
  cannot send that without the browser asking first), only up to ``max_body`` bytes
  (413), and within :data:`BODY_TIMEOUT` seconds (408; the connection is closed, as a
  client that trickles its body would otherwise hold it open).
- It must be UTF-8 JSON (RFC 8259), with no ``NaN`` or ``Infinity``, nested at most
  :data:`MAX_DEPTH` deep, and hold no lone surrogate (``"\\ud800"``) in any key or string
  (422). The depth is checked by an iterative scan *before* parsing, so the parser never
  recurses deep enough to raise ``RecursionError``. A lone surrogate cannot be encoded as
  UTF-8: let in, it would fail later, in the event stream or the store, after a run was
  recorded.
- Every error the API returns is JSON ``{"error": "..."}``; an exception nobody expected
  (a ``RecursionError``, say) is logged and answered 500 in JSON too, never as aiohttp's
  plain-text page. A client that went away is not an error to answer.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio
from aiohttp import web

__all__ = (
    "BODY_TIMEOUT",
    "MAX_BODY",
    "MAX_DEPTH",
    "ApiError",
    "decode_object",
    "is_text",
    "json_errors",
    "only",
    "read_json_object",
)

log = logging.getLogger("toolnexus_async.serve")

# Seconds a client has to send a whole body, once its request head has arrived.
BODY_TIMEOUT = 30.0
# The deepest nesting of arrays and objects a body may have (the answers the page sends
# are three deep).
MAX_DEPTH = 64

# The largest body an app accepts, in bytes (create_app's max_body).
MAX_BODY = web.AppKey("toolnexus_max_body", int)

_TOO_LARGE = "the request body is larger than {} bytes"
# A JSON string (the classic unrolled loop: linear even when the closing quote is
# missing), or a bracket that opens or closes a level.
_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.S)
# What JSON can spell but a store cannot keep as text: a lone surrogate (not a character),
# and U+0000 (PostgreSQL's text refuses it).
_NOT_TEXT = re.compile("[\x00\ud800-\udfff]")


class ApiError(Exception):
    """A refusal with its HTTP status; :func:`json_errors` turns it into ``{"error": ...}``.

    ``close`` ends the connection after the reply; ``headers`` are added to it.
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        close: bool = False,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.close = close
        self.headers = dict(headers or {})


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


@web.middleware
async def json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Every error the API returns is JSON, aiohttp's own (404, 405, 413) included."""
    try:
        return await handler(request)
    except ApiError as exc:
        response = _error(exc.status, str(exc), exc.headers)
        if exc.close:
            # Sent now, then the connection ends: aiohttp would otherwise linger, reading
            # what is left of the body, for as long again.
            response.force_close()
            await response.prepare(request)
            await response.write_eof()
            request.protocol.force_close()
        return response
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        message = None
        if exc.status == 413:
            message = _TOO_LARGE.format(request.app[MAX_BODY])
        return _error(exc.status, message or exc.reason, headers)
    except ConnectionError:
        raise  # the client left: there is nobody to answer
    except Exception:
        # The path only: a query string may hold a token (see _guard).
        log.exception("unexpected error answering %s %s", request.method, request.path)
        return _error(500, "internal server error")


async def read_json_object(request: web.Request) -> dict[str, Any]:
    """The body as a JSON object, or the right refusal (408, 413, 415, 422)."""
    max_body = request.app[MAX_BODY]
    if request.content_length is not None and request.content_length > max_body:
        raise ApiError(413, _TOO_LARGE.format(max_body))
    if request.content_type != "application/json":
        raise ApiError(415, "send the body as JSON, with Content-Type: application/json")
    if request.content.is_eof():
        # All of it came with the headers, as a small body does: nothing to wait for, so
        # no time limit to set (an anyio scope in an aiohttp handler's task cost 8 % of
        # the server's CPU under serve_load).
        raw = await request.read()
    else:
        try:
            with anyio.fail_after(BODY_TIMEOUT):
                raw = await request.read()  # aiohttp refuses (413) past client_max_size
        except TimeoutError:
            message = f"the request body did not arrive within {BODY_TIMEOUT:g} seconds"
            raise ApiError(408, message, close=True) from None
    return decode_object(raw)


def decode_object(raw: bytes) -> dict[str, Any]:
    """A body's bytes as a JSON object, or the 422 saying why not (every adapter's rules)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(422, f"the body is not valid JSON: it is not UTF-8 ({exc})") from None
    if _too_deep(text, MAX_DEPTH):
        raise ApiError(422, f"the body is nested deeper than {MAX_DEPTH} levels")
    try:
        body = _DECODER.decode(text)
    except (ValueError, RecursionError) as exc:
        raise ApiError(422, f"the body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(422, f"the body must be a JSON object, got {type(body).__name__}")
    if (found := _not_text(body)) is not None:
        raise ApiError(422, f"the body holds {found}, which is not text")
    return body


def is_text(value: str) -> bool:
    """Whether ``value`` (an id from a path, say) holds neither U+0000 nor a lone surrogate."""
    return _NOT_TEXT.search(value) is None


def only(body: dict[str, Any], allowed: tuple[str, ...]) -> None:
    """Refuse (422) a key outside ``allowed``: a misspelt key fails loudly."""
    if extra := ", ".join(map(repr, sorted(set(body) - set(allowed)))):
        raise ApiError(422, f"unknown key(s) {extra}; allowed: {', '.join(allowed)}")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999: as far from JSON as the word Infinity
        raise ValueError(f"the number {text} is too large for a double, so it is not JSON")
    return value


# One decoder for every body: json.loads with an argument builds a new one per call.
_DECODER = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite)


def _too_deep(text: str, limit: int) -> bool:
    """Whether arrays and objects nest deeper than ``limit`` (strings are skipped whole)."""
    if text.count("[") + text.count("{") <= limit:
        return False  # no deeper than all its openings: the usual body needs no scan
    depth = 0
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token in ("[", "{"):
            depth += 1
            if depth > limit:
                return True
        elif token in ("]", "}"):
            depth -= 1
    return False


def _not_text(value: Any) -> str | None:
    """What, in any string of ``value``, is not text; None if nothing."""
    # The parser joins escaped pairs into one character, so any surrogate left is alone.
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if (match := _NOT_TEXT.search(item)) is not None:
                if match.group() == "\x00":
                    return "U+0000 (NUL, \\u0000)"
                return "a lone surrogate (\\ud800-\\udfff)"
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None
