"""MCP servers as a toolkit's tool source: :class:`McpTools`.

Rules of this module:

- The config is read, and the SDK required, when the source is built; the servers connect
  when it is entered (``Toolkit.compose(..., McpTools(config))``, or ``Toolkit.create
  (mcp=...)``) and every session and server process ends when it is left. A server that
  fails is reported in :meth:`McpTools.status` and the source opens without it.
- It is a *live* source (it has ``watch``): after a reconnect, a server's
  ``list_changed`` or a sign-in, its tools are read again and the toolkit is told. Its
  servers' tools are named in the config's order, so names are the same on every start;
  a tool whose name another server's tool holds gets a digest suffix (``_tool.tool_name``).
- Importing this module does not import the SDK: ``_connect`` and ``_tool`` are imported
  when a source is built.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .._core.errors import UsageError
from .._core.types import Tool
from .._engine.resolver import Resolver, WaitFor
from ._config import McpStatus, load_config
from ._tokens import TokenStore

if TYPE_CHECKING:
    from ._connect import McpServers
    from ._connection import Connection

__all__ = ("INSTALL", "McpTools", "require_sdk")

INSTALL = "pip install -e '.[mcp]' in the toolnexus-async checkout (or pip install 'mcp>=2.3,<3')"


def require_sdk() -> None:
    """Raise :class:`UsageError` saying how to install the MCP SDK when it is missing."""
    try:
        import mcp  # noqa: F401
        import mcp_types  # noqa: F401
    except ImportError:
        raise UsageError(f"MCP servers need the MCP SDK: {INSTALL}") from None


class McpTools:
    """The MCP servers of an ``mcpServers`` config (docs/mcp.md), as one tool source.

    Args:
        config: the config as a mapping, or the path of its JSON file.
        wait_for: answers the questions a server of protocol 2025-11-25 or older asks
            inline during a call (``async (request) -> Answer``, or an Inbox).
        tokens: where remote servers' sign-ins are kept (default: in memory).
        redirect_uri: where an authorization server sends the person back after a
            sign-in, for the servers whose ``oauth`` config names none.

    Raises:
        UsageError: the config is wrong, or the MCP SDK is not installed.
    """

    def __init__(
        self,
        config: str | os.PathLike[str] | Mapping[str, Any],
        *,
        wait_for: WaitFor | None = None,
        tokens: TokenStore | None = None,
        redirect_uri: str | None = None,
    ) -> None:
        require_sdk()
        from ._connect import McpServers

        configs = load_config(config)
        self._servers: McpServers = McpServers(
            configs, Resolver.of(wait_for), tokens=tokens, redirect_uri=redirect_uri
        )
        self._tools: dict[Connection, list[Tool]] = {}
        self._changed: Callable[[], None] = lambda: None

    def watch(self, changed: Callable[[], None]) -> None:
        """Call ``changed()`` whenever :meth:`tools` would answer differently."""
        self._changed = changed

    @property
    def connections(self) -> tuple[Connection, ...]:
        """The servers' sessions (a sign-in's redirect finds its server here)."""
        return tuple(self._servers.connections)

    async def __aenter__(self) -> McpTools:
        """Connect every enabled server; return when each has connected or failed.
        Leave it from the same task."""
        servers = self._servers
        await servers.start()
        # In the config's order, so that names are the same on every start; later changes
        # (a reconnect, a server's list_changed) come through on_tools as they happen.
        for connection in servers.connections:
            if connection.session is not None or connection.state == "needs_auth":
                self._read(connection)
        servers.on_tools = self._on_tools
        return self

    async def reconnect(self) -> None:
        """Connect again every enabled server that is not connected (one whose session
        ended, or that failed to start); return when each has connected or failed."""
        await self._servers.reconnect()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """End every session and local server process; idempotent."""
        await self._servers.aclose()

    def tools(self) -> Sequence[Tool]:
        """The tools every server offers now, server by server in the config's order."""
        return [tool for connection in self.connections for tool in self._tools.get(connection, ())]

    def _read(self, connection: Connection) -> None:
        from ._tool import tools_of

        taken = {
            tool.name
            for other, tools in self._tools.items()
            if other is not connection
            for tool in tools
        }
        self._tools[connection] = list(tools_of(connection, taken))

    def _on_tools(self, connection: Connection) -> None:
        self._read(connection)
        self._changed()

    def status(self, offered: Callable[[str], object] = lambda name: None) -> dict[str, McpStatus]:
        """Each server's :class:`McpStatus`, by name; its ``tools`` are those of its tools
        that ``offered(name)`` (a toolkit's ``get``) returns. Before the source is entered an
        enabled server reads ``failed`` with the error ``"not started"``."""
        status = {}
        for connection in self._servers.connections:
            mine = tuple(
                tool.name for tool in self._tools.get(connection, ()) if offered(tool.name) is tool
            )
            status[connection.config.name] = McpStatus(
                connection.state,
                connection.error,
                connection.protocol,
                mine,
                transport=connection.transport,
                reconnects=connection.reconnects,
                ended=connection.ended,
                unsupported=connection.unsupported,
            )
        return status

    def __repr__(self) -> str:
        names = ", ".join(connection.config.name for connection in self._servers.connections)
        return f"McpTools({names})"
