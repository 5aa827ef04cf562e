"""Streaming replies: SSE events in, text deltas out, one :class:`ModelReply` at the end.

Rule of this module: what both wire styles' stream decoders share, and nothing
style-specific. A decoder never returns a reply it has not seen the provider finish.
:meth:`~_Decoder.feed` hands out text, reasoning and the pieces of tool-call arguments as
they arrive and keeps usage and the stop reason to itself; :meth:`~_Decoder.finish`
assembles the reply exactly as the non-streaming codec would decode it, or raises
:class:`~toolnexus_async.ProtocolError` when the stream broke off before its end marker.
A provider error sent inside the stream raises :class:`~toolnexus_async.ProviderError`
with the status that error would have had as an HTTP reply. Events after the end, and
events whose data is not JSON, are refused. No I/O: tests feed events by hand.

The styles' decoders live in :mod:`.openai_stream` and :mod:`.anthropic_stream`; they are
re-exported here (imported at the bottom, after the base they build on is defined).
"""

from __future__ import annotations

from typing import Any, Protocol

import attrs

from ..errors import ProtocolError
from ..hotjson import loads
from ..messages import ModelReply
from ._sse import SSEEvent

__all__ = ("ArgumentsDelta", "Delta", "ReasoningDelta", "StreamDecoder", "TextDelta")

# Enough of an offending payload for a human to recognise it, bounded like error bodies.
_EXCERPT = 200


@attrs.frozen
class TextDelta:
    """A piece of the assistant's text, in order; the pieces join to the reply's text."""

    text: str


@attrs.frozen
class ReasoningDelta:
    """A piece of the model's reasoning, in order; never part of the text."""

    text: str


@attrs.frozen
class ArgumentsDelta:
    """A piece of the arguments of the tool call named ``name``, as the provider sent it;
    the pieces of one call (one ``index``: its place in the reply as the provider numbers
    it) join to its arguments' JSON. For previews only: the reply's calls are parsed from
    the whole text, at the end."""

    name: str
    text: str
    index: int = 0


Delta = TextDelta | ReasoningDelta | ArgumentsDelta


class StreamDecoder(Protocol):
    """What both styles' decoders provide to the client."""

    @property
    def done(self) -> bool: ...

    def feed(self, event: SSEEvent) -> list[Delta]: ...

    def finish(self) -> ModelReply: ...


class _Decoder:
    """What both styles share: the end/failure bookkeeping and JSON parsing."""

    style = ""
    end_marker = ""

    def __init__(self, url: str) -> None:
        self._url = url
        self._count = 0  # events seen, to name the bad one in errors
        self._done = False
        self._failed = False

    @property
    def done(self) -> bool:
        """True once the provider sent its end marker (``[DONE]`` or ``message_stop``)."""
        return self._done

    def feed(self, event: SSEEvent) -> list[Delta]:
        """The text and reasoning deltas ``event`` carries; raises on a provider error or a
        bad event."""
        self._count += 1
        if self._failed:
            raise ProtocolError(f"{self.style} stream: event after the stream failed")
        if self._done:
            raise ProtocolError(
                f"{self.style} stream: event {self._name(event)} after {self.end_marker}"
            )
        try:
            return self._feed(event)
        except Exception:
            # Whatever broke, the partial reply is unusable; refuse to build on it.
            self._failed = True
            raise

    def finish(self) -> ModelReply:
        """The assembled reply; raises :class:`ProtocolError` unless the stream completed."""
        if self._failed:
            raise ProtocolError(f"{self.style} stream failed; there is no reply")
        if not self._done:
            raise ProtocolError(f"{self.style} stream ended before {self.end_marker}")
        return self._reply()

    def _feed(self, event: SSEEvent) -> list[Delta]:
        raise NotImplementedError

    def _reply(self) -> ModelReply:
        raise NotImplementedError

    def _name(self, event: SSEEvent) -> str:
        return f"#{self._count} ({event.event!r})"

    def _json(self, event: SSEEvent) -> dict[str, Any]:
        try:
            value = loads(event.data)
        except ValueError:
            raise ProtocolError(
                f"{self.style} stream: event {self._name(event)} data is not JSON: "
                f"{event.data[:_EXCERPT]!r}"
            ) from None
        except RecursionError:
            raise ProtocolError(
                f"{self.style} stream: event {self._name(event)} data is JSON nested too "
                "deeply to read"
            ) from None
        if not isinstance(value, dict):
            raise ProtocolError(
                f"{self.style} stream: event {self._name(event)} data must be an object, "
                f"got {type(value).__name__}"
            )
        return value

    def _bad(self, event: SSEEvent, what: str) -> ProtocolError:
        return ProtocolError(f"{self.style} stream: event {self._name(event)}: {what}")


def _int_index(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
