"""``terminal_input``: ``input()`` for a coroutine, which lets Ctrl-C end the program at once.

Why not ``await asyncio.to_thread(input)``: a thread blocked in ``input()`` cannot be
stopped. On Ctrl-C, ``asyncio.run`` cancels the task but then waits for its executor's
threads, and the interpreter waits for them again at exit, so the program hangs until Enter
is pressed; a second Ctrl-C interrupts those waits with tracebacks. A daemon thread in
``input()`` is no better: it holds ``sys.stdin``'s lock, and the interpreter aborts
("could not acquire lock ... at interpreter shutdown") when it closes the stream.

Rules of this module:

- The line is read from the standard input's file descriptor with ``os.read`` in a daemon
  thread, which holds no Python lock while it waits: the program may end under it.
- At most one such thread reads a stream at a time; whatever it read and no one took
  yet stays in this module's buffer for the next call, so a cancelled call loses no input
  (a line typed after a cancelled prompt answers the next one).
- A ``sys.stdin`` without a file descriptor (an ``io.StringIO``, in tests) is read
  directly: it never waits.
- Don't mix it with ``input()`` or ``sys.stdin`` reads on the same stream: those buffer
  ahead, and this reads beneath their buffer.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
import weakref
from collections import deque
from typing import TextIO

__all__ = ("terminal_input",)


async def terminal_input(prompt: str = "") -> str:
    """Write ``prompt`` to standard output and return the next line of standard input,
    without its line ending, as ``input()`` does; but awaited, so that other tasks go on
    meanwhile, and cancelled (Ctrl-C included) at once.

    Raises:
        EOFError: the input has ended (as ``input()`` does).
    """
    if prompt:
        sys.stdout.write(prompt)
        sys.stdout.flush()
    stdin = sys.stdin
    try:
        fd = stdin.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        line = stdin.readline()
        if not line:
            raise EOFError("end of input") from None
        return line.rstrip("\r\n")
    with _READERS_LOCK:
        reader = _READERS.get(stdin)
        if reader is None:
            reader = _READERS[stdin] = _Lines(fd, getattr(stdin, "encoding", None))
    line_or_end = await reader.line()
    if line_or_end is None:
        raise EOFError("end of input")
    return line_or_end


class _Lines:
    """The lines of one file descriptor, read by at most one daemon thread at a time."""

    def __init__(self, fd: int, encoding: str | None) -> None:
        self._fd = fd
        self._encoding = encoding or "utf-8"
        self._lock = threading.Lock()
        self._lines: deque[str] = deque()
        self._partial = b""
        self._ended = False
        self._reading = False
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    async def line(self) -> str | None:
        """The next line, or None once the input has ended."""
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                if self._lines:
                    return self._lines.popleft()
                if self._ended:
                    return None
                woken: asyncio.Future[None] = loop.create_future()
                self._waiters.append((loop, woken))
                start, self._reading = not self._reading, True
            if start:
                threading.Thread(target=self._read, name="terminal_input", daemon=True).start()
            try:
                await woken
            finally:
                with self._lock, contextlib.suppress(ValueError):
                    self._waiters.remove((loop, woken))

    def _read(self) -> None:
        # The thread only fills the buffer and wakes the waiters, which take the lines
        # themselves: a waiter cancelled in between leaves its line to the next.
        while True:
            with self._lock:
                if not self._waiters:
                    self._reading = False
                    return
            try:
                data = os.read(self._fd, 4096)
            except OSError:
                data = b""
            with self._lock:
                self._take(data)
                waiters, self._waiters = self._waiters, []
            for loop, woken in waiters:
                with contextlib.suppress(RuntimeError):  # its loop is closed: no one waits
                    loop.call_soon_threadsafe(_wake, woken)

    def _take(self, data: bytes) -> None:
        if not data:
            self._ended = True
            data = b"\n" if self._partial else b""
        *complete, self._partial = (self._partial + data).split(b"\n")
        for raw in complete:
            self._lines.append(raw.rstrip(b"\r").decode(self._encoding, "replace"))


def _wake(woken: asyncio.Future[None]) -> None:
    if not woken.done():
        woken.set_result(None)


# One per stream object, not per descriptor: a descriptor number is reused once closed.
_READERS: weakref.WeakKeyDictionary[TextIO, _Lines] = weakref.WeakKeyDictionary()
_READERS_LOCK = threading.Lock()
