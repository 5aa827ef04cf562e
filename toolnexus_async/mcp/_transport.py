"""Opening one session with one MCP server: its transport, the handshake, its tool list.

Rules of this module:

- :func:`open_session` enters everything it opens into the caller's exit stack, so the
  task that owns the connection (:mod:`._connect`) enters and leaves the SDK's cancel
  scopes itself. Each phase of connecting (the handshake, each page of the tool list) is
  bounded by the server's ``timeout`` on its own; starting the process or opening the
  HTTP client does not wait for the server, so one that never answers fails the handshake.
- The session's end is the SDK's word: the read stream the transport hands the session is
  watched (:class:`_Watched`), and when it ends (the process exited, the HTTP transport
  failed) the connection is told. An error one request gets (an SSE event over the size
  limit, a stream that ended early) leaves the session alone.
- A remote server is spoken to over streamable HTTP, with SSE events up to the server's
  ``max_reply`` bytes (the SDK's limit) and JSON replies up to as many (:class:`_Bounded`,
  as the SDK has no limit for those); a larger one fails its request only. One that
  answers streamable HTTP with an HTTP error is tried once with the legacy HTTP+SSE
  transport; if that fails too, the error names both.
- A 2026-07-28 server that offers ``tools.listChanged`` announces changes on a
  ``subscriptions/listen`` stream only: it is opened before the tools are listed, so no
  change falls between the two; a server that refuses it still connects.
- The protocol version is negotiated by the SDK (``server/discover`` for 2026-07-28, the
  ``initialize`` handshake before). Elicitation is advertised to a 2026-07-28 server
  always (its questions become suspensions) and to an older one only when the toolkit has
  a ``wait_for`` to answer inline questions with; the SDK advertises whenever it has a
  callback, so :class:`_Session` narrows that one capability per version.
- Tools whose ``execution.taskSupport`` is ``required`` are not offered (this client has
  no task mode): their names are kept for the status. A ``tools`` drop-list naming a tool
  the server does not list fails the server: the name is a typo, and the tool meant would
  run.
- Sign-in (:mod:`._oauth`): a remote server's HTTP client gets the auth of its
  :class:`~._oauth.ServerSignIn`, made anew for each attempt. A refusal for want of a
  sign-in is not a reason to try the legacy transport: the attempt fails with it.
- Secrets: header and environment values are expanded here, at connect time, and the
  secret ones handed to the connection's scrubber.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractContextManager, AsyncExitStack
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
import httpx2
import mcp_types as types
from mcp import ClientSession
from mcp.client._probe import negotiate_auto
from mcp.client.session import ElicitationFnT, MessageHandlerFnT
from mcp.client.sse import sse_client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import listen
from mcp.shared._stream_protocols import ReadStream, WriteStream
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from .._core.secrets import Scrubber
from .._core.version import __version__
from ..tools._headers import expand_headers

if TYPE_CHECKING:
    from ._connection import Connection

__all__ = ("Refused", "innermost", "list_tools", "open_session", "problem_of")

log = logging.getLogger("toolnexus_async.mcp")

MODERN = MODERN_PROTOCOL_VERSIONS
_CLIENT = types.Implementation(name="toolnexus-async", version=__version__)
_PAGES = 100  # a server whose tool list never ends is cut here
_Streams = tuple[ReadStream[SessionMessage | Exception], WriteStream[SessionMessage]]


class Refused(Exception):
    """A server that cannot be connected as configured (a missing variable, say)."""


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


class _Watched:
    """The transport's read stream, calling ``ended`` once when it ends: the session's
    dispatcher treats that end as the session's, so this is the SDK's own word for it."""

    def __init__(
        self, inner: ReadStream[SessionMessage | Exception], ended: Callable[[], None]
    ) -> None:
        self._inner = inner
        self._ended = ended

    @property
    def last_context(self) -> Any:
        # The dispatcher reads the sender's context of each item from here.
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._ended()
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> _Watched:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self._inner.__anext__()
        except (StopAsyncIteration, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._ended()
            raise

    async def __aenter__(self) -> _Watched:
        await self._inner.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool | None:
        return await self._inner.__aexit__(exc_type, exc_val, exc_tb)


class _ReplyTooLarge(httpx2.StreamError):
    """A JSON reply over the server's ``maxReplyBytes``. A stream error, which the SDK
    turns into an error for that one request."""


class _BoundedBody(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, limit: int) -> None:
        self._inner = inner
        self._limit = limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self._inner:
            seen += len(chunk)
            if seen > self._limit:
                raise _ReplyTooLarge(f"the reply exceeded the {self._limit} byte limit")
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class _Bounded(httpx2.AsyncBaseTransport):
    """The HTTP transport, reading a JSON reply's body up to ``limit`` bytes."""

    def __init__(self, limit: int) -> None:
        self._inner = httpx2.AsyncHTTPTransport()
        self._limit = limit

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        if response.headers.get("content-type", "").startswith("application/json"):
            assert isinstance(response.stream, httpx2.AsyncByteStream)
            response.stream = _BoundedBody(response.stream, self._limit)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


