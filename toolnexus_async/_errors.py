"""Every exception the package raises, in one tree.

::

    ToolnexusError                  base of everything raised here; catch this to catch us
    ├── UsageError(ValueError)      the API was misused: bad configuration, a tool that
    │                               is not a tool, a closed client asked to run
    ├── PayloadError(ValueError)    a wire payload (Request, Answer, transcript JSON) is
    │                               malformed; the message names the offending key
    └── ModelError                  anything between us and the model
        ├── ProviderError           the provider answered with a non-2xx status;
        │                           carries ``status`` and a bounded ``body`` excerpt
        ├── ProtocolError           a 2xx reply that lacks what the wire style requires
        └── TransportError          the request never got an HTTP answer (connection
                                    refused, reset, timed out); mapped from aiohttp

Rules kept by every raise site:

- No third-party exception leaves the package: aiohttp errors are mapped in
  ``_transport.py`` and chained with ``raise ... from``.
- No message, ``repr`` or attribute ever carries an API key or a header value: errors are
  built from the status, the URL and the body the provider sent, and the body excerpt is
  scrubbed of the key before it is stored.
- Tools never raise across the toolkit: their failures become error results for the model,
  so none of these is a tool error.
"""

from __future__ import annotations

from typing import Any

__all__ = (
    "ModelError",
    "PayloadError",
    "ProtocolError",
    "ProviderError",
    "ToolnexusError",
    "TransportError",
    "UsageError",
)

# A provider's error body can be megabytes of HTML from a proxy; the excerpt is for a human.
BODY_EXCERPT_LIMIT = 500


class ToolnexusError(Exception):
    """Base class of every error raised by toolnexus_async."""


class UsageError(ToolnexusError, ValueError):
    """The library was called in a way it does not support.

    Subclasses :class:`ValueError` so that existing ``except ValueError`` handlers still work.
    """


class PayloadError(ToolnexusError, ValueError):
    """A wire payload (``Request``, ``Answer``, a stored transcript) is malformed."""


class ModelError(ToolnexusError):
    """The model could not be asked, or its answer could not be used."""


class ProviderError(ModelError):
    """The provider replied with a status outside 2xx.

    Attributes:
        status: the HTTP status code.
        body: at most 500 characters of the reply body, as sent by the provider.
        url: the endpoint that was called.
    """

    def __init__(self, status: int, body: str, url: str, *, truncated: bool = False) -> None:
        self.status = status
        self.body = body[:BODY_EXCERPT_LIMIT]
        self.url = url
        self.truncated = truncated or len(body) > BODY_EXCERPT_LIMIT
        cut = "..." if self.truncated else ""
        super().__init__(f"provider replied HTTP {status} from {url}: {self.body}{cut}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_provider_error, (self.status, self.body, self.url, self.truncated))


def _rebuild_provider_error(status: int, body: str, url: str, truncated: bool) -> ProviderError:
    return ProviderError(status, body, url, truncated=truncated)


class ProtocolError(ModelError):
    """A 2xx reply that is not what the wire style promises (missing keys, wrong types)."""


class TransportError(ModelError):
    """The request got no HTTP reply: the connection failed, broke or timed out."""
