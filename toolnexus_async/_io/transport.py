"""The default transport: one aiohttp session, owned or borrowed, and aiohttp's errors mapped.

Rules of this module:

- No aiohttp exception leaves it, not even as a ``__cause__``: connection failures and
  timeouts (and a bare ``OSError``, wherever it escapes from) become
  :class:`TransportError`, raised with no ``__context__``, because the originals can hold
  the request headers (the key). The URL in a message is shown without its credentials.
  The one ``__cause__`` is for a resource error (``EMFILE`` and the like, see
  ``_RESOURCE_ERRORS``): a fresh ``OSError(errno, strerror)`` of our own, which holds
  nothing else, so that a caller can still test ``__cause__.errno``.
- A ``ValueError`` aiohttp raises for what it is asked to send (a header with a control
  character: the client refuses those when it is made, see ``_http.check_headers``, but a
  request may come from elsewhere) is a :class:`TransportError` like any other failure.
- A reply is read up to the request's ``max_bytes`` (decompressed), never further: past it
  the request is abandoned and ``content`` is ``None``. An error reply is read only as far
  as its excerpt needs.
- The request timeout is aiohttp's own (a prebuilt ``ClientTimeout``, per request), so
  applying it costs nothing per request; a session we create carries it already.
- A session we create is ours to close; a session the caller lends us is not.
- Redirects are not followed: a request carries the key (``x-api-key``, the caller's
  ``headers=``), and on a hop to another origin aiohttp drops only ``Authorization`` and
  cookies. A 3xx reply comes back as it is, like any other non-2xx reply.
- The pool of a session we create is bounded: at most ``max_connections`` requests are
  in flight at once, each holding one connection, and the connector is capped alike; the
  ones beyond wait in a FIFO queue for a slot (our own, so that we know a request
  waited and for how long: ``slots.Slots``), and that wait counts against the request's
  timeout. An idle connection is closed after ``keepalive_timeout`` seconds. A parked
  run holds no connection: it holds no slot. ``max_connections=None`` is no cap at all.
"""

from __future__ import annotations

import asyncio
import errno
import math
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from contextlib import AbstractAsyncContextManager

import aiohttp

from .._core.errors import BODY_EXCERPT_LIMIT, TransportError, UsageError
from .._core.fastinit import builder
from .._core.http import HttpRequest, HttpResponse
from .._core.secrets import redact_url
from .slots import Slots

__all__ = ("AiohttpTransport",)

# An error body is only ever shown as an excerpt: reading more than this is waste.
_ERROR_BODY_READ = 16 * BODY_EXCERPT_LIMIT
_CHUNK = 64 * 1024

# A whole reply's value, built by its fast_init builder (every field by position): no
# type.__call__ and no move to the twin in __init__ (issue 41, park41h in performance.md).
_http_response: Callable[[int, Mapping[str, str], bytes | None], HttpResponse]
_http_response = builder(HttpResponse)

# The defaults of the pool. 1000 connections is the OpenAI and Anthropic Python SDKs' own
# cap (httpx.Limits(max_connections=1000)); 15 s of idle life is aiohttp's default.
DEFAULT_MAX_CONNECTIONS = 1000
DEFAULT_KEEPALIVE_TIMEOUT = 15.0

# Connecting failed because the process or the machine ran out of something: what ran out
# and what to do about it, said in the message (the OS's own words name no cause).
_RESOURCE_ERRORS: dict[int, str] = {
    errno.EMFILE: (
        "too many open files (EMFILE): the process hit its file-descriptor limit"
        " (ulimit -n, soft limit {nofile}); lower max_connections (now {cap}) or raise"
        " ulimit -n"
    ),
    errno.ENFILE: (
        "too many open files in the system (ENFILE): the machine's file table is full;"
        " lower max_connections (now {cap}) or raise fs.file-max"
    ),
    errno.ENOBUFS: (
        "no buffer space available (ENOBUFS): the kernel ran out of socket buffers;"
        " lower max_connections (now {cap}) or the concurrency"
    ),
    errno.ENOMEM: (
        "out of memory (ENOMEM) while opening a connection; lower max_connections"
        " (now {cap}) or the concurrency"
    ),
    errno.EADDRNOTAVAIL: (
        "no local port free (EADDRNOTAVAIL): the ephemeral ports are used up, often by"
        " closed connections in TIME_WAIT; keep connections alive (keepalive_timeout) or"
        " lower max_connections (now {cap})"
    ),
}


