"""An MCP server's sign-in seen from a run: its link a suspension, its redirect the answer.

Rules of this module (how the link is made and its code exchanged is :mod:`._oauth`'s):

- A call refused for want of a sign-in suspends (:func:`link_request`): a
  :class:`~toolnexus_async.Request` of kind ``"authorization"`` with the link as ``url``
  (what ``ToolResult.auth_required`` makes), its id chosen when the link is made,
  ``data["mcp_sign_in"] = {"v": 1, "server", "state"}``. The redirect comes back to the host
  (serve's ``GET /oauth/callback``, or :func:`sign_in_answer`): its ``state`` names the
  sign-in, the code is recorded beside it in the store (the first code only) and the answer
  is ``Answer(request_id, True, {"state": state})``, so the code never enters a run's
  journal. The retry exchanges the code (:meth:`~._oauth.ServerSignIn.complete`), in
  whichever process it runs.
- A server that wants a sign-in before it answers anything (its handshake got a 401) is
  ``needs_auth``; its one tool, ``<server>_sign_in`` (:class:`SignInTool`), asks for the
  sign-in and, once answered, connects the server and hands its tools to the toolkit.
- Nothing here reads a token, a verifier or a code: the answer carries the state only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from .._core.errors import UsageError
from .._core.types import Answer, Request, ToolContext, ToolResult

if TYPE_CHECKING:
    from ..tools._standard import Toolkit
    from ._connection import Connection
    from ._oauth import ServerSignIn
    from ._oauth_flow import SignInLink

__all__ = ("SignInTool", "link_request", "sign_in_answer", "sign_in_of")

LAYOUT = 1


def link_request(server: str, link: SignInLink) -> Request:
    """The request a call waiting for ``link`` suspends with."""
    data = {"mcp_sign_in": {"v": LAYOUT, "server": server, "state": link.state}}
    prompt = f"Sign in to the MCP server {server!r} to go on"
    return Request(link.request_id, "authorization", prompt, url=link.url, data=data)


def sign_in_of(request: Request | None, server: str) -> str | None:
    """The state of the sign-in ``request`` asks for on ``server``, if it asks for one."""
    data = None if request is None else request.data
    mine = None if data is None else data.get("mcp_sign_in")
    if not isinstance(mine, dict) or mine.get("v") != LAYOUT or mine.get("server") != server:
        return None
    state = mine.get("state")
    return state if isinstance(state, str) and state else None


class SignInTool:
    """``<server>_sign_in``: the one tool of a server waiting for its first sign-in."""

    source = "mcp"

    def __init__(self, name: str, connection: Connection, sign_in: ServerSignIn) -> None:
        self.name = name
        self.server = connection.config.name
        self.description = (
            f"Sign in to the MCP server {self.server!r}. Its tools become available once the "
            "person has signed in."
        )
        self.input_schema: dict[str, Any] = {"type": "object", "properties": {}}
        self._connection = connection
        self._sign_in = sign_in

    @property
    def connection(self) -> Connection:
        return self._connection

    def __repr__(self) -> str:
        return f"SignInTool(name={self.name!r}, server={self.server!r})"

    def _fail(self, problem: str) -> ToolResult:
        return ToolResult.error(f"signing in to MCP server {self.server!r}: {problem}")

    async def execute(self, args: dict[str, Any], ctx: ToolContext | None = None) -> ToolResult:
        state = None if ctx is None or ctx.answer is None else sign_in_of(ctx.request, self.server)
        if state is not None and ctx is not None and ctx.answer is not None:
            problem = await self._sign_in.complete(state, ctx.answer)
            if problem is not None:
                return self._fail(problem)
            return await self._connected()
        if self._connection.state == "connected":
            return await self._connected()
        link = await self._sign_in.begin()
        if isinstance(link, str):
            return self._fail(link)
        if link is None:
            return await self._connected()
        return ToolResult.pending(link_request(self.server, link))

    async def refused(self, args: dict[str, Any], ctx: ToolContext) -> None:
        state = sign_in_of(ctx.request, self.server)
        if state is not None:
            await self._sign_in.forget(state)

    async def _connected(self) -> ToolResult:
        connection = self._connection
        if connection.state != "connected":
            await connection.connect_again()
        if connection.state != "connected":
            return self._fail(connection.error or "it did not connect")
        names = ", ".join(connection.tool_names()) or "none"
        return ToolResult.ok(f"signed in to MCP server {self.server!r}; its tools: {names}")


async def sign_in_answer(toolkit: Toolkit, redirect_url: str) -> Answer:
    """The answer that the redirect ``redirect_url`` (where the authorization server sent the
    person back, with ``code`` and ``state`` in its query) gives to the sign-in request it
    completes; hand it to your ``Inbox`` or ``DurableHost``. The code is kept beside the
    sign-in in the toolkit's token store, not in the answer.

    Raises:
        UsageError: the URL carries no ``state``, or no sign-in under way has it (it was
            used already, or never made here).
    """
    query = parse_qs(urlsplit(redirect_url).query)

    def one(name: str) -> str | None:
        values = query.get(name)
        return values[0] if values else None

    state = one("state")
    if not state:
        raise UsageError("the sign-in redirect carries no state")
    code, error = one("code"), one("error")
    connections = toolkit.mcp_connections  # the toolkit's own servers: no other has its sign-ins
    for sign_in in (c.sign_in for c in connections if c.sign_in is not None):
        request_id = await sign_in.note_code(state, code, one("iss"))
        if request_id is None:
            continue
        if error is not None or not code:
            reason = "declined" if error == "access_denied" else "cancelled"
            return Answer(request_id, False, reason=reason)
        return Answer(request_id, True, {"state": state})
    raise UsageError("no sign-in under way has this state: it was used already, or is unknown")
