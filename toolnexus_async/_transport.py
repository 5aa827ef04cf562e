"""The one place that speaks HTTP: an aiohttp session, owned or borrowed, and error mapping.

Rules of this module:

- No aiohttp exception leaves it, not even as a ``__cause__``: connection failures and
  timeouts become :class:`TransportError`, a non-2xx reply :class:`ProviderError`, a 2xx
  body that is not JSON :class:`ProtocolError`. They are raised with no ``__cause__`` and
  no ``__context__``, because the originals can hold the request headers or the raw body,
  i.e. secrets.
- Secrets stay here: the request headers (API key, user headers) are never put in a
  message; the key, header values and URL credentials are scrubbed from any body excerpt
  or reply header the provider echoes back, and URLs are shown without their credentials.
- A reply is read up to ``max_reply_bytes`` (decompressed; a streamed reply counts all its
  chunks), never further: past it the request is abandoned with :class:`ReplyTooLarge`.
  An error reply is read only as far as its excerpt needs.
- A reply nested too deeply to parse is a :class:`ProtocolError`, never a bare
  ``RecursionError``.
- A session we create is ours to close; a session the caller lends us is not. Our
  connector has no connection cap unless one is configured, so that the pool never limits
  concurrency below what the host runs.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any, TypeVar

import aiohttp

from ._errors import (
    BODY_EXCERPT_LIMIT,
    ProtocolError,
    ProviderError,
    ReplyTooLarge,
    TransportError,
    UsageError,
)
from ._secrets import Scrubber, redact_url

__all__ = ("DEFAULT_MAX_REPLY_BYTES", "Transport")

# Generous: the longest real replies (long completions, big tool-call arguments) are a few
# MiB; the cap is there so that a broken or hostile endpoint cannot exhaust memory.
DEFAULT_MAX_REPLY_BYTES = 32 * 1024 * 1024
# An error body is only ever shown as an excerpt: reading more than this is waste.
_ERROR_BODY_READ = 16 * BODY_EXCERPT_LIMIT
_CHUNK = 64 * 1024

T = TypeVar("T")


# One encoder for every request: json.dumps with any non-default option builds a new
# JSONEncoder per call.
_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def _dumps(body: object) -> bytes:
    return _encode(body).encode()


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


class Transport:
    """POSTs JSON to a provider and returns the parsed JSON reply."""

    def __init__(
        self,
        *,
        session: aiohttp.ClientSession | None = None,
        timeout: float | None = 600.0,
        max_connections: int | None = None,
        secrets: tuple[str, ...] = (),
        max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
    ) -> None:
        timeout_obj = aiohttp.ClientTimeout(total=timeout)
        self._session = session
        self._owned = session is None
        # A session we create carries our timeout; a borrowed one gets it per request.
        self._per_request: dict[str, Any] = {} if session is None else {"timeout": timeout_obj}
        self._timeout = timeout_obj
        self._max_connections = max_connections or 0  # aiohttp: 0 means no cap
        self._scrub = Scrubber(secrets)
        self._max_reply = max_reply_bytes
        self._closed = False

    @property
    def session(self) -> aiohttp.ClientSession | None:
        """The session in use, once one exists."""
        return self._session

    def _open(self) -> aiohttp.ClientSession:
        if self._closed:
            raise UsageError("this client is closed; create a new LlmClient")
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self._max_connections, limit_per_host=0)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
        return self._session

    async def post_json(
        self,
        url: str,
        headers: Mapping[str, str],
        body: Mapping[str, Any],
        decode: Callable[[Any], T],
    ) -> T:
        """``decode`` applied to the parsed JSON of a 2xx reply; a mapped error otherwise.

        ``headers`` are sent as given (the caller includes ``Content-Type``): they are built
        once per client, not once per request. A :class:`ProtocolError` from ``decode`` is
        raised again with the secrets scrubbed from its message: decoders quote what the
        provider sent, which may echo the key back.
        """
        session = self._open()
        data = _dumps(body)
        del body  # not held while the request is in flight (see HttpModel.request)
        # Errors are raised after the except blocks, not inside them: the originals must not
        # even become __context__, since aiohttp errors can hold the request headers (the
        # key) and a JSON decode error holds the whole raw body.
        failure: str | None = None
        try:
            async with session.post(
                url, data=data, headers=headers, **self._per_request
            ) as response:
                status = response.status
                reply_headers = response.headers
                if 200 <= status < 300:
                    raw = await _read_capped(response, self._max_reply)
                else:
                    raw = await _read_head(response, _ERROR_BODY_READ)
        except (aiohttp.ClientError, TimeoutError) as exc:
            failure = self._failure(url, exc)
        if failure is not None:
            raise TransportError(failure)
        if raw is None:
            raise self._too_large(url)
        if not 200 <= status < 300:
            raise self._provider_error(url, status, raw, reply_headers)
        try:
            payload = json.loads(raw)
        except ValueError:
            excerpt = self.scrub(raw[:200].decode("utf-8", "replace"))
            failure = f"reply from {self.shown(url)} is not JSON: {excerpt!r}"
        except RecursionError:
            failure = f"reply from {self.shown(url)} is JSON nested too deeply to read"
        if failure is not None:
            raise ProtocolError(failure)
        try:
            return decode(payload)
        except ProtocolError as exc:
            # Rebuilt outside the except block: the unscrubbed error must not survive even
            # as __context__.
            failure = self.scrub(str(exc))
        raise ProtocolError(failure)

    async def stream(
        self, url: str, headers: Mapping[str, str], body: Mapping[str, Any]
    ) -> AsyncGenerator[bytes, None]:
        """The body of a 2xx reply, chunk by chunk as it arrives; mapped errors otherwise.

        An async generator: closing it early (``aclose()``) closes the response, which
        aborts the request.
        """
        session = self._open()
        data = _dumps(body)
        del body  # not held while the reply streams in
        failure: str | None = None
        try:
            async with session.post(
                url, data=data, headers=headers, **self._per_request
            ) as response:
                if not 200 <= response.status < 300:
                    raw = await _read_head(response, _ERROR_BODY_READ)
                    raise self._provider_error(url, response.status, raw, response.headers)
                left = self._max_reply
                async for chunk in response.content.iter_any():
                    left -= len(chunk)
                    if left < 0:
                        raise self._too_large(url)
                    yield chunk
        except (aiohttp.ClientError, TimeoutError) as exc:
            failure = self._failure(url, exc)
        if failure is not None:
            raise TransportError(failure)

    def _failure(self, url: str, exc: aiohttp.ClientError | TimeoutError) -> str:
        """What went wrong reaching ``url``, without the original (it may hold the key)."""
        # aiohttp's own timeouts are ClientErrors too: they are reported with their name.
        shown = self.shown(url)
        if isinstance(exc, aiohttp.ClientError):
            return f"POST {shown} failed: {type(exc).__name__}: {self.scrub(str(exc))}"
        return f"POST {shown} timed out after {self._timeout.total} s"

    def _provider_error(
        self, url: str, status: int, raw: bytes, headers: Mapping[str, str]
    ) -> ProviderError:
        body = self.scrub(raw.decode("utf-8", "replace"))
        return ProviderError(status, body, self.shown(url), headers=self._scrub.headers(headers))

    def _too_large(self, url: str) -> ReplyTooLarge:
        return ReplyTooLarge(
            f"reply from {self.shown(url)} is larger than max_reply_bytes="
            f"{self._max_reply}; it was not read further",
            limit=self._max_reply,
        )

    def scrub(self, text: str) -> str:
        """``text`` with every secret this transport knows replaced by ``[redacted]``."""
        return self._scrub(text)

    def shown(self, url: str) -> str:
        """``url`` as a message may show it: without credentials, scrubbed."""
        return self._scrub(redact_url(url))

    async def aclose(self) -> None:
        """Close the session if we created it. Idempotent."""
        self._closed = True
        session, self._session = self._session, None
        if session is not None and self._owned and not session.closed:
            await session.close()
            # Let the connector's transports finish closing before the loop may end (the
            # graceful-shutdown step aiohttp's docs ask for).
            await asyncio.sleep(0)
