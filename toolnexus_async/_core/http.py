"""The HTTP seam: what a model request is on the wire, and the transport that sends it.

Rule of this module: these are plain values and one protocol. A :class:`Transport` takes an
:class:`HttpRequest` and gives back an :class:`HttpResponse`, or the response's head and
then its body chunk by chunk; it knows nothing of wire styles, keys or retries. Everything
a provider's reply means (a non-2xx status, a body that is not JSON, one that is too large)
is decided above it, once, whatever the transport: the default one speaks aiohttp
(:class:`~toolnexus_async.AiohttpTransport`), and
:class:`~toolnexus_async.testing.MockTransport` answers from a function, with no socket.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Mapping
from typing import Protocol, runtime_checkable

import attrs

from .errors import UsageError
from .fastinit import fast_init

__all__ = ("HttpRequest", "HttpResponse", "Transport", "check_headers")

# What HTTP does not allow in a header's name or value (RFC 9110 5.5): every control
# character but the tab. aiohttp refuses to send such a header.
_FORBIDDEN_IN_HEADER = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def check_headers(headers: Mapping[str, str]) -> None:
    """Refuse headers that cannot be sent, naming them and never showing a value (it is
    often the key: one read from a file with its trailing newline).

    Raises:
        UsageError: a header's name or value holds a control character.
    """
    names = [
        repr(name)
        for name, value in headers.items()
        if _FORBIDDEN_IN_HEADER.search(name)
        or (isinstance(value, str) and _FORBIDDEN_IN_HEADER.search(value))
    ]
    if names:
        which = f"header {names[0]}" if len(names) == 1 else f"headers {', '.join(names)}"
        raise UsageError(
            f"{which} holds a control character (a line break, NUL, ...) in its name or "
            "value, which HTTP does not allow; often a key read from a file with its "
            "trailing newline (the value is not shown)"
        )


@fast_init
@attrs.frozen
class HttpRequest:
    """One request to a provider.

    Attributes:
        method: the HTTP method (``"POST"`` for every model request).
        url: the endpoint, credentials included if the base URL had any.
        headers: sent as given; their values are secrets (the key among them).
        content: the body, JSON-encoded.
        timeout: seconds the whole request may take, reading the reply included (``None``:
            no limit); the transport applies it, and its passing is a
            :class:`~toolnexus_async.TransportError`.
        max_bytes: the most reply body the caller will read; a transport stops reading
            past it (and says so with ``content=None``).
    """

    method: str
    url: str
    headers: Mapping[str, str] = attrs.field(repr=False)
    content: bytes = attrs.field(repr=False)
    timeout: float | None
    max_bytes: int


@fast_init
@attrs.frozen
class HttpResponse:
    """A provider's reply: its status, its headers and its body.

    ``content`` is ``None`` when the body was longer than the request's ``max_bytes`` and
    was not read further. A streamed reply's head has ``content == b""`` when its status is
    2xx (the body follows in chunks), else the start of the error body.
    """

    status: int
    headers: Mapping[str, str] = attrs.field(factory=dict)
    content: bytes | None = b""


@runtime_checkable
class Transport(Protocol):
    """Sends a model request and hands back the reply; the I/O seam of a client.

    A transport raises :class:`~toolnexus_async.TransportError` (with a message that holds
    no secret) when no reply came: a refused or broken connection, a passed ``timeout``.
    Every other exception of its library stays inside it.
    """

    async def send(self, request: HttpRequest) -> HttpResponse:
        """The whole reply; a non-2xx one only as far as an error excerpt needs."""
        ...

    def stream(self, request: HttpRequest) -> AsyncIterator[HttpResponse | bytes]:
        """The reply's head (an :class:`HttpResponse`), then, when its status is 2xx, the
        body's chunks as they arrive. Closing the iterator early aborts the request."""
        ...

    async def aclose(self) -> None:
        """Release what the transport holds (its connections); idempotent."""
        ...
