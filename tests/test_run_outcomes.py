"""A run that ends "done" after a person said no can tell: `RunResult.declined` and
`RunResult.approved` list the requests by how they were answered."""

from __future__ import annotations

from toolnexus_async import (
    Answer,
    AssistantMessage,
    LlmClient,
    Request,
    RunResult,
    ToolCall,
    ToolContext,
    Toolkit,
    ToolResult,
    ToolReturn,
    define_tool,
)


@define_tool
async def ship(order: str, ctx: ToolContext | None = None) -> ToolResult:
    """Ship an order once approved."""
    if ctx is None or ctx.answer is None:
        return ToolResult.pending(Request(f"req_{order}", "approval", f"Ship {order}?"))
    return ToolResult.ok(f"shipped {order}")


def two_orders(messages, tools):
    if any(isinstance(m, ToolReturn) for m in messages):
        return "reported"
    calls = (ToolCall("c1", "ship", {"order": "A"}), ToolCall("c2", "ship", {"order": "B"}))
    return AssistantMessage(None, calls)


async def run_with(wait_for) -> RunResult:
    async with (
        Toolkit.create(builtins=False, extra_tools=[ship]) as tk,
        LlmClient.in_process(two_orders, wait_for=wait_for) as client,
    ):
        return await client.run("ship A and B", tk)


async def test_declined_and_approved_requests_are_told_apart():
    async def only_a(request: Request) -> Answer:
        if request.id == "req_A":
            return Answer(request.id, ok=True)
        return Answer(request.id, ok=False, reason="cancelled")

    result = await run_with(only_a)
    assert result.status == "done"
    assert [r.id for r in result.approved] == ["req_A"]
    assert [r.id for r in result.declined] == ["req_B"]  # cancelled counts as not approved
    again = RunResult.from_dict(result.to_dict())  # kept in the stored form too
    assert (again.approved, again.declined) == (result.approved, result.declined)


async def test_all_approved_means_nothing_declined():
    async def yes(request: Request) -> Answer:
        return Answer(request.id, ok=True)

    result = await run_with(yes)
    assert result.declined == ()
    assert len(result.approved) == 2


async def test_a_halted_run_has_neither():
    result = await run_with(None)
    assert result.status == "pending"
    assert (result.approved, result.declined) == ((), ())
