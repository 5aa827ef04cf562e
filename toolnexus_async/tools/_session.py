"""One aiohttp session shared by the tools of a toolkit, created on first use.

Rules of this module:

- One session per holder, not one per call: every tool given the same
  :class:`SharedSession` sends its requests through one connection pool, so keep-alive
  connections are reused across calls and tools.
- The session is created lazily inside the running event loop (aiohttp binds a session to
  the loop it was made on) and is only ever used on that loop; asking for it from another
  loop is a :class:`UsageError`, not an obscure aiohttp failure later.
- The pool has no connection cap: concurrent tool calls are limited by the host, never by a
  default pool size. Deadlines belong to the tools (cancel scopes), so the session has none.
- Whoever created the holder closes it with :meth:`aclose`; after that :meth:`get` refuses.
"""

from __future__ import annotations

import asyncio

import aiohttp

from .._errors import UsageError

__all__ = ("SharedSession",)


class SharedSession:
    """A lazily created ``aiohttp.ClientSession`` for tools; close it with :meth:`aclose`."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    @property
    def closed(self) -> bool:
        """True once :meth:`aclose` was called."""
        return self._closed

    def get(self) -> aiohttp.ClientSession:
        """The session, created on the first call; call it from inside the running loop."""
        if self._closed:
            raise UsageError("this shared HTTP session is closed (its toolkit was closed)")
        loop = asyncio.get_running_loop()
        if self._session is None:
            # limit=0: aiohttp's "no cap"; its default of 100 would queue calls silently.
            connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=None)
            )
            self._loop = loop
        elif loop is not self._loop:
            raise UsageError(
                "this shared HTTP session belongs to another event loop; "
                "create the toolkit inside the loop that runs it"
            )
        return self._session

    async def aclose(self) -> None:
        """Close the session if one was created. Idempotent."""
        self._closed = True
        session, self._session = self._session, None
        if session is not None and not session.closed:
            await session.close()
            # Let the connector's transports finish closing before the loop may end (the
            # graceful-shutdown step aiohttp's docs ask for).
            await asyncio.sleep(0)

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("open" if self._session else "unopened")
        return f"SharedSession({state})"
