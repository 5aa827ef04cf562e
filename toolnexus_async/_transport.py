"""The default transport: one aiohttp session, owned or borrowed, and aiohttp's errors mapped.

Rules of this module:

- No aiohttp exception leaves it, not even as a ``__cause__``: connection failures and
  timeouts become :class:`TransportError`, raised with no ``__cause__`` and no
  ``__context__``, because the originals can hold the request headers (the key). The URL in
  a message is shown without its credentials.
- A reply is read up to the request's ``max_bytes`` (decompressed), never further: past it
  the request is abandoned and ``content`` is ``None``. An error reply is read only as far
  as its excerpt needs.
- The request timeout is aiohttp's own (a prebuilt ``ClientTimeout``, per request), so
  applying it costs nothing per request; a session we create carries it already.
- A session we create is ours to close; a session the caller lends us is not. Our
  connector has no connection cap unless one is configured, so that the pool never limits
  concurrency below what the host runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from contextlib import AbstractAsyncContextManager

import aiohttp

from ._errors import BODY_EXCERPT_LIMIT, TransportError, UsageError
from ._http import HttpRequest, HttpResponse
from ._secrets import redact_url

__all__ = ("AiohttpTransport",)

# An error body is only ever shown as an excerpt: reading more than this is waste.
_ERROR_BODY_READ = 16 * BODY_EXCERPT_LIMIT
_CHUNK = 64 * 1024


async def _read_capped(response: aiohttp.ClientResponse, limit: int) -> bytes | None:
    """The whole (decompressed) body, or None as soon as it is longer than ``limit``."""
    length = response.content_length
    if length is not None and "Content-Encoding" not in response.headers:
        # The usual reply: its length is known up front, and read in one call.
        return None if length > limit else await response.read()
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(_CHUNK):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


async def _read_head(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """At most ``limit`` bytes of the body: enough for an error excerpt."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(_CHUNK):
        chunks.append(chunk)
        size += len(chunk)
        if size >= limit:
            break
    return b"".join(chunks)[:limit]


class AiohttpTransport:
    """Sends model requests through one ``aiohttp.ClientSession``.

    Args:
        session: a session to borrow; the transport leaves it open. Without one, a session
            is created on first use and closed by :meth:`aclose`.
        max_connections: a cap on the pooled connections of the session we create
            (``None``: no cap, so the pool never limits concurrency).
    """

    def __init__(
        self,
        *,
        session: aiohttp.ClientSession | None = None,
        max_connections: int | None = None,
    ) -> None:
        if max_connections is not None and (
            isinstance(max_connections, bool)
            or not isinstance(max_connections, int)
            or max_connections < 1
        ):
            raise UsageError(f"max_connections must be an int >= 1 or None, got {max_connections}")
        self._session = session
        self._owned = session is None
        self._max_connections = max_connections or 0  # aiohttp: 0 means no cap
        # One ClientTimeout per distinct limit, built once: requests reuse it.
        self._timeouts: dict[float | None, aiohttp.ClientTimeout] = {}
        self._closed = False

    def __repr__(self) -> str:
        cap = self._max_connections or None
        return f"AiohttpTransport(max_connections={cap}, borrowed={not self._owned})"

    @property
    def session(self) -> aiohttp.ClientSession | None:
        """The session in use, once one exists."""
        return self._session

    def _open(self) -> aiohttp.ClientSession:
        if self._closed:
            raise UsageError("this transport is closed; create a new LlmClient")
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self._max_connections, limit_per_host=0)
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=None)
            )
        return self._session

    def _request(self, request: HttpRequest) -> AbstractAsyncContextManager[aiohttp.ClientResponse]:
        """``request`` sent on the session (opened on first use), with its deadline."""
        return self._open().request(
            request.method,
            request.url,
            data=request.content,
            headers=request.headers,
            timeout=self._timeout(request.timeout),
        )

    def _timeout(self, seconds: float | None) -> aiohttp.ClientTimeout:
        timeout = self._timeouts.get(seconds)
        if timeout is None:
            timeout = self._timeouts[seconds] = aiohttp.ClientTimeout(total=seconds)
        return timeout

    async def send(self, request: HttpRequest) -> HttpResponse:
        # Errors are raised after the except blocks, not inside them: the originals must not
        # even become __context__, since aiohttp errors can hold the request headers.
        failure: str | None = None
        try:
            async with self._request(request) as response:
                status = response.status
                headers = response.headers
                if 200 <= status < 300:
                    content = await _read_capped(response, request.max_bytes)
                else:
                    content = await _read_head(response, _ERROR_BODY_READ)
        except (aiohttp.ClientError, TimeoutError) as exc:
            failure = _failure(request, exc)
        if failure is not None:
            raise TransportError(failure)
        return HttpResponse(status, headers, content)

    async def stream(self, request: HttpRequest) -> AsyncGenerator[HttpResponse | bytes, None]:
        failure: str | None = None
        try:
            async with self._request(request) as response:
                status = response.status
                if not 200 <= status < 300:
                    head = await _read_head(response, _ERROR_BODY_READ)
                    yield HttpResponse(status, response.headers, head)
                    return
                yield HttpResponse(status, response.headers)
                async for chunk in response.content.iter_any():
                    yield chunk
        except (aiohttp.ClientError, TimeoutError) as exc:
            failure = _failure(request, exc)
        if failure is not None:
            raise TransportError(failure)

    async def aclose(self) -> None:
        """Close the session if we created it. Idempotent."""
        self._closed = True
        session, self._session = self._session, None
        if session is not None and self._owned and not session.closed:
            await session.close()
            # Let the connector's transports finish closing before the loop may end (the
            # graceful-shutdown step aiohttp's docs ask for).
            await asyncio.sleep(0)


def _failure(request: HttpRequest, exc: aiohttp.ClientError | TimeoutError) -> str:
    """What went wrong reaching the endpoint, without the original (it may hold the key)."""
    shown = f"{request.method} {redact_url(request.url)}"
    # aiohttp's own timeouts are ClientErrors too: they are reported with their name.
    if isinstance(exc, aiohttp.ClientError):
        return f"{shown} failed: {type(exc).__name__}: {exc}"
    return f"{shown} timed out after {request.timeout} s"
