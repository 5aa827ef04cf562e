"""Connecting the configured MCP servers: one session each, owned by one task each.

Rules of this module:

- One task group (the :class:`McpServers`' own) holds one task per enabled server; that
  task enters the server's transport and session and leaves them, so the SDK's cancel
  scopes are entered and exited in the task that owns them. A server's failure ends its
  own task only (its status says ``failed``): it never reaches the caller's task or the
  other servers. :meth:`McpServers.start` and :meth:`McpServers.aclose` must run in one
  task (``async with`` does).
- Connecting has phases (the handshake, each page of the tool list); each is bounded by
  the server's ``timeout`` on its own. Starting the process or opening the HTTP client
  does not wait for the server, so a server that never answers fails the handshake.
- The protocol version is negotiated by the SDK (``server/discover`` for 2026-07-28, the
  ``initialize`` handshake before). Elicitation is advertised to a 2026-07-28 server
  always (its questions become suspensions) and to an older one only when the toolkit has
  a ``wait_for`` to answer inline questions with; the SDK advertises whenever it has a
  callback, so :class:`_Session` narrows that one capability per version.
- A ``tools`` drop-list naming a tool the server does not list fails the server, none
  of its tools loaded: the name is a typo, and the tool meant would run.
- Leaving closes every session; a local server's process group is ended by the SDK
  (stdin closed, then SIGTERM, then SIGKILL).
- Sign-in (:mod:`._oauth`): a remote server with ``oauth`` gets that module's auth on its
  HTTP client. A handshake refused for want of a sign-in leaves it ``needs_auth``, and its
  task waits: once a sign-in completes, :meth:`Connection.connect_again` has it connect
  once more, and ``on_tools`` tells the toolkit of the tools it lists then.
- Secrets: header and environment values are expanded here, at connect time, and scrubbed
  from every error text this module keeps and every result the tools return. Every header
  value but the descriptive ones (as for HTTP tools) is a secret; of the environment, the
  values that came from a ``${NAME}``.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager, AsyncExitStack
from typing import Any, Literal

import anyio
import anyio.abc
import httpx2
import mcp_types as types
from mcp import ClientSession
from mcp.client._probe import negotiate_auto
from mcp.client.session import ClientRequestContext
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from .. import __version__
from .._resolver import Resolver
from .._secrets import Scrubber
from .._types import HaltRun
from ..tools.http import expand_headers
from ._config import ServerConfig
from ._oauth import ServerSignIn
from ._questions import elicit_result, inline_request
from ._tokens import MemoryTokens, TokenStore

__all__ = ("Connection", "McpServers")

log = logging.getLogger("toolnexus_async.mcp")

State = Literal["connected", "disabled", "needs_auth", "failed"]
_CLIENT = types.Implementation(name="toolnexus-async", version=__version__)
_PAGES = 100  # a server whose tool list never ends is cut here


class _Session(ClientSession):
    """The SDK's session, advertising elicitation to an older server only when asked to."""

    def __init__(self, *args: Any, inline: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._inline = inline

    def _build_capabilities(self, version: str) -> types.ClientCapabilities:
        capabilities = super()._build_capabilities(version)
        if version in HANDSHAKE_PROTOCOL_VERSIONS and not self._inline:
            return capabilities.model_copy(update={"elicitation": None})
        return capabilities


class Connection:
    """One server's live session, as its tools use it."""

    def __init__(self, config: ServerConfig, scrub: Scrubber) -> None:
        self.config = config
        self.scrub = scrub
        self.session: ClientSession | None = None
        self.protocol: str | None = None
        self.listed: list[types.Tool] = []
        self.state: State = "disabled" if not config.enabled else "failed"
        self.error: str | None = None if not config.enabled else "not started"
        self.doing = ""  # the phase of connecting under way, for a timeout's message
        self.stop = anyio.Event()
        self.ready = anyio.Event()
        # -- sign-in (._oauth) --
        self.sign_in: ServerSignIn | None = None
        self.again = anyio.Event()  # a sign-in completed (or the toolkit closes)
        self.attempted = anyio.Event()  # set when the attempt under way is over

    def fail(self, problem: str) -> None:
        self.state, self.error, self.session = "failed", self.scrub(problem), None

    def tool_names(self) -> list[str]:
        return [tool.name for tool in self.listed if self.config.exposes(tool.name)]

    async def connect_again(self) -> None:
        """Have a server that waits for its sign-in connect once more; return when that
        attempt is over (see :attr:`state`)."""
        if self.state != "needs_auth":
            return
        attempted = self.attempted
        self.again.set()
        await attempted.wait()


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
        self._connections = [Connection(config, Scrubber(())) for config in configs]
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
        # Told when a server connects after a sign-in: the toolkit offers its tools then.
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

    async def aclose(self) -> None:
        """End every session (and local server process); idempotent."""
        group, self._group = self._group, None
        if group is None:
            return
        for connection in self._connections:
            connection.stop.set()
            connection.again.set()
        await group.__aexit__(None, None, None)

    async def _serve(self, connection: Connection) -> None:
        """Connect; while the server waits for a sign-in, connect again after each one."""
        await self._attempt(connection, first=True)
        while connection.state == "needs_auth":
            await connection.again.wait()
            connection.again = anyio.Event()
            if connection.stop.is_set():
                return
            await self._attempt(connection, first=False)

    async def _attempt(self, connection: Connection, *, first: bool) -> None:
        config = connection.config
        try:
            async with AsyncExitStack() as stack:
                await self._connect(connection, stack)
                connection.state, connection.error = "connected", None
                connection.ready.set()
                if not first:  # the toolkit took the tools of the first attempt itself
                    try:
                        self.on_tools(connection)
                    except Exception:  # the toolkit's bookkeeping must not end the session
                        log.exception("MCP server %r: registering its tools failed", config.name)
                _attempted(connection)
                log.info(
                    "MCP server %r connected (%s, %d tools)",
                    config.name,
                    connection.protocol,
                    len(connection.listed),
                )
                await connection.stop.wait()
                connection.session = None
        except Exception as exc:
            sign_in = connection.sign_in
            if sign_in is not None and sign_in.needed:
                connection.state, connection.error = "needs_auth", sign_in.why()
                if sign_in.redirect is None:
                    connection.state = "failed"
            elif isinstance(_innermost(exc), TimeoutError):
                connection.fail(f"timed out after {config.timeout:g} s {connection.doing}")
            else:
                connection.fail(_problem(exc))
        finally:
            connection.session = None
            if connection.state == "failed":
                log.warning("MCP server %r failed: %s", config.name, connection.error)
            elif connection.state == "needs_auth":
                log.info("MCP server %r: %s", config.name, connection.error)
            connection.ready.set()
            _attempted(connection)

    async def _connect(self, connection: Connection, stack: AsyncExitStack) -> None:
        config = connection.config
        phase = _Phase(connection, config.timeout)
        if config.type == "local":
            # A literal value (PYTHONPATH, a page size) is configuration, not a secret:
            # scrubbing "3" from every result would garble them. A ${NAME} value is one.
            expanded = expand_headers(
                config.environment, "environment variable", literal_secrets=False
            )
            if isinstance(expanded, str):
                raise _Refused(expanded)
            env, secrets, _ = expanded
            connection.scrub = Scrubber(secrets)
            params = StdioServerParameters(
                command=config.command[0], args=list(config.command[1:]), env=env, cwd=config.cwd
            )
            # The real stderr: a captured sys.stderr (pytest's) may have no file descriptor.
            errlog = sys.__stderr__ or sys.stderr
            # Not under a phase's cancel scope: the transport holds a task group that
            # outlives this statement. Spawning does not block; the handshake is bounded.
            read, write = await stack.enter_async_context(stdio_client(params, errlog))
        else:
            assert config.url is not None
            expanded = expand_headers(config.headers)
            if isinstance(expanded, str):
                raise _Refused(expanded)
            headers, secrets, _ = expanded
            connection.scrub = Scrubber(secrets)
            auth = None if connection.sign_in is None else connection.sign_in.auth()
            if isinstance(auth, str):
                raise _Refused(auth)
            http = httpx2.AsyncClient(
                headers=headers, timeout=httpx2.Timeout(config.timeout, read=300), auth=auth
            )
            await stack.enter_async_context(http)
            # Connecting is lazy (the first request opens it): the handshake is bounded.
            read, write = await stack.enter_async_context(
                streamable_http_client(config.url, http_client=http)
            )
        inline = self._resolver is not None
        session = _Session(
            read,
            write,
            elicitation_callback=self._inline_question if inline else None,
            client_info=_CLIENT,
            inline=inline,
        )
        await stack.enter_async_context(session)
        with phase("while negotiating the protocol"):
            await negotiate_auto(session)
        connection.protocol = session.protocol_version
        listed: list[types.Tool] = []
        cursor: str | None = None
        for _ in range(_PAGES):
            with phase("while listing its tools"):
                page = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor))
            listed += page.tools
            cursor = page.next_cursor
            if cursor is None:
                break
        _check_dropped(config, listed)
        connection.listed = listed
        connection.session = session
        if connection.sign_in is not None:
            connection.sign_in.interactive = True  # a call refused now gets a link

    async def _inline_question(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        """An older server asks during a call: the toolkit's ``wait_for`` answers, inline.

        This question lives in this process only: it cannot be stored or outlive it.
        """
        resolver = self._resolver
        if resolver is None:  # never advertised; a server asking anyway is refused
            return types.ErrorData(code=types.INVALID_REQUEST, message="Elicitation not supported")
        request = inline_request(params)
        try:
            answer = await resolver.ask(request)
        except HaltRun:
            return types.ElicitResult(action="cancel")
        return elicit_result(answer, form=isinstance(params, types.ElicitRequestFormParams))


def _attempted(connection: Connection) -> None:
    """Tell whoever waits for the attempt under way that it is over."""
    attempted, connection.attempted = connection.attempted, anyio.Event()
    attempted.set()


def _check_dropped(config: ServerConfig, listed: list[types.Tool]) -> None:
    """Refuse a drop-list (``tools`` of ``false`` entries only) naming a tool the server
    does not offer: the tool meant, spelt otherwise, would be loaded and run."""
    tools = config.tools
    if not tools or any(tools.values()):
        return  # an allow-list loads only what it names: a stray name loads nothing
    offered = [tool.name for tool in listed]
    unknown = sorted(set(tools) - set(offered))
    if unknown:
        raise _Refused(
            f"its tools list drops {', '.join(map(repr, unknown))}, which it does not "
            f"offer; it offers: {', '.join(map(repr, offered)) or 'nothing'}"
        )


class _Refused(Exception):
    """A server that cannot be connected as configured (a missing variable, say)."""


class _Phase:
    """``with phase("what"):`` bounds one connecting phase by the server's timeout and
    remembers what it was doing, for the error."""

    def __init__(self, connection: Connection, timeout: float) -> None:
        self._connection = connection
        self._timeout = timeout

    def __call__(self, what: str) -> AbstractContextManager[anyio.CancelScope]:
        self._connection.doing = what
        return anyio.fail_after(self._timeout)


def _innermost(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _problem(exc: BaseException) -> str:
    """One line for a failure, the innermost exception of a group."""
    exc = _innermost(exc)
    if isinstance(exc, _Refused):
        return str(exc)
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"
