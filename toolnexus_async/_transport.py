"""The one place that speaks HTTP: an aiohttp session, owned or borrowed, and error mapping.

Rules of this module:

- No aiohttp exception leaves it, not even as a ``__cause__``: connection failures and
  timeouts become :class:`TransportError`, a non-2xx reply :class:`ProviderError`, a 2xx
  body that is not JSON :class:`ProtocolError`. They are raised with no ``__cause__`` and
  no ``__context__``, because the originals can hold the request headers or the raw body,
  i.e. secrets.
- Secrets stay here: the request headers (API key, user headers) are never put in a
  message, and the key is scrubbed from any body excerpt the provider echoes back.
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

from ._errors import ProtocolError, ProviderError, TransportError, UsageError

__all__ = ("Transport",)

T = TypeVar("T")


# One encoder for every request: json.dumps with any non-default option builds a new
# JSONEncoder per call.
_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def _dumps(body: object) -> bytes:
    return _encode(body).encode()


class Transport:
    """POSTs JSON to a provider and returns the parsed JSON reply."""

    def __init__(
        self,
        *,
        session: aiohttp.ClientSession | None = None,
        timeout: float | None = 600.0,
        max_connections: int | None = None,
        secrets: tuple[str, ...] = (),
    ) -> None:
        timeout_obj = aiohttp.ClientTimeout(total=timeout)
        self._session = session
        self._owned = session is None
        # A session we create carries our timeout; a borrowed one gets it per request.
        self._per_request: dict[str, Any] = {} if session is None else {"timeout": timeout_obj}
        self._timeout = timeout_obj
        self._max_connections = max_connections or 0  # aiohttp: 0 means no cap
        self._secrets = tuple(s for s in secrets if s)
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
                raw = await response.read()
                status = response.status
                reply_headers = response.headers
        except (aiohttp.ClientError, TimeoutError) as exc:
            failure = self._failure(url, exc)
        if failure is not None:
            raise TransportError(failure)
        if not 200 <= status < 300:
            raise self._provider_error(url, status, raw, reply_headers)
        try:
            payload = json.loads(raw)
        except ValueError:
            excerpt = self.scrub(raw[:200].decode("utf-8", "replace"))
            failure = f"reply from {url} is not JSON: {excerpt!r}"
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
                    raw = await response.read()
                    raise self._provider_error(url, response.status, raw, response.headers)
                async for chunk in response.content.iter_any():
                    yield chunk
        except (aiohttp.ClientError, TimeoutError) as exc:
            failure = self._failure(url, exc)
        if failure is not None:
            raise TransportError(failure)

    def _failure(self, url: str, exc: aiohttp.ClientError | TimeoutError) -> str:
        """What went wrong reaching ``url``, without the original (it may hold the key)."""
        # aiohttp's own timeouts are ClientErrors too: they are reported with their name.
        if isinstance(exc, aiohttp.ClientError):
            return f"POST {url} failed: {type(exc).__name__}: {self.scrub(str(exc))}"
        return f"POST {url} timed out after {self._timeout.total} s"

    def _provider_error(
        self, url: str, status: int, raw: bytes, headers: Mapping[str, str]
    ) -> ProviderError:
        body = self.scrub(raw.decode("utf-8", "replace"))
        return ProviderError(status, body, url, headers=dict(headers))

    def scrub(self, text: str) -> str:
        """``text`` with every secret this transport knows replaced by ``[redacted]``."""
        for secret in self._secrets:
            text = text.replace(secret, "[redacted]")
        return text

    async def aclose(self) -> None:
        """Close the session if we created it. Idempotent."""
        self._closed = True
        session, self._session = self._session, None
        if session is not None and self._owned and not session.closed:
            await session.close()
            # Let the connector's transports finish closing before the loop may end (the
            # graceful-shutdown step aiohttp's docs ask for).
            await asyncio.sleep(0)
