"""The agent the examples share: a refund tool that needs a person's approval, and a
stand-in model (a plain function) so that every example runs without an API key.

To use a real model, replace ``LlmClient.in_process(model, ...)`` in an example with
``LlmClient("https://api.openai.com/v1", model="gpt-4o-mini", ...)``.
"""

from __future__ import annotations

from toolnexus_async import (
    AssistantMessage,
    Message,
    Request,
    Tool,
    ToolCall,
    ToolContext,
    ToolResult,
    ToolReturn,
    UserMessage,
    define_tool,
)


@define_tool
async def refund(order: str, ctx: ToolContext | None = None) -> ToolResult:
    """Refund an order; a person approves every refund first."""
    if ctx is None or ctx.answer is None:
        # Suspend: the run waits (or halts) until someone answers this request.
        return ToolResult.pending(Request("", "approval", f"Refund order {order}?"))
    return ToolResult.ok(f"refunded order {order}")


def model(messages: list[Message], tools: list[Tool]) -> AssistantMessage | str:
    """Call ``refund`` for the order named last in the prompt, then report the result."""
    returns = [m for m in messages if isinstance(m, ToolReturn)]
    if returns:
        return f"Done: {returns[-1].output}"
    prompt = next(m.text for m in reversed(messages) if isinstance(m, UserMessage))
    order = prompt.split()[-1]
    return AssistantMessage(None, (ToolCall("call_1", "refund", {"order": order}),))
