"""An MCP server's tool as a :class:`~toolnexus_async.Tool`: names, calls, results, questions.

Rules of this module:

- Name: ``sanitize(server) + "_" + sanitize(tool)``, where sanitize replaces every character
  other than ``[A-Za-z0-9_-]`` by ``_``. A name over 64 characters, or one another MCP tool
  of the toolkit already has (``a.b`` and ``a_b`` both sanitise to ``a_b``), becomes its
  first 55 characters, ``_`` and 8 hex digits of the SHA-256 of ``server NUL tool``: the
  same for the same tool on every start, different for different tools.
- Result: ``isError`` is an error result with the joined text; otherwise
  ``structuredContent``, when there is some, as JSON, else the joined text. Content that is
  not text is named in the text (``[image image/png]``), not dropped silently.
- Questions (2026-07-28): an ``input_required`` result is a suspension
  (:mod:`._questions`); the retry after an ok answer sends it as ``inputResponses`` with the
  ``requestState`` the request carried, in whichever process the retry runs. A result
  carrying only ``requestState`` (the server says "call again") is retried at once, with
  the SDK's short back-off, up to ten rounds.
- Refusal: :meth:`McpTool.refused` tells the server a question was declined (``decline``)
  or expired, cancelled or late (``cancel``) by retrying the call with that response; what
  the server answers is not shown to anyone.
- Secrets: the server's secret values (:mod:`._connect` says which) are scrubbed from the
  text the model sees, results included.
- Sign-in (:mod:`._oauth`): a call refused for want of a sign-in (a 401, or a 403 asking for
  more scopes) suspends with the sign-in link the refusal made; the retry after the answer
  exchanges the code, then calls again. A server waiting for its first sign-in contributes
  its ``<server>_sign_in`` tool only.
- Every failure (the server gone, a protocol error, a refused ``requestState``) is an error
  result naming the server and the tool, secrets scrubbed; only cancellation propagates.
  A closed connection (the process ended, say) also marks the server ``failed``: later
  calls say it is not available, without trying.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Mapping
from typing import Any

import anyio
import attrs
import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import CONNECTION_CLOSED

from .._types import Answer, ToolContext, ToolResult
from ._connect import Connection
from ._oauth import SignInTool, link_request, sign_in_of
from ._questions import question_of, request_for, responses_for

__all__ = ("McpTool", "result_of", "tool_name", "tools_of")

log = logging.getLogger("toolnexus_async.mcp")

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_LIMIT = 64
_ROUNDS = 10


def _sanitize(text: str) -> str:
    return _UNSAFE.sub("_", text)


def tool_name(server: str, tool: str, taken: set[str] | frozenset[str] = frozenset()) -> str:
    """The toolkit name of the tool ``tool`` of ``server`` (see the module's rules).

    >>> tool_name("git hub", "create.issue")
    'git_hub_create_issue'
    >>> len(tool_name("s" * 40, "t" * 40))
    64
    """
    name = f"{_sanitize(server)}_{_sanitize(tool)}"
    if len(name) <= _LIMIT and name not in taken:
        return name
    digest = hashlib.sha256(f"{server}\0{tool}".encode()).hexdigest()[:8]
    return f"{name[: _LIMIT - 9]}_{digest}"


def _text_of(content: list[types.ContentBlock]) -> str:
    parts: list[str] = []
    for block in content:
        if isinstance(block, types.TextContent):
            parts.append(block.text)
        elif isinstance(block, types.ImageContent | types.AudioContent):
            parts.append(f"[{block.type} {block.mime_type}]")
        elif isinstance(block, types.EmbeddedResource):
            resource = block.resource
            if isinstance(resource, types.TextResourceContents):
                parts.append(resource.text)
            else:
                parts.append(f"[resource {resource.uri}]")
        else:
            parts.append(f"[{block.type}]")
    return "\n".join(parts)


def _closed(exc: Exception) -> bool:
    if isinstance(exc, MCPError):
        return exc.code == CONNECTION_CLOSED
    return isinstance(exc, anyio.ClosedResourceError | anyio.BrokenResourceError)


def result_of(result: types.CallToolResult) -> ToolResult:
    """Our result for the server's ``CallToolResult``."""
    text = _text_of(result.content)
    if result.is_error:
        return ToolResult.error(text or "the tool reported an error")
    if result.structured_content is not None:
        return ToolResult.ok(json.dumps(result.structured_content, ensure_ascii=False))
    return ToolResult.ok(text)


class McpTool:
    """One tool of a connected MCP server."""

    source = "mcp"

    def __init__(self, name: str, listed: types.Tool, connection: Connection) -> None:
        self.name = name
        self.description = listed.description or listed.title or listed.name
        self.input_schema: Mapping[str, Any] = dict(listed.input_schema)
        self.server = connection.config.name
        self.remote = listed.name
        self._connection = connection

    @property
    def connection(self) -> Connection:
        """The server connection this tool calls through."""
        return self._connection

    def __repr__(self) -> str:
        return f"McpTool(name={self.name!r}, server={self.server!r}, tool={self.remote!r})"

    def _fail(self, problem: str) -> ToolResult:
        return ToolResult.error(
            f"MCP tool {self.remote!r} of server {self.server!r}: {self._connection.scrub(problem)}"
        )

    async def execute(self, args: dict[str, Any], ctx: ToolContext | None = None) -> ToolResult:
        sign_in = self._connection.sign_in
        if sign_in is not None and ctx is not None and ctx.answer is not None:
            state = sign_in_of(ctx.request, self.server)
            if state is not None:
                problem = await sign_in.complete(state, ctx.answer)
                return self._fail(problem) if problem else await self._call(args, None, None)
        question = None
        if ctx is not None and ctx.answer is not None:
            question = question_of(ctx.request, self.server, self.remote)
        if question is None or ctx is None or ctx.answer is None:
            return await self._call(args, None, None)
        return await self._call(args, responses_for(question, ctx.answer), question.state)

    async def refused(self, args: dict[str, Any], ctx: ToolContext) -> None:
        """This call's question ended without an ok answer: tell the server, as a retry
        with ``decline`` (declined) or ``cancel`` (expired, cancelled, late)."""
        sign_in, state = self._connection.sign_in, sign_in_of(ctx.request, self.server)
        if sign_in is not None and state is not None:
            await sign_in.forget(state)
            return
        question = question_of(ctx.request, self.server, self.remote)
        answer = ctx.answer
        if question is None or answer is None:
            return
        refusal = Answer(answer.id, False, reason=answer.reason)
        outcome = await self._call(args, responses_for(question, refusal), question.state)
        if outcome.is_error:
            log.debug("MCP tool %r: the refusal's retry answered %s", self.name, outcome.output)

    async def _call(
        self,
        args: dict[str, Any],
        responses: dict[str, types.ElicitResult] | None,
        state: str | None,
    ) -> ToolResult:
        session = self._connection.session
        if session is None:
            why = self._connection.error or "it is not connected"
            return self._fail(f"the server is not available: {why}")
        given: dict[str, types.InputResponse] | None = dict(responses) if responses else None
        delay = 0.05
        sign_in = self._connection.sign_in
        if sign_in is not None:
            sign_in.needed = False
        try:
            for _ in range(_ROUNDS):
                result = await session.call_tool(
                    self.remote,
                    args,
                    input_responses=given,
                    request_state=state,
                    allow_input_required=True,
                )
                if isinstance(result, types.CallToolResult):
                    return self._scrubbed(result_of(result))
                if result.input_requests:
                    return self._suspend(result)
                # Only requestState: the server wants the same call again, soon.
                given, state = None, result.request_state
                await anyio.sleep(delay)
                delay = min(delay * 2, 0.25)
        except Exception as exc:
            log.debug("MCP tool %r failed", self.name, exc_info=True)
            if sign_in is not None and sign_in.needed:
                link = sign_in.take_link()
                if link is not None:
                    return ToolResult.pending(link_request(self.server, link))
                return self._fail(sign_in.why())
            problem = f"{type(exc).__name__}: {exc}"
            if _closed(exc):  # the server is gone: say so in the status, and to later calls
                self._connection.fail(f"its session ended ({problem})")
            return self._fail(problem)
        return self._fail(f"the server asked to be called again more than {_ROUNDS} times")

    def _scrubbed(self, result: ToolResult) -> ToolResult:
        # A server that echoes a header must not hand the model a key (as HTTP tools).
        scrub = self._connection.scrub
        return result if not scrub else attrs.evolve(result, output=scrub(result.output))

    def _suspend(self, result: types.InputRequiredResult) -> ToolResult:
        request = request_for(self.server, self.remote, result)
        if isinstance(request, str):
            return self._fail(request)
        return ToolResult.pending(request)


def tools_of(
    connection: Connection, taken: set[str], others: Mapping[str, object]
) -> list[McpTool | SignInTool]:
    """The tools ``connection`` contributes, named so that no MCP tool's name in ``taken``
    repeats (``taken`` grows by the names given); one whose name a tool in ``others`` (not
    from MCP) has is left out, with a warning."""
    if connection.state == "needs_auth" and connection.sign_in is not None:
        name = tool_name(connection.config.name, "sign_in", taken)
        if name in others:
            log.warning("MCP server %r: its sign-in tool is left out: %r is taken", name, name)
            return []
        taken.add(name)
        return [SignInTool(name, connection, connection.sign_in)]
    tools: list[McpTool | SignInTool] = []
    offered = {listed.name for listed in connection.listed}
    for unknown in sorted(set(connection.config.tools or ()) - offered):
        server = connection.config.name
        log.warning("MCP server %r has no tool %r (named in its tools list)", server, unknown)
    for listed in connection.listed:
        if not connection.config.exposes(listed.name):
            continue
        name = tool_name(connection.config.name, listed.name, taken)
        if name in others:
            server = connection.config.name
            log.warning("MCP tool %r of %r is left out: %r is taken", listed.name, server, name)
            continue
        if name in taken:  # a digest collision: vanishingly rare, never silent
            log.warning(
                "MCP tool %r of %r: name %r is taken", listed.name, connection.config.name, name
            )
            continue
        taken.add(name)
        tools.append(McpTool(name, listed, connection))
    return tools
