"""A small MCP server, written with the official SDK, for docs/mcp.md.

    python examples/mcp_server.py        # speaks MCP over stdio

``add`` adds; ``book`` asks which seat before it books (MCP 2026-07-28: it answers the
call with ``input_required`` and finishes when the call comes back with the answer).
``TRIP_STATE_KEY`` (32 characters or more) lets a server process started later accept the
question's ``requestState`` that an earlier one sealed, so an answer given after a
restart still completes the call.
"""

from __future__ import annotations

import os
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.request_state import RequestStateSecurity
from mcp_types import ElicitRequest, ElicitRequestFormParams, ElicitResult, InputRequiredResult

KEY = os.environ.get("TRIP_STATE_KEY")
security = RequestStateSecurity(keys=[KEY], bind_principal=None) if KEY else None
server: MCPServer[Any] = MCPServer("trips", request_state_security=security)


@server.tool(structured_output=False)
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@server.tool(structured_output=False)
async def book(city: str, ctx: Context[Any, Any]) -> str | InputRequiredResult:
    """Book a trip to a city; asks which seat."""
    answer = (ctx.input_responses or {}).get("seat")
    if not isinstance(answer, ElicitResult):
        question = ElicitRequestFormParams(
            message=f"Window or aisle, for the trip to {city}?",
            requested_schema={
                "type": "object",
                "properties": {"seat": {"type": "string", "enum": ["window", "aisle"]}},
                "required": ["seat"],
            },
        )
        return InputRequiredResult(
            input_requests={"seat": ElicitRequest(params=question)}, request_state=city
        )
    if answer.action != "accept" or not answer.content:
        return f"not booked ({answer.action})"
    return f"booked {city}, {answer.content['seat']} seat"


if __name__ == "__main__":
    server.run("stdio")
