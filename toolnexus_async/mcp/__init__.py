"""MCP tool servers in a toolkit: ``Toolkit.compose(McpTools(config))``, or
``Toolkit.create(mcp=config)`` (see docs/mcp.md).

Needs the optional extra: ``pip install -e '.[mcp]'`` in a checkout (the official ``mcp``
SDK, 2.x; the package is on no index). Importing this package works without it; only
connecting needs it.

Rules of this package: the SDK is imported here and nowhere else in toolnexus_async, and
only by the modules that talk to servers (``_connect``, ``_connection``, ``_transport``,
``_tool``, ``_questions``, ``_oauth``); ``_config`` is pure and reads a config without the
SDK, and ``_tokens`` keeps sign-ins without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._core.types import Answer
from ._config import McpStatus, OAuthConfig, ServerConfig, load_config, parse_config
from ._source import McpTools, require_sdk
from ._tokens import MemoryTokens, RunStoreTokens, TokenStore

if TYPE_CHECKING:
    from ..tools._standard import Toolkit

__all__ = (
    "McpStatus",
    "McpTools",
    "MemoryTokens",
    "OAuthConfig",
    "RunStoreTokens",
    "ServerConfig",
    "TokenStore",
    "load_config",
    "parse_config",
    "require_sdk",
    "sign_in_answer",
)


async def sign_in_answer(toolkit: Toolkit, redirect_url: str) -> Answer:
    """The answer that ``redirect_url`` (where the authorization server sent the person back
    after signing in to a remote MCP server, with ``code`` and ``state`` in its query) gives
    to the sign-in request it completes: hand it to your ``Inbox`` or ``DurableHost``.

    The code is kept beside the sign-in in the toolkit's token store, not in the answer; a
    refusal (``error=access_denied``) is ``Answer(..., ok=False, reason="declined")``.

    Raises:
        UsageError: the URL carries no ``state``, or no sign-in under way has it (it was
            used already, or was never made by this toolkit's servers).
    """
    require_sdk()
    from ._sign_in import sign_in_answer as answer_of

    return await answer_of(toolkit, redirect_url)