async def _read_chunked(response: aiohttp.ClientResponse, limit: int) -> bytes | None:
    """The whole (decompressed) body of unknown length, or None as soon as it is longer
    than ``limit``."""
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
        max_connections: the most requests in flight at once on the session we create,
            each on a connection of its own, so also the most connections it opens (busy
            and idle alike). Requests beyond it queue, in order, for a free connection;
            the wait counts against the request's timeout. ``None``: no cap.
        keepalive_timeout: seconds an idle connection of the session we create stays
            open for the next request (aiohttp checks every ``keepalive_timeout``, so one
            may live up to twice as long); ``None``: until the server closes it.
    """

    def __init__(
        self,
        *,
        session: aiohttp.ClientSession | None = None,
        max_connections: int | None = DEFAULT_MAX_CONNECTIONS,
        keepalive_timeout: float | None = DEFAULT_KEEPALIVE_TIMEOUT,
    ) -> None:
        if max_connections is not None and (
            isinstance(max_connections, bool)
            or not isinstance(max_connections, int)
            or max_connections < 1
        ):
            raise UsageError(
                f"max_connections must be an int >= 1 or None (no cap), got {max_connections!r}"
            )
        if keepalive_timeout is not None and (
            isinstance(keepalive_timeout, bool)
            or not isinstance(keepalive_timeout, int | float)
            or not math.isfinite(keepalive_timeout)
            or keepalive_timeout <= 0
        ):
            raise UsageError(
                "keepalive_timeout must be a number of seconds > 0 or None (until the server"
                f" closes the connection), got {keepalive_timeout!r}"
            )
        self._session = session
        self._owned = session is None
        self._max_connections = max_connections
        self._keepalive_timeout = keepalive_timeout
        # Our own slots, not only the connector's limit: a request that has to wait is seen
        # waiting, so its timeout can say so. None: no cap, or a borrowed session (whose
        # pool is its lender's business).
        self._slots = (
            Slots(max_connections) if max_connections is not None and session is None else None
        )
        # One ClientTimeout per distinct limit, built once: requests reuse it.
        self._timeouts: dict[float | None, aiohttp.ClientTimeout] = {}
        self._closed = False

    def __repr__(self) -> str:
        return (
            f"AiohttpTransport(max_connections={self._max_connections},"
            f" keepalive_timeout={self._keepalive_timeout}, borrowed={not self._owned})"
        )

    @property
    def session(self) -> aiohttp.ClientSession | None:
        """The session in use, once one exists."""
        return self._session

    def _open(self) -> aiohttp.ClientSession:
        if self._closed:
            raise UsageError("this transport is closed; create a new LlmClient")
        if self._session is None:
            # The connector's cap backs our slots (aiohttp: 0 is no cap). One client talks
            # to one host, so the total cap is the per-host cap.
            connector = aiohttp.TCPConnector(
                limit=self._max_connections or 0,
                limit_per_host=0,
                keepalive_timeout=self._keepalive_timeout,
            )
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=None)
            )
        return self._session

    def _request(
        self, request: HttpRequest, timeout: aiohttp.ClientTimeout
    ) -> AbstractAsyncContextManager[aiohttp.ClientResponse]:
        """``request`` sent on the session (opened on first use), with its deadline."""
        session = self._session
        if session is None:  # not opened yet, or closed (aclose drops it): _open() decides
            session = self._open()
        return session.request(
            request.method,
            request.url,
            data=request.content,
            headers=request.headers,
            timeout=timeout,
            allow_redirects=False,
        )

    async def _acquire(self, slots: Slots, request: HttpRequest) -> aiohttp.ClientTimeout | str:
        """For a request that found no free slot: one taken once it is handed over, and the
        time left of the request's timeout; or why there was none.

        The wait is timed, and the deadline passed to aiohttp is what is left of it.
        """
        seconds = request.timeout
        if seconds is None:
            await slots.take()
            return self._timeout(None)
        start = time.monotonic()
        # asyncio's timeout, not an anyio cancel scope: a scope leaves anyio's state for the
        # task behind for as long as the task lives, and a run that queued once and then
        # parks would keep it all that time (~120 bytes each of 100,000 parked runs).
        try:
            async with asyncio.timeout(seconds):
                await slots.take()
        except TimeoutError:
            pass
        else:
            # What is left, at least a little: the slot was free in time.
            return aiohttp.ClientTimeout(total=max(seconds - (time.monotonic() - start), 1e-3))
        return (
            f"{request.method} {redact_url(request.url)} timed out after {seconds} s waiting"
            f" for a free connection: all {self._max_connections} of max_connections were busy"
            f" (requests beyond the cap queue, and the wait counts against the request"
            f" timeout); raise max_connections or run fewer requests at once"
        )

    def _timeout(self, seconds: float | None) -> aiohttp.ClientTimeout:
        timeout = self._timeouts.get(seconds)
        if timeout is None:
            timeout = self._timeouts[seconds] = aiohttp.ClientTimeout(total=seconds)
        return timeout

    async def _slot(self, slots: Slots, request: HttpRequest) -> aiohttp.ClientTimeout:
        """Wait for a slot to come free; the timeout left for the request once one has."""
        acquired = await self._acquire(slots, request)
        if isinstance(acquired, str):
            raise TransportError(acquired)
        return acquired

    async def send(self, request: HttpRequest) -> HttpResponse:
        slots = self._slots
        # The usual limit's ClientTimeout read here, not through _timeout: one call fewer
        # per request.
        timeout = self._timeouts.get(request.timeout)
        if slots is not None and not slots.try_take():
            timeout = await self._slot(slots, request)
        elif timeout is None:
            timeout = self._timeout(request.timeout)
        # (A free slot, the usual case, is taken right here: no coroutine of its own.)
        # What the reply and an error need of the request, read now: the request itself is
        # let go before the wait, so that 500 requests in flight are 500 objects fewer for
        # every collection to walk (issue 41, c500k in performance.md).
        # (One name a line: an unpacked 4-tuple is a tuple made per request on 3.11.)
        method = request.method
        url = request.url
        seconds = request.timeout
        max_bytes = request.max_bytes
        # Errors are raised after the except blocks, not inside them: the originals must not
        # even become __context__, since aiohttp errors can hold the request headers.
        failure: tuple[str, OSError | None] | None = None
        try:
            sending = self._request(request, timeout)
            del request
            async with sending as response:
                status = response.status
                headers = response.headers
                if 200 <= status < 300:
                    length = response.content_length
                    if length is not None and "Content-Encoding" not in headers:
                        # The usual reply: its length known up front, read in one call, here
                        # rather than in a coroutine of its own per request: 1,506,098
                        # instructions per run against 1,510,199 (instructions.py --quick).
                        content = None if length > max_bytes else await response.read()
                    else:
                        content = await _read_chunked(response, max_bytes)
                else:
                    content = await _read_head(response, _ERROR_BODY_READ)
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            failure = self._failure(method, url, seconds, exc)
        finally:
            if slots is not None:
                slots.give()
        if failure is not None:
            raise TransportError(failure[0]) from failure[1]
        return _http_response(status, headers, content)

    async def stream(self, request: HttpRequest) -> AsyncGenerator[HttpResponse | bytes, None]:
        slots = self._slots
        # A free slot (the usual case) is taken right here: no coroutine of its own.
        if slots is None or slots.try_take():
            timeout = self._timeout(request.timeout)
        else:
            timeout = await self._slot(slots, request)
        failure: tuple[str, OSError | None] | None = None
        try:
            async with self._request(request, timeout) as response:
                status = response.status
                if not 200 <= status < 300:
                    head = await _read_head(response, _ERROR_BODY_READ)
                    yield HttpResponse(status, response.headers, head)
                    return
                yield HttpResponse(status, response.headers)
                async for chunk in response.content.iter_any():
                    yield chunk
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            failure = self._failure(request.method, request.url, request.timeout, exc)
        finally:
            if slots is not None:
                slots.give()
        if failure is not None:
            raise TransportError(failure[0]) from failure[1]

    def _failure(
        self,
        method: str,
        url: str,
        seconds: float | None,
        exc: aiohttp.ClientError | OSError | ValueError,
    ) -> tuple[str, OSError | None]:
        """What went wrong reaching the endpoint (a ``method`` request to ``url`` with a
        ``seconds`` timeout), without the original (it may hold the key), and for a resource
        error a bare copy of its OSError to chain."""
        shown = f"{method} {redact_url(url)}"
        # TimeoutError first: it is an OSError too. aiohttp's own timeouts are ClientErrors
        # and are reported with their name.
        if isinstance(exc, TimeoutError) and not isinstance(exc, aiohttp.ClientError):
            return f"{shown} timed out after {seconds} s", None
        code = exc.errno if isinstance(exc, OSError) else None
        cause = _RESOURCE_ERRORS.get(code) if code is not None else None
        if cause is not None and isinstance(exc, OSError) and code is not None:
            text = cause.format(nofile=_nofile(), cap=self._max_connections)
            return f"{shown} failed: cannot open a connection: {text}", OSError(code, exc.strerror)
        return f"{shown} failed: {type(exc).__name__}: {exc}", None

    async def aclose(self) -> None:
        """Close the session if we created it. Idempotent."""
        self._closed = True
        session, self._session = self._session, None
        if session is not None and self._owned and not session.closed:
            await session.close()
            # Let the connector's transports finish closing before the loop may end (the
            # graceful-shutdown step aiohttp's docs ask for).
            await asyncio.sleep(0)


def _nofile() -> str:
    """The process's soft limit on open files, as the message shows it."""
    try:
        import resource  # not on Windows
    except ImportError:
        return "unknown"
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return "unlimited" if soft == resource.RLIM_INFINITY else str(soft)
