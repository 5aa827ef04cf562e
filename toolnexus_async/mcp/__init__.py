"""MCP tool servers in a toolkit: ``Toolkit.create(mcp=config)`` (see docs/mcp.md).

Needs the optional extra: ``pip install 'toolnexus-async[mcp]'`` (the official ``mcp``
SDK, 2.x). Importing this package works without it; only connecting needs it.

Rules of this package: the SDK is imported here and nowhere else in toolnexus_async, and
only by the modules that talk to servers (``_connect``, ``_connection``, ``_transport``,
``_tool``, ``_questions``);
``_config`` is pure and reads a config without the SDK.
"""

from __future__ import annotations

from .._errors import UsageError
from ._config import McpStatus, ServerConfig, load_config, parse_config

__all__ = ("McpStatus", "ServerConfig", "load_config", "parse_config", "require_sdk")

INSTALL = "pip install 'toolnexus-async[mcp]'"


def require_sdk() -> None:
    """Raise :class:`UsageError` saying how to install the MCP SDK when it is missing."""
    try:
        import mcp  # noqa: F401
        import mcp_types  # noqa: F401
    except ImportError:
        raise UsageError(f"MCP servers need the MCP SDK: {INSTALL}") from None
