"""One MCP server's connection as its tools see it: the live session, the status, the
demand for a new session, and the clocks of the calls in flight.

Rules of this module:

- The server's task (:mod:`._connect`) owns the session; this object is what it shares
  with the calls. A call asks :meth:`Connection.session_for_call` for a session: the live
  one, or, when it ended, a new one the server's task connects for it (unless a round of
  attempts failed less than ``COOL_DOWN`` seconds ago: then the call fails at once).
- A session's end is recorded at once (:meth:`Connection.session_ended`), before the
  server's task has closed it, so the status and the calls never use a session the SDK
  has given up.
- A call's time limit is a :class:`Clock`; while a person answers an inline question of
  the server, every clock of its calls stops. A clock knows the run of its call, so an
  inline question names its run when the calls in flight are all of one run.
- A remote server that signs in (:mod:`._oauth`) has its :class:`~._oauth.ServerSignIn`
  here, for its transport (the HTTP client's auth) and its tools (the sign-in links);
  ``needs_auth`` is the state of one whose last attempt was refused for want of it.
- The attributes with a leading underscore are the server task's (:mod:`._connect`
  reads and writes them); calls and the toolkit use the methods and the public fields.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Literal

import anyio
import mcp_types as types
from mcp import ClientSession
from mcp.client.subscriptions import Subscription

from .._core.secrets import Scrubber
from ._config import ServerConfig

if TYPE_CHECKING:
    from ._oauth import ServerSignIn

__all__ = ("COOL_DOWN", "Clock", "Connection", "State")

State = Literal["connected", "disabled", "needs_auth", "failed"]
COOL_DOWN = 30.0  # seconds a server whose round failed is left alone by calls


class Clock:
    """One call's time limit, as a cancel scope whose deadline can stop while a person
    answers an inline question; ``with`` it, the call is bounded (and counted by its
    connection, whose questions stop it)."""

    def __init__(
        self, limit: float | None, clocks: set[Clock], paused: bool, run_id: str | None = None
    ) -> None:
        self.limit = limit
        self.run_id = run_id  # the run that makes the call, when its context says
        self.scope = anyio.CancelScope()
        self._clocks = clocks
        self._left: float | None = None
        if limit is not None:
            self.scope.deadline = anyio.current_time() + limit
            if paused:
                self.pause()

    def pause(self) -> None:
        if self.limit is not None and self._left is None:
            self._left = max(0.0, self.scope.deadline - anyio.current_time())
            self.scope.deadline = math.inf

    def resume(self) -> None:
        if self._left is not None:
            self.scope.deadline = anyio.current_time() + self._left
            self._left = None

    def __enter__(self) -> Clock:
        self._clocks.add(self)
        self.scope.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool:
        self._clocks.discard(self)
        return self.scope.__exit__(exc_type, exc_val, exc_tb)


class Connection:
    """One server: its live session (if any), its status, and its reconnecting."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.scrub = Scrubber(())
        self.session: ClientSession | None = None
        self.protocol: str | None = None
        self.transport: str | None = None
        self.listed: list[types.Tool] = []
        self.unsupported: tuple[str, ...] = ()
        self.changes: Subscription | None = None  # a 2026-07-28 server's list changes
        self.state: State = "disabled" if not config.enabled else "failed"
        self.error: str | None = None if not config.enabled else "not started"
        self.doing = ""  # the phase of connecting under way, for a timeout's message
        self.reconnects = 0
        self.ended: str | None = None  # why the last session ended
        self.ready = anyio.Event()  # the first attempt is over
        self._stopping = False
        self._wake = anyio.Event()
        self._demand = False  # a call (or reconnect()) waits for a session
        self._settled = anyio.Event()  # set when the current round is over
        self._retry_at = -math.inf
        self._generation = 0  # which session an "ended" signal is about
        self._gone: str | None = None  # the current session ended: why
        self._stale = False  # the server said its tool list changed
        self._clocks: set[Clock] = set()
        self._asking = 0  # inline questions waiting for a person
        self._listed = anyio.Event()  # set when the tool list was read (and offered) again
        self.sign_in: ServerSignIn | None = None

    # -- what the server's task waits on ---------------------------------------------

    def wake(self) -> None:
        self._wake.set()

    def stopping(self) -> bool:
        return self._stopping

    async def _sleep(self) -> None:
        await self._wake.wait()
        self._wake = anyio.Event()

    def session_ended(self, generation: int, why: str) -> None:
        """The session ``generation`` ended (``why``): wake the task to close it."""
        if generation == self._generation and self._gone is None:
            self._gone = why
            self._ended(why)
            self.wake()

    def _ended(self, why: str) -> None:
        self.ended = self.scrub(why)
        self.failed(f"its session ended: {why}; the next call connects again")

    def end(self, session: ClientSession, why: str) -> None:
        """``session`` is over (``why``), though its transport lives on."""
        if session is self.session:
            self.session_ended(self._generation, why)

    def alive(self, session: ClientSession) -> bool:
        """Whether ``session`` is still this server's live session."""
        return session is self.session and self._gone is None

    # -- what calls use ----------------------------------------------------------------

    async def session_for_call(self) -> ClientSession | str:
        """The live session, connecting again first if it ended; or why there is none."""
        if self.session is not None and self._gone is None:
            return self.session
        if self._stopping:
            return "the toolkit is closed"
        wait_left = self._retry_at - anyio.current_time()
        if wait_left > 0:
            return f"{self.error}; it is tried again in {math.ceil(wait_left)} s"
        settled = self.want()
        await settled.wait()
        if self.session is not None and self._gone is None:
            return self.session
        return self.error or "it did not connect"

    async def connect_again(self) -> None:
        """Connect once more a server that is not connected (after its sign-in, say), with
        no regard to a cool-down; return when that round is over (see :attr:`state`)."""
        if (self.session is not None and self._gone is None) or self._stopping:
            return
        await self.want().wait()

    def tool_names(self) -> list[str]:
        """The server's own names of the tools it offers (its config's list applied)."""
        return [tool.name for tool in self.listed if self.config.exposes(tool.name)]

    def want(self) -> anyio.Event:
        """Ask the server's task for a session; the event is set when the round is over."""
        self._demand = True
        self.wake()
        return self._settled

    def _settle(self) -> None:
        self._demand = False
        self._settled.set()
        self._settled = anyio.Event()

    def clock(self, run_id: str | None = None) -> Clock:
        """The time limit of one call (of run ``run_id``), in force inside ``with`` it."""
        return Clock(self.config.call_timeout, self._clocks, self._asking > 0, run_id)

    def asking_run(self) -> str | None:
        """The run an inline question of the server comes from: the protocol does not say
        which call asks, so it is known only when every call in flight to the server is of
        one run (and that run is known); else None."""
        runs = {clock.run_id for clock in self._clocks}
        return runs.pop() if len(runs) == 1 else None

    @contextmanager
    def asking_person(self) -> Iterator[None]:
        """An inline question waits for a person: the calls' clocks stop meanwhile."""
        self._asking += 1
        for clock in self._clocks:
            clock.pause()
        try:
            yield
        finally:
            self._asking -= 1
            if not self._asking:
                for clock in self._clocks:
                    clock.resume()

    def next_listing(self) -> anyio.Event:
        """An event set the next time the tool list is read and offered (a connect, a
        change the server announced)."""
        return self._listed

    def failed(self, problem: str) -> None:
        self.state, self.error = "failed", self.scrub(problem)
