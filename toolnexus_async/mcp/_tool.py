"""An MCP server's tool as a :class:`~toolnexus_async.Tool`: names, calls, results, questions.

Rules of this module:

- Name: ``sanitize(server) + "_" + sanitize(tool)``, where sanitize replaces every character
  other than ``[A-Za-z0-9_-]`` by ``_``. A name over 64 characters, or one another MCP tool
  of the toolkit already has (``a.b`` and ``a_b`` both sanitise to ``a_b``), becomes its
  first 55 characters, ``_`` and 8 hex digits of the SHA-256 of ``server NUL tool``: the
  same for the same tool on every start, different for different tools.
- Result: ``isError`` is an error result with the joined text; otherwise
  ``structuredContent``, when there is some, as JSON, else the joined text. Content that is
  not text is named in the text, not dropped silently: ``[image image/png]``, a
  ``resource_link`` as ``[resource_link <uri> name="<name>" type=<mime>]`` (what a model
  needs to ask for it), an embedded resource as ``[resource <uri> type=<mime>]`` followed
  by its text, or with its size when it is binary.
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
  more scopes; or, the session having ended, the attempt to connect again refused so)
  suspends with a sign-in link; the retry after the answer exchanges the code, then calls
  again. A server waiting for its first sign-in contributes its ``<server>_sign_in`` tool
  only.
- Every failure (the server gone, a protocol error, a refused ``requestState``) is an error
  result naming the server and the tool, secrets scrubbed; only cancellation propagates.
  An error of one request (an SSE event over ``maxReplyBytes``, a stream cut short) fails
  that call only; after a protocol error the session is pinged, and one that no longer
  answers is over (a server that forgot the session and says so with a 400, not the
  protocol's 404, is found that way). A call made while the session is over connects
  again first
  (:meth:`Connection.session_for_call`). A call whose session ends under it is an error
  result, and is not sent again (the tool may have run), unless the server said the
  request never reached a session ("Session terminated": the HTTP server restarted) or
  the tool is annotated ``readOnlyHint`` or ``idempotentHint``: then it is sent once more
  on a new session.
- Time: each call (reconnecting and the ``requestState`` rounds included) is bounded by
  the server's ``call_timeout``; at the limit the SDK tells the server
  (``notifications/cancelled``) and the model gets an error result naming the server, the
  tool and the limit. Cancelling the run cancels the call the same way.
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
from mcp import ClientSession
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import INVALID_REQUEST, METHOD_NOT_FOUND

from .._core.types import Answer, ToolContext, ToolResult
from ._connection import Clock, Connection
from ._oauth import SignInLink
from ._questions import question_of, request_for, responses_for
from ._sign_in import SignInTool, link_request, sign_in_of

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


def _describe(block: types.ResourceLink | types.EmbeddedResource) -> str:
    if isinstance(block, types.ResourceLink):
        # Names and descriptions hold spaces: quoted as JSON strings, they stay one field.
        parts = [f"[resource_link {block.uri}", f"name={json.dumps(block.name)}"]
        if block.mime_type:
            parts.append(f"type={block.mime_type}")
        if block.description:
            parts.append(f"description={json.dumps(block.description, ensure_ascii=False)}")
        return " ".join(parts) + "]"
    resource = block.resource
    head = f"[resource {resource.uri}" + (
        f" type={resource.mime_type}" if resource.mime_type else ""
    )
    if isinstance(resource, types.TextResourceContents):
        return f"{head}]\n{resource.text}"
    return f"{head} base64 of {len(resource.blob)} characters]"


def _text_of(content: list[types.ContentBlock]) -> str:
    parts: list[str] = []
    for block in content:
        if isinstance(block, types.TextContent):
            parts.append(block.text)
        elif isinstance(block, types.ImageContent | types.AudioContent):
            parts.append(f"[{block.type} {block.mime_type}]")
        else:
            parts.append(_describe(block))
    return "\n".join(parts)


def _terminated(exc: Exception) -> bool:
    """The SDK's word for an HTTP 404 on the session's id: the server has no such session
    (it restarted), so the request never ran, and the session is over."""
    return (
        isinstance(exc, MCPError)
        and exc.code == INVALID_REQUEST
        and exc.message == ("Session terminated")
    )


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
        self._annotations = listed.annotations
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
        run_id = None if ctx is None else ctx.run_id
        if sign_in is not None and ctx is not None and ctx.answer is not None:
            state = sign_in_of(ctx.request, self.server)
            if state is not None:
                problem = await sign_in.complete(state, ctx.answer)
                if problem:
                    return self._fail(problem)
                return await self._call(args, None, None, run_id)
        question = None
        if ctx is not None and ctx.answer is not None:
            question = question_of(ctx.request, self.server, self.remote)
        if question is None or ctx is None or ctx.answer is None:
            return await self._call(args, None, None, run_id)
        responses = responses_for(question, ctx.answer, ctx.request)
        return await self._call(args, responses, question.state, run_id)

    async def refused(self, args: dict[str, Any], ctx: ToolContext) -> None:
        """This call's question ended without an ok answer: tell the server, as a retry
        with ``decline`` (declined) or ``cancel`` (expired, cancelled, late). A sign-in
        refused is forgotten."""
        sign_in, state = self._connection.sign_in, sign_in_of(ctx.request, self.server)
        if sign_in is not None and state is not None:
            await sign_in.forget(state)
            return
        question = question_of(ctx.request, self.server, self.remote)
        answer = ctx.answer
        if question is None or answer is None:
            return
        refusal = Answer(answer.id, False, reason=answer.reason)
        responses = responses_for(question, refusal, ctx.request)
        outcome = await self._call(args, responses, question.state, ctx.run_id)
        if outcome.is_error:
            log.debug("MCP tool %r: the refusal's retry answered %s", self.name, outcome.output)

    async def _call(
        self,
        args: dict[str, Any],
        responses: dict[str, types.ElicitResult] | None,
        state: str | None,
        run_id: str | None,
    ) -> ToolResult:
        with self._connection.clock(run_id) as clock:
            return await self._sessions(args, responses, state)
        return self._timed_out(clock)

    def _timed_out(self, clock: Clock) -> ToolResult:
        """The clock's scope was cancelled at the limit: the call is over."""
        return self._fail(
            f"no answer within {clock.limit:g} s (its callTimeout); the server was told "
            "to cancel the call"
        )

    async def _sessions(
        self,
        args: dict[str, Any],
        responses: dict[str, types.ElicitResult] | None,
        state: str | None,
    ) -> ToolResult:
        connection = self._connection
        sign_in = connection.sign_in
        for attempt in range(2):
            if sign_in is not None:
                sign_in.needed = False
            session = await connection.session_for_call()
            if isinstance(session, str):
                if connection.state == "needs_auth":
                    return await self._sign_in_link()
                return self._fail(f"the server is not available: {session}")
            try:
                return await self._rounds(session, args, responses, state)
            except Exception as exc:
                log.debug("MCP tool %r failed", self.name, exc_info=True)
                if sign_in is not None and sign_in.needed:
                    return await self._sign_in_link()
                problem = f"{type(exc).__name__}: {exc}"
                if _terminated(exc):
                    connection.end(session, "the server no longer knows the session")
                    if not attempt:
                        continue  # it never ran: send it on a new session
                elif isinstance(exc, MCPError) and connection.alive(session):
                    if not await self._answers(session):
                        connection.end(session, f"the session stopped working ({problem})")
                if not connection.alive(session):
                    if not attempt and self._repeatable:
                        continue
                    problem += (
                        "; its session ended during the call, and the next call connects again"
                    )
                return self._fail(problem)
        return self._fail("its session ended twice during the call")

    async def _sign_in_link(self) -> ToolResult:
        """The call was refused for want of a sign-in: suspend it with the link the refusal
        made, or, when the server refused to connect, one made for it now."""
        sign_in = self._connection.sign_in
        assert sign_in is not None
        link: SignInLink | str | None = sign_in.take_link()
        if link is None and self._connection.state == "needs_auth":
            link = await sign_in.begin()
        if isinstance(link, SignInLink):
            return ToolResult.pending(link_request(self.server, link))
        return self._fail(link or sign_in.why())

    async def _answers(self, session: ClientSession) -> bool:
        """Whether the session still works after a request failed: a ``ping`` is
        answered. A server that has forgotten the session (one that answers an unknown
        session id with a 400 rather than the protocol's 404) fails it too."""
        try:
            with anyio.fail_after(self._connection.config.timeout):
                await session.send_ping()
        except MCPError as exc:
            return exc.code == METHOD_NOT_FOUND  # it answered: it just has no ping
        except Exception:
            return False
        return True

    @property
    def _repeatable(self) -> bool:
        hints = self._annotations
        return hints is not None and bool(hints.read_only_hint or hints.idempotent_hint)

    async def _rounds(
        self,
        session: ClientSession,
        args: dict[str, Any],
        responses: dict[str, types.ElicitResult] | None,
        state: str | None,
    ) -> ToolResult:
        given: dict[str, types.InputResponse] | None = dict(responses) if responses else None
        delay = 0.05
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


def tools_of(connection: Connection, taken: set[str]) -> list[McpTool | SignInTool]:
    """The tools ``connection`` contributes, named so that no MCP tool's name in ``taken``
    repeats (``taken`` grows by the names given). A server waiting for its first sign-in
    contributes its sign-in tool only. (A name another source's tool holds is the
    toolkit's to leave out: MCP tools are a live source.)"""
    if connection.state == "needs_auth" and connection.sign_in is not None:
        name = tool_name(connection.config.name, "sign_in", taken)
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
        if name in taken:  # a digest collision: vanishingly rare, never silent
            log.warning(
                "MCP tool %r of %r: name %r is taken", listed.name, connection.config.name, name
            )
            continue
        taken.add(name)
        tools.append(McpTool(name, listed, connection))
    return tools
