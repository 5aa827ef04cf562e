"""Where the sign-in of remote MCP servers is kept: tokens, client registrations, and the
sign-ins under way.

Rules of this module:

- A :class:`TokenStore` is two async methods on string keys and JSON-object values:
  ``get(key)`` (``None`` when absent) and ``set(key, value)`` (``None`` deletes). The keys
  are made by :mod:`._oauth` (one per server, named by its config name and URL, and one
  for its sign-ins under way); a store need not understand them.
- :class:`MemoryTokens` (the default of a toolkit) keeps them in the process: a restart
  signs in again. :class:`RunStoreTokens` keeps them in a run store of
  :mod:`toolnexus_async.durable` (SQLite or PostgreSQL, table ``mcp_tokens``), so that a
  run waiting for a sign-in, and the tokens it brought, survive a restart; serve uses it.
- What is kept is secret (access and refresh tokens, a client secret, PKCE verifiers):
  neither store's ``repr`` shows a value, and nothing here logs one.
"""

from __future__ import annotations

import json
from typing import Any, Protocol, runtime_checkable

from .._core.errors import UsageError

__all__ = ("MemoryTokens", "RunStoreTokens", "TokenStore")


@runtime_checkable
class TokenStore(Protocol):
    """Keeps the sign-in state of MCP servers (see the module's rules)."""

    async def get(self, key: str) -> dict[str, Any] | None: ...

    async def set(self, key: str, value: dict[str, Any] | None) -> None: ...


class MemoryTokens:
    """A :class:`TokenStore` in this process's memory (the toolkit's default)."""

    def __init__(self) -> None:
        self._values: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"MemoryTokens({len(self._values)} entries)"

    async def get(self, key: str) -> dict[str, Any] | None:
        text = self._values.get(key)
        # A copy each time, as a durable store gives: no caller edits what another holds.
        return None if text is None else dict(json.loads(text))

    async def set(self, key: str, value: dict[str, Any] | None) -> None:
        if value is None:
            self._values.pop(key, None)
        else:
            self._values[key] = json.dumps(value)


class RunStoreTokens:
    """A :class:`TokenStore` in a run store's ``mcp_tokens`` table (SQLite or PostgreSQL):
    ``Toolkit.create(mcp=..., mcp_tokens=RunStoreTokens(store))``. The run store is opened
    and closed by its owner."""

    def __init__(self, store: Any) -> None:
        if not callable(getattr(store, "mcp_token", None)) or not callable(
            getattr(store, "set_mcp_token", None)
        ):
            raise UsageError(
                f"RunStoreTokens needs a run store of toolnexus_async.durable, got "
                f"{type(store).__name__}"
            )
        self._store = store

    def __repr__(self) -> str:
        return f"RunStoreTokens({self._store!r})"

    async def get(self, key: str) -> dict[str, Any] | None:
        text = await self._store.mcp_token(key)
        return None if text is None else dict(json.loads(text))

    async def set(self, key: str, value: dict[str, Any] | None) -> None:
        await self._store.set_mcp_token(key, None if value is None else json.dumps(value))
