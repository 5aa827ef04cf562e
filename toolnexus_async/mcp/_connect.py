"""Connecting the configured MCP servers, and connecting them again: one task per server.

Rules of this module:

- One task group (the :class:`McpServers`' own) holds one task per enabled server; that
  task opens the server's transport and session (:mod:`._transport`), holds them, and
  closes them, so the SDK's cancel scopes are entered and exited in the task that owns
  them. A server's failure ends its own session only (its status says ``failed``): it
  never reaches the caller's task or the other servers. :meth:`McpServers.start` and
  :meth:`McpServers.aclose` must run in one task (``async with`` does).
- Starting makes one attempt per server. A session ends when the SDK says it did (the
  transport's read stream ended: the process exited, the HTTP transport failed) or when
  an HTTP server answers a request with "Session terminated" (a 404 for its session id,
  which the protocol says ends it). The server is then ``failed`` until a tool call (or
  :meth:`McpServers.reconnect`) asks for it: the server's task then makes up to
  ``ATTEMPTS`` attempts, ``BACKOFF`` seconds apart, doubling. A round that fails leaves the
  server alone for ``COOL_DOWN`` seconds: calls in that time fail at once, saying so, and
  :meth:`McpServers.reconnect` does not wait for it.
- After every connect, and when the server says its tool list changed
  (``notifications/tools/list_changed``; a 2026-07-28 server says it on a
  ``subscriptions/listen`` stream, opened when it offers ``tools.listChanged``), the tool
  list is read again and ``on_tools`` is called, so the toolkit offers what the server
  offers now.
- An inline question (an older server's ``elicitation/create``) stops the clock of the
  calls in flight to that server while a person answers it: a call's time limit bounds
  the server's work, not the person's. It is asked for the run of those calls when they
  are all of one run (a parking ``wait_for`` such as an ``Inbox`` then knows the run).
- Sign-in (:mod:`._oauth`): an attempt refused for want of a sign-in (a 401) leaves the
  server ``needs_auth``, and ends its round at once: attempting again before a sign-in
  completes would be refused again, and no cool-down holds back the call that comes with
  one. :meth:`Connection.connect_again` asks for a new round after a sign-in.
- Leaving closes every session; a local server's process group is ended by the SDK
  (stdin closed, then SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from contextlib import AsyncExitStack

import anyio
import anyio.abc
import mcp_types as types
from mcp import ClientSession
from mcp.client.session import ClientRequestContext, IncomingMessage
from mcp.client.subscriptions import Subscription, SubscriptionLost
from mcp.shared.subscriptions import ToolsListChanged

from .._core.types import HaltRun
from .._engine.resolver import Resolver
from ._config import ServerConfig
from ._connection import COOL_DOWN, Connection
from ._oauth import ServerSignIn
from ._questions import elicit_result, inline_request
from ._tokens import MemoryTokens, TokenStore
from ._transport import innermost, list_tools, open_session, problem_of

__all__ = ("ATTEMPTS", "BACKOFF", "McpServers")

log = logging.getLogger("toolnexus_async.mcp")

ATTEMPTS = 3  # connect attempts in one round of reconnecting
BACKOFF = 0.5  # seconds before the second attempt of a round, doubling after
_CLOSED = {"local": "its process ended", "remote": "its HTTP connection closed"}


class McpServers:
    """The configured servers, connected while the toolkit is open."""

    def __init__(
        self,
        configs: tuple[ServerConfig, ...],
        wait_for: Resolver | None,
        *,
        tokens: TokenStore | None = None,
        redirect_uri: str | None = None,
    ) -> None:
        self._connections = [Connection(config) for config in configs]
        self._resolver = wait_for
        self._group: anyio.abc.TaskGroup | None = None
        self._started = False
        self.tokens = MemoryTokens() if tokens is None else tokens
        for connection in self._connections:
            oauth = connection.config.oauth
            if oauth is not None:
                connection.sign_in = ServerSignIn(
                    connection.config, oauth, self.tokens, redirect_uri
                )
        # Told when a server's tool list is (re)read: the toolkit offers what it lists now.
        self.on_tools: Callable[[Connection], None] = lambda connection: None

    @property
    def started(self) -> bool:
        return self._started

    @property
    def connections(self) -> list[Connection]:
        return list(self._connections)

    async def start(self) -> None:
        """Connect every enabled server at once; return when each is connected or failed."""
        if self._started:
            return
        self._started = True
        group = anyio.create_task_group()
        await group.__aenter__()
        self._group = group
        try:
            for connection in self._connections:
                if connection.config.enabled:
                    group.start_soon(self._serve, connection, name=f"mcp:{connection.config.name}")
                else:
                    connection.ready.set()
            for connection in self._connections:
                await connection.ready.wait()
        except BaseException:
            # Cancelled (or worse) while servers connect: they are not waited for.
            group.cancel_scope.cancel()
            await self.aclose()
            raise

    async def reconnect(self) -> None:
        """Connect again every enabled server that is not connected, cool-down or not;
        return when each round is over."""
        waiting = [
            connection.want()
            for connection in self._connections
            if connection.config.enabled and connection.state != "connected"
        ]
        for settled in waiting:
            await settled.wait()

    async def aclose(self) -> None:
        """End every session (and local server process); idempotent."""
        group, self._group = self._group, None
        if group is None:
            return
        for connection in self._connections:
            connection._stopping = True
            connection.wake()
        await group.__aexit__(None, None, None)

    async def _serve(self, connection: Connection) -> None:
        """The server's task: connect, hold the session, and connect again on demand."""
        try:
            connected = await self._attempt(connection)
        finally:
            connection.ready.set()
        failures = 0 if connected else 1
        while not connection._stopping:
            # A server that wants a sign-in would refuse the next attempt too.
            signing_in = connection.state == "needs_auth"
            if not connected and connection._demand and failures < ATTEMPTS and not signing_in:
                with anyio.move_on_after(BACKOFF * 2 ** (failures - 1)):
                    while not connection._stopping:
                        await connection._sleep()
            else:
                if not connected:  # the round is over: tell the calls waiting for it
                    if connection._demand and not signing_in:
                        connection._retry_at = anyio.current_time() + COOL_DOWN
                        connection.error = f"{connection.error} (after {failures} attempts)"
                    connection._settle()
                    failures = 0
                while not (connection._stopping or connection._demand):
                    await connection._sleep()
            if connection.stopping():
                break
            connected = await self._attempt(connection)
            failures = 0 if connected else failures + 1
        connection._settle()

    async def _attempt(self, connection: Connection) -> bool:
        """Connect once, and hold the session until it ends or the toolkit closes.
        Whether it connected."""
        config = connection.config
        connection._generation += 1
        generation = connection._generation
        connection._gone = None
        connected = False
        try:
            async with AsyncExitStack() as stack:
                ended = functools.partial(
                    connection.session_ended, generation, _CLOSED[config.type]
                )
                elicit = None
                if self._resolver is not None:
                    elicit = functools.partial(self._inline_question, connection)
                session = await open_session(
                    connection,
                    stack,
                    ended=ended,
                    elicit=elicit,
                    on_message=functools.partial(self._on_message, connection, generation),
                )
                connection.session, connected = session, True
                if connection.ended is not None:
                    connection.reconnects += 1
                connection.state, connection.error = "connected", None
                connection._retry_at = -math.inf
                log.info(
                    "MCP server %r connected (%s, %s, %d tools)",
                    config.name,
                    connection.protocol,
                    connection.transport,
                    len(connection.listed),
                )
                self._tools_changed(connection)
                connection._settle()
                connection.ready.set()
                await self._hold(connection, session)
        except Exception as exc:
            problem = problem_of(exc)
            sign_in = connection.sign_in
            if not connected and sign_in is not None and sign_in.needed:
                connection.failed(sign_in.why())
                if sign_in.redirect is not None:  # else no sign-in can be made: failed
                    connection.state = "needs_auth"
            elif not connected:
                if isinstance(innermost(exc), TimeoutError):
                    problem = f"timed out after {config.timeout:g} s {connection.doing}"
                connection.failed(problem)
            elif connection._gone in (None, _CLOSED[config.type]):
                connection._gone = problem  # the transport's failure says more
        finally:
            connection.session = None
            if connected and not connection._stopping:
                connection._ended(connection._gone or "the toolkit's side closed it")
            if connection.state == "failed":
                log.warning("MCP server %r failed: %s", config.name, connection.error)
            elif connection.state == "needs_auth":
                log.info("MCP server %r: %s", config.name, connection.error)
        return connected

    async def _hold(self, connection: Connection, session: ClientSession) -> None:
        """Keep the session open until it ends or the toolkit closes; read the tool list
        again whenever the server says it changed."""
        async with anyio.create_task_group() as group:
            if connection.changes is not None:
                group.start_soon(self._changes, connection, connection.changes)
            while not (connection.stopping() or connection._gone is not None):
                if connection._stale:
                    connection._stale = False
                    try:
                        await list_tools(connection, session)
                    except Exception as exc:
                        log.warning(
                            "MCP server %r: reading its changed tool list failed: %s",
                            connection.config.name,
                            connection.scrub(problem_of(exc)),
                        )
                    else:
                        self._tools_changed(connection)
                    continue
                await connection._sleep()
            group.cancel_scope.cancel()

    async def _changes(self, connection: Connection, changes: Subscription) -> None:
        """A 2026-07-28 server's subscription stream: each tool list change marks the list
        stale."""
        try:
            async for event in changes:
                if isinstance(event, ToolsListChanged):
                    connection._stale = True
                    connection.wake()
        except SubscriptionLost as exc:  # the session's end says more, elsewhere
            log.debug("MCP server %r: %s", connection.config.name, exc)

    def _tools_changed(self, connection: Connection) -> None:
        try:
            self.on_tools(connection)
        except Exception:  # the toolkit's bookkeeping must not end a server's session
            log.exception("MCP server %r: registering its tools failed", connection.config.name)
        connection._listed.set()
        connection._listed = anyio.Event()

    async def _on_message(
        self, connection: Connection, generation: int, message: IncomingMessage
    ) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            if generation == connection._generation:
                connection._stale = True
                connection.wake()
        elif isinstance(message, Exception):
            log.debug("MCP server %r: transport error %r", connection.config.name, message)

    async def _inline_question(
        self,
        connection: Connection,
        context: ClientRequestContext,
        params: types.ElicitRequestParams,
    ) -> types.ElicitResult | types.ErrorData:
        """An older server asks during a call: the toolkit's ``wait_for`` answers, inline.

        This question lives in this process only: it cannot be stored or outlive it.
        """
        resolver = self._resolver
        if resolver is None:  # never advertised; a server asking anyway is refused
            return types.ErrorData(code=types.INVALID_REQUEST, message="Elicitation not supported")
        request = inline_request(params)
        try:
            with connection.asking_person():
                answer = await resolver.ask(request, connection.asking_run())
        except HaltRun:
            return types.ElicitResult(action="cancel")
        if isinstance(params, types.ElicitRequestFormParams):
            return elicit_result(answer, schema=params.requested_schema)
        return elicit_result(answer, schema=None)