class _Phase:
    """``with phase("what"):`` bounds one connecting phase by the server's timeout and
    remembers what it was doing, for the error."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    def __call__(self, what: str) -> AbstractContextManager[anyio.CancelScope]:
        self._connection.doing = what
        return anyio.fail_after(self._connection.config.timeout)


async def open_session(
    connection: Connection,
    stack: AsyncExitStack,
    *,
    ended: Callable[[], None],
    elicit: ElicitationFnT | None,
    on_message: MessageHandlerFnT,
) -> ClientSession:
    """Connect ``connection``'s server into ``stack``: the session, negotiated, with its
    tools listed into ``connection.listed``. ``ended`` is called when the session ends."""
    config = connection.config
    phase = _Phase(connection)

    async def handshake(streams: _Streams, inner: AsyncExitStack) -> ClientSession:
        read, write = streams
        session = _Session(
            _Watched(read, ended),
            write,
            elicitation_callback=elicit,
            message_handler=on_message,
            client_info=_CLIENT,
            inline=elicit is not None,
        )
        await inner.enter_async_context(session)
        with phase("while negotiating the protocol"):
            await negotiate_auto(session)
        return session

    if config.type == "local":
        # A literal value (PYTHONPATH, a page size) is configuration, not a secret:
        # scrubbing "3" from every result would garble them. A ${NAME} value is one.
        expanded = expand_headers(config.environment, "environment variable", literal_secrets=False)
        if isinstance(expanded, str):
            raise Refused(expanded)
        env, secrets, _ = expanded
        connection.scrub = Scrubber(secrets)
        params = StdioServerParameters(
            command=config.command[0], args=list(config.command[1:]), env=env, cwd=config.cwd
        )
        # The real stderr: a captured sys.stderr (pytest's) may have no file descriptor.
        errlog = sys.__stderr__ or sys.stderr
        # Not under a phase's cancel scope: the transport holds a task group that
        # outlives this statement. Spawning does not block; the handshake is bounded.
        streams = await stack.enter_async_context(stdio_client(params, errlog))
        session = await handshake(streams, stack)
        connection.transport = "stdio"
    else:
        session = await _remote(connection, stack, handshake)
    connection.protocol = session.protocol_version
    connection.changes = None
    capabilities = session.server_capabilities
    tools = None if capabilities is None else capabilities.tools
    if tools is not None and tools.list_changed and session.protocol_version in MODERN:
        try:
            with phase("while subscribing to its tool list's changes"):
                subscription = listen(session, tools_list_changed=True)
                connection.changes = await stack.enter_async_context(subscription)
        except Exception as exc:  # the tools stay as listed; the session goes on
            log.info(
                "MCP server %r: its tool list's changes are not heard (%s)",
                config.name,
                connection.scrub(problem_of(exc)),
            )
    await list_tools(connection, session)
    if connection.sign_in is not None:
        connection.sign_in.connected()
    return session


async def _remote(
    connection: Connection,
    stack: AsyncExitStack,
    handshake: Callable[[_Streams, AsyncExitStack], Any],
) -> ClientSession:
    config = connection.config
    assert config.url is not None
    expanded = expand_headers(config.headers)
    if isinstance(expanded, str):
        raise Refused(expanded)
    headers, secrets, _ = expanded
    connection.scrub = Scrubber(secrets)
    sign_in = connection.sign_in
    auth = None if sign_in is None else sign_in.auth()
    if isinstance(auth, str):
        raise Refused(auth)
    # A reply's SSE stream may be quiet for as long as the call may take.
    read = None if config.call_timeout is None else max(300.0, config.call_timeout + 30)
    try:
        async with AsyncExitStack() as attempt:
            http = httpx2.AsyncClient(
                headers=headers,
                timeout=httpx2.Timeout(config.timeout, read=read),
                transport=_Bounded(config.max_reply),
                auth=auth,
            )
            await attempt.enter_async_context(http)
            # Connecting is lazy (the first request opens it): the handshake is bounded.
            streams = await attempt.enter_async_context(
                streamable_http_client(
                    config.url, http_client=http, max_sse_event_size=config.max_reply
                )
            )
            session: ClientSession = await handshake(streams, attempt)
            stack.push_async_exit(attempt.pop_all())
            connection.transport = "streamable-http"
            return session
    except Exception as exc:
        if not isinstance(innermost(exc), MCPError) or (sign_in is not None and sign_in.needed):
            raise  # nothing answered, not in time, or not without a sign-in: no other
            # transport would help
        streamable = problem_of(exc)
    try:
        async with AsyncExitStack() as attempt:
            # The legacy transport's own SSE limit (the SDK's 1 MiB) applies here.
            streams = await attempt.enter_async_context(
                sse_client(
                    config.url,
                    headers=headers,
                    timeout=config.timeout,
                    sse_read_timeout=read or 86400,
                    auth=auth,
                )
            )
            session = await handshake(streams, attempt)
            stack.push_async_exit(attempt.pop_all())
            connection.transport = "sse"
            return session
    except Exception as exc:
        raise Refused(
            f"it does not speak streamable HTTP ({streamable}), nor the legacy HTTP+SSE "
            f"transport ({problem_of(exc)})"
        ) from None


async def list_tools(connection: Connection, session: ClientSession) -> None:
    """Read every page of the server's tool list into ``connection.listed`` (the tools it
    offers) and ``connection.unsupported`` (those that need task mode)."""
    phase = _Phase(connection)
    listed: list[types.Tool] = []
    cursor: str | None = None
    for _ in range(_PAGES):
        with phase("while listing its tools"):
            page = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor))
        listed += page.tools
        cursor = page.next_cursor
        if cursor is None:
            break
    _check_dropped(connection, listed)
    connection.unsupported = tuple(tool.name for tool in listed if _needs_tasks(tool))
    connection.listed = [tool for tool in listed if not _needs_tasks(tool)]


def _needs_tasks(tool: types.Tool) -> bool:
    return tool.execution is not None and tool.execution.task_support == "required"


def _check_dropped(connection: Connection, listed: list[types.Tool]) -> None:
    """Refuse a drop-list (``tools`` of ``false`` entries only) naming a tool the server
    does not offer: the tool meant, spelt otherwise, would be loaded and run."""
    tools = connection.config.tools
    if not tools or any(tools.values()):
        return  # an allow-list loads only what it names: a stray name loads nothing
    offered = [tool.name for tool in listed]
    unknown = sorted(set(tools) - set(offered))
    if unknown:
        raise Refused(
            f"its tools list drops {', '.join(map(repr, unknown))}, which it does not "
            f"offer; it offers: {', '.join(map(repr, offered)) or 'nothing'}"
        )


def innermost(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def problem_of(exc: BaseException) -> str:
    """One line for a failure, the innermost exception of a group."""
    exc = innermost(exc)
    if isinstance(exc, Refused):
        return str(exc)
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"
