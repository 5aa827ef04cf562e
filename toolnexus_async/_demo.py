"""The embedded demo: a rule-based in-process model and three tools, one of which needs
approval and one input. ``toolnexus-async demo`` runs them; the tests and docs use them too.

Rule of this module: no I/O. The terminal side lives in ``_cli.py``.

The scenario: book a table and pay its deposit.

1. The model checks availability and, in the same turn, asks the human for the party size
   (a ``kind="input"`` suspension).
2. It then books, which costs a deposit: ``book_table`` suspends with ``kind="approval"``.
3. It reports what happened, declined or not.
"""

from __future__ import annotations

import json
from typing import Any

from ._core.messages import AssistantMessage, Message, ToolCall, ToolReturn
from ._core.types import Request, Tool, ToolContext, ToolResult
from .tools.native import define_tool

__all__ = ("DEMO_PROMPT", "demo_model", "demo_tools")

DEMO_PROMPT = "Book a table for dinner tonight at Luigi's and pay the deposit."
RESTAURANT = "Luigi's"
DEPOSIT_PER_PERSON = 10


@define_tool
async def check_availability(restaurant: str, time: str) -> str:
    """Check whether a restaurant has a free table at a given time.

    Args:
        restaurant: the restaurant's name.
        time: the wanted time, HH:MM.
    """
    return f"{restaurant} has a free table at {time}."


@define_tool
async def ask_party_size(ctx: ToolContext | None = None) -> ToolResult:
    """Ask the user how many people are coming."""
    if ctx is None or ctx.answer is None:
        schema = {
            "type": "object",
            "properties": {"party_size": {"type": "integer", "minimum": 1, "maximum": 20}},
            "required": ["party_size"],
        }
        return ToolResult.pending(
            Request(
                "",
                "input",
                "How many people are coming?",
                data={"schema": schema, "default": {"party_size": 2}},
            )
        )
    size = (ctx.answer.data or {}).get("party_size")
    if not isinstance(size, int) or size < 1:
        return ToolResult.error(f"the party size must be a whole number >= 1, got {size!r}")
    return ToolResult.ok(json.dumps({"party_size": size}))


@define_tool
async def book_table(
    restaurant: str, time: str, party_size: int, ctx: ToolContext | None = None
) -> ToolResult:
    """Book a table; the deposit is charged, so a human must approve it first.

    Args:
        restaurant: the restaurant's name.
        time: the booking time, HH:MM.
        party_size: how many people.
    """
    deposit = DEPOSIT_PER_PERSON * party_size
    if ctx is None or ctx.answer is None:
        return ToolResult.pending(
            Request(
                "",
                "approval",
                f"Pay a {deposit} EUR deposit to {restaurant} for {party_size} at {time}?",
                data={"amount_eur": deposit, "to": restaurant, "party_size": party_size},
            )
        )
    return ToolResult.ok(
        f"Booked {restaurant} for {party_size} at {time}; deposit of {deposit} EUR paid "
        f"(confirmation LU-{party_size:02d}{time.replace(':', '')})."
    )


def demo_tools() -> list[Tool]:
    """The demo's three tools."""
    return [check_availability, ask_party_size, book_table]


def _results(messages: list[Message]) -> dict[str, ToolReturn]:
    return {m.name: m for m in messages if isinstance(m, ToolReturn)}


def _call(name: str, arguments: dict[str, Any], turn: int, index: int = 0) -> ToolCall:
    return ToolCall(f"demo_{turn}_{index}", name, arguments)


def demo_model(messages: list[Message], tools: list[Tool]) -> AssistantMessage:
    """A tiny rule-based model: it reads the tool results so far and decides the next step."""
    done = _results(messages)
    if "check_availability" not in done:
        return AssistantMessage(
            "Let me check Luigi's and ask how many of you are coming.",
            (
                _call("check_availability", {"restaurant": RESTAURANT, "time": "19:30"}, 1, 0),
                _call("ask_party_size", {}, 1, 1),
            ),
        )
    size_result = done.get("ask_party_size")
    if size_result is None or size_result.is_error:
        why = size_result.output if size_result else "no answer"
        return AssistantMessage(f"I could not book: I need the party size ({why}).")
    if "book_table" not in done:
        size = json.loads(size_result.output)["party_size"]
        return AssistantMessage(
            f"{RESTAURANT} is free at 19:30. Booking for {size}; the deposit needs your approval.",
            (
                _call(
                    "book_table", {"restaurant": RESTAURANT, "time": "19:30", "party_size": size}, 2
                ),
            ),
        )
    booking = done["book_table"]
    if booking.is_error:
        return AssistantMessage(f"I did not book the table: {booking.output}")
    return AssistantMessage(f"All set. {booking.output}")
