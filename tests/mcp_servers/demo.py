"""An MCP server for the tests, written with the SDK's high-level server API (``MCPServer``).

    python -m tests.mcp_servers.demo                 # over stdio
    python -m tests.mcp_servers.demo --http PORT     # streamable HTTP on 127.0.0.1:PORT/mcp

Environment:
    DEMO_LEGACY=1      answer only 2025-11-25 (initialize handshake): questions are asked
                       inline over the open session (``ctx.elicit``) instead of as
                       ``input_required`` results.
    DEMO_STATE_KEY     the request-state key (>= 32 bytes): a server process started later
                       with the same key accepts the ``requestState`` an earlier one minted.
    DEMO_OUTCOMES      a file each answered question appends one JSON line to
                       (``{"tool", "action", "content"}``), for the tests to read.
    DEMO_NAME          the server's name (default ``demo``).
    DEMO_PAGE_SIZE     list the tools this many a page (``nextCursor``), not all at once.
    DEMO_SIGNAL        a Unix socket the test listens on: ``hang`` says ``started`` there
                       when it starts and ``cancelled`` when the client cancels it.

Tools: ``echo``, ``add`` (plain text), ``stats`` (structured content), ``fail`` (isError),
``book`` (a form question), ``login`` (a URL question), ``nag`` (asks again on its retry),
``pair`` (two questions at once), ``whoami`` (the headers it was sent, over HTTP),
``crash`` (the process ends mid-call), ``big`` (a text of the size asked), ``hang``
(never answers), ``grow`` (adds the tool ``extra``, drops ``pair``, and says its tool list
changed), ``links`` (a ``resource_link`` and an embedded resource), ``prefs`` (a form
question whose schema has defaults; the answer's content is recorded as sent).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.request_state import RequestStateSecurity
from mcp.server.runner import serve_loop
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp_types import (
    METHOD_NOT_FOUND,
    ContentBlock,
    DiscoverResult,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitRequestURLParams,
    ElicitResult,
    EmbeddedResource,
    InputRequiredResult,
    ListToolsResult,
    PaginatedRequestParams,
    RequestParams,
    ResourceLink,
    TextContent,
    TextResourceContents,
    ToolAnnotations,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel

NAME = os.environ.get("DEMO_NAME", "demo")
KEY = os.environ.get("DEMO_STATE_KEY")
security = RequestStateSecurity(keys=[KEY], bind_principal=None) if KEY else None
server: MCPServer[Any] = MCPServer(NAME, request_state_security=security)

SEAT_SCHEMA = {
    "type": "object",
    "properties": {"seat": {"type": "string", "description": "window or aisle"}},
    "required": ["seat"],
}


class Seat(BaseModel):
    seat: str


def _record(tool: str, action: str, content: object) -> None:
    path = os.environ.get("DEMO_OUTCOMES")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"tool": tool, "action": action, "content": content}) + "\n")


def _modern(ctx: Context[Any, Any]) -> bool:
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS


def _ask_seat(city: str) -> InputRequiredResult:
    question = ElicitRequestFormParams(
        message=f"Which seat for the trip to {city}?", requested_schema=SEAT_SCHEMA
    )
    return InputRequiredResult(
        input_requests={"seat": ElicitRequest(params=question)}, request_state=f"book:{city}"
    )


def _outcome(tool: str, answer: ElicitResult | None, then: str) -> str:
    if answer is None:
        raise ToolError(f"{tool}: the retry carried no answer")
    _record(tool, answer.action, answer.content)
    if answer.action != "accept":
        return f"{tool}: {answer.action}d" if answer.action == "decline" else f"{tool}: cancelled"
    return then.format(**(answer.content or {}))


@server.tool(structured_output=False, annotations=ToolAnnotations(read_only_hint=True))
def echo(text: str) -> str:
    """Say the text back."""
    return text


@server.tool(structured_output=False)
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@server.tool(structured_output=True)
def stats(numbers: list[float]) -> dict[str, float]:
    """Count and sum numbers."""
    return {"count": len(numbers), "sum": sum(numbers)}


@server.tool()
def fail(reason: str) -> str:
    """Always fails."""
    raise ToolError(f"failed on purpose: {reason}")


@server.tool(structured_output=False)
async def book(city: str, ctx: Context[Any, Any]) -> str | InputRequiredResult:
    """Book a trip; asks which seat."""
    if not _modern(ctx):
        inline = await ctx.elicit(f"Which seat for the trip to {city}?", Seat)
        content: dict[str, Any] | None = None
        if inline.action == "accept":
            content = {"seat": inline.data.seat}
        inline_answer = ElicitResult(action=inline.action, content=content)
        return _outcome("book", inline_answer, f"booked {city}, seat {{seat}}")
    if ctx.request_state is None:
        return _ask_seat(city)
    if ctx.request_state != f"book:{city}":
        raise ToolError(f"book: state {ctx.request_state!r} is not this trip's")
    answer = (ctx.input_responses or {}).get("seat")
    return _outcome(
        "book",
        answer if isinstance(answer, ElicitResult) else None,
        f"booked {city}, seat {{seat}}",
    )


@server.tool(structured_output=False)
async def login(ctx: Context[Any, Any]) -> str | InputRequiredResult:
    """Needs the user to sign in at a URL first."""
    url = "https://auth.example.com/authorize?client=demo"
    if not _modern(ctx):
        inline = await ctx.elicit_url("Sign in to the demo service", url, "login-1")
        return _outcome("login", ElicitResult(action=inline.action), "signed in")
    if ctx.request_state is None:
        question = ElicitRequestURLParams(message="Sign in to the demo service", url=url)
        return InputRequiredResult(
            input_requests={"signin": ElicitRequest(params=question)}, request_state="login"
        )
    answer = (ctx.input_responses or {}).get("signin")
    return _outcome("login", answer if isinstance(answer, ElicitResult) else None, "signed in")


@server.tool(structured_output=False)
async def nag(city: str, ctx: Context[Any, Any]) -> str | InputRequiredResult:
    """Asks again even when answered (a server that never settles)."""
    if ctx.input_responses:
        _record("nag", "asked again", None)
    return _ask_seat(city)


@server.tool(structured_output=False)
async def pair(ctx: Context[Any, Any]) -> str | InputRequiredResult:
    """Asks two questions in one result."""
    one = ElicitRequestFormParams(message="first?", requested_schema=SEAT_SCHEMA)
    two = ElicitRequestFormParams(message="second?", requested_schema=SEAT_SCHEMA)
    return InputRequiredResult(
        input_requests={"one": ElicitRequest(params=one), "two": ElicitRequest(params=two)},
        request_state="pair",
    )


@server.tool(structured_output=False)
def crash() -> str:
    """Ends the server process in the middle of the call."""
    os._exit(3)


@server.tool(structured_output=False)
def whoami(ctx: Context[Any, Any]) -> str:
    """The authorization header this request carried (HTTP only)."""
    headers = ctx.headers or {}
    return headers.get("authorization", "anonymous")


@server.tool(structured_output=False)
def big(size: int) -> str:
    """A text of ``size`` bytes."""
    return "x" * size


def _signal(event: str) -> None:
    path = os.environ.get("DEMO_SIGNAL")
    if path:
        with socket.socket(socket.AF_UNIX) as peer:
            peer.connect(path)
            peer.sendall(f"{event}\n".encode())


@server.tool(structured_output=False)
async def hang() -> str:
    """Never answers."""
    _signal("started")
    try:
        await anyio.sleep_forever()
    finally:  # only the client's notifications/cancelled ends it while the session lives
        _signal("cancelled")
    raise AssertionError("unreachable")


def extra() -> str:
    """Added by grow."""
    return "extra here"


@server.tool(structured_output=False)
async def grow(ctx: Context[Any, Any]) -> str:
    """Adds the tool extra, drops pair, and says the tool list changed."""
    server.add_tool(extra, structured_output=False)
    server.remove_tool("pair")
    if _modern(ctx):
        await ctx.notify_tools_changed()  # to the client's subscriptions/listen stream
    else:
        await ctx.session.send_tool_list_changed()
    return "grown"


@server.tool(structured_output=False)
def links() -> list[ContentBlock]:
    """A link to a resource and an embedded one."""
    return [
        TextContent(type="text", text="two resources"),
        ResourceLink(
            type="resource_link",
            uri="file:///srv/reports/q3.csv",
            name="Q3 report",
            mime_type="text/csv",
        ),
        EmbeddedResource(
            type="resource",
            resource=TextResourceContents(
                uri="memo://today", mime_type="text/markdown", text="# Memo"
            ),
        ),
    ]


PREFS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "seat": {"type": "string"},
        "meal": {"type": "string", "default": "vegetarian"},
        "bags": {"type": "integer", "default": 1},
    },
    "required": ["seat"],
}


@server.tool(structured_output=False)
async def prefs(ctx: Context[Any, Any]) -> str | InputRequiredResult:
    """Asks for travel preferences (a form with defaults); records the content as sent."""
    if not _modern(ctx):
        inline = await ctx.session.elicit_form("Your preferences?", PREFS_SCHEMA)
        _record("prefs", inline.action, inline.content)
        return f"prefs: {inline.action}"
    if ctx.request_state is None:
        question = ElicitRequestFormParams(
            message="Your preferences?", requested_schema=PREFS_SCHEMA
        )
        return InputRequiredResult(
            input_requests={"prefs": ElicitRequest(params=question)}, request_state="prefs"
        )
    answer = (ctx.input_responses or {}).get("prefs")
    assert isinstance(answer, ElicitResult)
    _record("prefs", answer.action, answer.content)
    return f"prefs: {answer.action}"


async def _paged_tools(ctx: Any, params: PaginatedRequestParams | None) -> ListToolsResult:
    size = int(os.environ["DEMO_PAGE_SIZE"])
    tools = await server.list_tools()
    start = int(params.cursor) if params is not None and params.cursor else 0
    end = start + size
    return ListToolsResult(
        tools=tools[start:end], next_cursor=str(end) if end < len(tools) else None
    )


async def _legacy_discover(ctx: Any, params: RequestParams | None) -> DiscoverResult:
    # As a server written before 2026-07-28: it knows no server/discover, so the client
    # falls back to the initialize handshake.
    raise MCPError(code=METHOD_NOT_FOUND, message="Method not found")


async def _serve_legacy_stdio() -> None:
    """Serve the handshake era only, as a server written before 2026-07-28 does."""
    low = server._lowlevel_server
    low.add_request_handler("server/discover", RequestParams, _legacy_discover)
    async with stdio_server() as (read, write), low.lifespan(low) as state:
        await serve_loop(
            low, read, write, lifespan_state=state, init_options=low.create_initialization_options()
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, default=None, help="serve streamable HTTP on PORT")
    args = parser.parse_args()
    if os.environ.get("DEMO_PAGE_SIZE"):
        server._lowlevel_server.add_request_handler(
            "tools/list", PaginatedRequestParams, _paged_tools
        )
    if os.environ.get("DEMO_LEGACY") == "1":
        anyio.run(_serve_legacy_stdio)
    elif args.http is None:
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=args.http)


if __name__ == "__main__":
    main()
