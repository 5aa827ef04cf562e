"""The aiohttp sessions shared by the tools of a toolkit, one per egress policy, made on use.

Rules of this module:

- One session per holder and egress policy, not one per call: every tool given the same
  :class:`SharedSession` and an equal :class:`EgressPolicy` sends its requests through one
  connection pool, so keep-alive connections are reused across calls and tools.
- Every session is guarded: its connector resolves names through a :class:`GuardResolver`
  for its policy, and there is no unguarded session to ask for. Tools with different
  policies get different sessions, so a pooled connection or a cached DNS answer checked
  under one policy is never used under another. No proxy from the environment is used.
- Sessions are created lazily inside the running event loop (aiohttp binds a session to the
  loop it was made on) and are only ever used on that loop; asking from another loop is a
  :class:`UsageError`, not an obscure aiohttp failure later.
- The pools have no connection cap: concurrent tool calls are limited by the host, never by
  a default pool size. Deadlines belong to the tools (cancel scopes), so sessions have none.
- Whoever created the holder closes it with :meth:`aclose`, which closes every session and
  its resolver; after that :meth:`get` refuses.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import aiohttp
from aiohttp.abc import AbstractResolver

from .._core.errors import UsageError
from ._egress import EgressPolicy, GuardResolver

__all__ = ("SharedSession",)

_NOTHING_ALLOWED = EgressPolicy()


class SharedSession:
    """Lazily created, guarded ``aiohttp.ClientSession`` objects for tools.

    ``resolver`` makes the resolver that looks names up before the guard checks the
    answers; it is called inside the running loop, once per session. The default is
    ``aiohttp.ThreadedResolver`` (the system's ``getaddrinfo``, ``/etc/hosts`` included).
    Close the holder with :meth:`aclose`.
    """

    def __init__(self, *, resolver: Callable[[], AbstractResolver] | None = None) -> None:
        self._make_resolver: Callable[[], AbstractResolver] = resolver or aiohttp.ThreadedResolver
        self._sessions: dict[EgressPolicy, tuple[aiohttp.ClientSession, GuardResolver]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    @property
    def closed(self) -> bool:
        """True once :meth:`aclose` was called."""
        return self._closed

    def get(self, policy: EgressPolicy | None = None) -> aiohttp.ClientSession:
        """The session for ``policy`` (default: nothing non-public allowed), made on first use.

        Call it from inside the running loop.
        """
        if self._closed:
            raise UsageError("this shared HTTP session is closed (its toolkit was closed)")
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif loop is not self._loop:
            raise UsageError(
                "this shared HTTP session belongs to another event loop; "
                "create the toolkit inside the loop that runs it"
            )
        policy = _NOTHING_ALLOWED if policy is None else policy
        made = self._sessions.get(policy)
        if made is None:
            resolver = GuardResolver(policy, self._make_resolver())
            # limit=0: aiohttp's "no cap"; its default of 100 would queue calls silently.
            connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, resolver=resolver)
            session = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=None), trust_env=False
            )
            made = self._sessions[policy] = (session, resolver)
        return made[0]

    async def aclose(self) -> None:
        """Close every session created, and its resolver. Idempotent."""
        self._closed = True
        sessions, self._sessions = list(self._sessions.values()), {}
        # Every one is closed even if closing another fails.
        async with contextlib.AsyncExitStack() as stack:
            for session, resolver in sessions:
                # The connector did not create the resolver, so it does not close it.
                stack.push_async_callback(resolver.close)
                stack.push_async_callback(session.close)
        if sessions:
            # Let the connectors' transports finish closing before the loop may end (the
            # graceful-shutdown step aiohttp's docs ask for).
            await asyncio.sleep(0)

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("open" if self._sessions else "unopened")
        return f"SharedSession({state})"
