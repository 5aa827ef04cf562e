"""An incremental server-sent events parser: bytes in, complete events out, no I/O.

Rule of this module: the events produced do not depend on how the byte stream was cut.
A chunk may end anywhere (inside a UTF-8 character, between ``\\r`` and ``\\n``, in the
middle of a field name) and :meth:`SSEParser.feed` returns exactly the events completed so
far, as the WHATWG "event stream interpretation" defines them: lines end with ``\\n``,
``\\r\\n`` or ``\\r``; ``:`` starts a comment; ``data`` lines are joined with ``\\n``; one
space after the colon is dropped; a blank line dispatches; a block without ``data`` is not
an event; unknown fields are ignored. An unterminated final event is dropped at the end of
the stream, and :attr:`SSEParser.pending` says that one was cut off.
"""

from __future__ import annotations

import codecs
import re

import attrs

from ..errors import UsageError

__all__ = ("SSEEvent", "SSEParser")

_EOL = re.compile(r"\r\n|\r|\n")


@attrs.frozen
class SSEEvent:
    """One dispatched event.

    ``id`` is the stream's last event id when the event was dispatched (the spec keeps it
    across events); ``retry`` is the reconnection delay in milliseconds given in this
    event's own block, if any.
    """

    event: str = "message"
    data: str = ""
    id: str | None = None
    retry: int | None = None


class SSEParser:
    """Feed it the response body in whatever chunks the network delivers."""

    __slots__ = (
        "_closed",
        "_data",
        "_decoder",
        "_event",
        "_fields",
        "_last_id",
        "_partial",
        "_retry",
        "_skip_lf",
        "_started",
    )

    def __init__(self) -> None:
        # "replace" as the spec demands: a bad byte costs one character, not the stream.
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial: list[str] = []  # the current line, not yet terminated
        self._skip_lf = False  # the last line ended with "\r"; a "\n" next belongs to it
        self._started = False  # a leading BOM is only skipped at the very start
        self._closed = False
        self._data: list[str] = []
        self._event = ""
        self._retry: int | None = None
        self._last_id: str | None = None
        self._fields = False  # a field line arrived since the last blank line

    @property
    def pending(self) -> bool:
        """True when input since the last blank line would belong to an undispatched event.

        After :meth:`close` this tells a truncated stream from one that ended cleanly.
        """
        return self._fields or any(self._partial) or bool(self._decoder.getstate()[0])

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """The events that ``chunk`` completes, in order (often none)."""
        if self._closed:
            raise UsageError("SSEParser.feed() after close()")
        return self._text(self._decoder.decode(chunk))

    def close(self) -> list[SSEEvent]:
        """End of stream. Always returns no event: an event lacking its blank line is dropped.

        The list keeps the shape of :meth:`feed` so that callers can treat both alike;
        check :attr:`pending` afterwards to learn whether an event was cut off.
        """
        if self._closed:
            return []
        # Flushing turns a dangling partial UTF-8 sequence into U+FFFD on the partial line,
        # which keeps ``pending`` true without dispatching anything.
        tail = self._decoder.decode(b"", final=True)
        self._closed = True
        if tail:
            self._partial.append(tail)
        return []

    def _text(self, text: str) -> list[SSEEvent]:
        if not text:
            return []
        if not self._started:
            self._started = True
            text = text.removeprefix("\ufeff")
        if self._skip_lf:
            self._skip_lf = False
            if text.startswith("\n"):
                text = text[1:]
        if "\n" not in text and "\r" not in text:
            # Long lines arrive in many chunks: collect the pieces, join once.
            self._partial.append(text)
            return []
        self._partial.append(text)
        buffer = "".join(self._partial)
        events: list[SSEEvent] = []
        start = 0
        for match in _EOL.finditer(buffer):
            event = self._line(buffer[start : match.start()])
            if event is not None:
                events.append(event)
            start = match.end()
        rest = buffer[start:]
        # A "\r" that ends the buffer ended its line already; only a "\n" right after it
        # in the next chunk would be part of the same terminator. A "\r" with text after it
        # is a whole terminator: the next chunk's "\n" ends that text's line.
        self._skip_lf = not rest and start > 0 and buffer[start - 1] == "\r"
        self._partial = [rest] if rest else []
        return events

    def _line(self, line: str) -> SSEEvent | None:
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        self._fields = True
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\0" not in value:  # the spec ignores an id holding NUL
                self._last_id = value
        elif name == "retry":
            if value.isascii() and value.isdigit():
                self._retry = int(value)
        return None

    def _dispatch(self) -> SSEEvent | None:
        data, event, retry = self._data, self._event, self._retry
        self._data, self._event, self._retry, self._fields = [], "", None, False
        if not data:
            return None
        return SSEEvent(event or "message", "\n".join(data), self._last_id, retry)
