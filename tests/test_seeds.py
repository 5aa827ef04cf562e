"""The six examples of the two seed pages (ToolResult.pending, LlmClient.Options.waitFor),
ported to asyncio Python. Each test scripts the fake provider (over the mock transport)
exactly as its Java example scripts its stub server and asserts what the example asserts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio

from tests.conftest import FakeProvider, assert_no_leaks, openai_reply
from toolnexus_async import Answer, LlmClient, Request, ToolContext, Toolkit, ToolResult, pending_of

EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


class CustomTool:
    """A hand-written tool (no base class), like the Java examples' anonymous classes."""

    source = "custom"

    def __init__(
        self,
        name: str,
        description: str,
        body: Callable[[dict[str, Any], ToolContext | None], ToolResult],
        input_schema: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.description = description
        self.input_schema = input_schema or EMPTY_SCHEMA
        self._body = body

    async def execute(self, args: dict[str, Any], ctx: ToolContext | None = None) -> ToolResult:
        return self._body(args, ctx)


def saw_tool_result(body: dict[str, Any]) -> bool:
    """The Java stubs' test: does any message of the request have role "tool"?"""
    return any(isinstance(m, dict) and m.get("role") == "tool" for m in body["messages"])


def stub_llm(provider: FakeProvider, tool_name: str, final_text: str) -> None:
    """The waitFor page's stub: call ``tool_name`` until a tool result is seen, then answer."""

    def handler(body: dict[str, Any], _seen: object) -> dict[str, Any]:
        if saw_tool_result(body):
            return openai_reply(final_text)
        return openai_reply(None, [("c1", tool_name, "{}")])

    provider.handler = handler


def client_for(provider: FakeProvider, **kwargs: Any) -> LlmClient:
    return provider.client("openai", "test-model", api_key="test-key", **kwargs)


# --- ToolResult.pending ---------------------------------------------------------------------


def test_pending_smallest_useful_call_generates_an_id() -> None:
    """pending example 1: a parked call is an error, outputs the prompt, gets a generated id."""
    res = ToolResult.pending(Request("", "input", "Which environment?"))

    assert res.is_error, "a parked call is not a success"
    assert res.output == "Which environment?"
    req = ToolResult.pending_of(res)
    assert req is not None, "expected a Request back"
    assert req.kind == "input"
    assert req.id, "an id must be generated"
    assert pending_of(res) == req


async def test_pending_realistic_case_suspends_then_succeeds() -> None:
    """pending example 2: a tool suspends on its first call and succeeds once approved."""
    approved = False

    def pay(args: dict[str, Any], _ctx: ToolContext | None) -> ToolResult:
        if not approved:
            return ToolResult.pending(
                Request("", "approval", f"Approve payment of {args['amount']}?")
            )
        return ToolResult.ok(f"paid {args['amount']}")

    pay_tool = CustomTool(
        "make_payment",
        "Send a payment. Requires approval first.",
        pay,
        {
            "type": "object",
            "properties": {"amount": {"type": "number"}},
            "required": ["amount"],
        },
    )

    first = await pay_tool.execute({"amount": 500}, None)
    req = ToolResult.pending_of(first)
    assert req is not None and req.kind == "approval", first

    approved = True  # out-of-band: someone approves it
    second = await pay_tool.execute({"amount": 500}, None)
    assert not second.is_error
    assert second.output == "paid 500"
    assert first.output == "Approve payment of 500?"


async def test_pending_full_surface_halts_the_client_loop(provider: FakeProvider) -> None:
    """pending example 3: without wait_for, run() halts with status "pending" and the request."""
    provider.handler = lambda body, seen: openai_reply(None, [("c1", "approve_refund", "{}")])
    refund = CustomTool(
        "approve_refund",
        "Refund a customer. Needs manager approval.",
        lambda args, ctx: ToolResult.pending(Request("", "approval", "Approve the refund?")),
    )

    with anyio.fail_after(10):
        async with (
            Toolkit.create(builtins=False, extra_tools=[refund]) as tk,
            client_for(provider) as client,  # no wait_for
        ):
            res = await client.run("please refund order 42", tk)

    assert res.status == "pending"
    assert res.pending is not None and res.pending.kind == "approval", res.pending
    assert res.pending.prompt == "Approve the refund?"
    assert pending_of(res) == res.pending
    assert len(provider.requests) == 1, "a halted run asks the model nothing more"
    assert_no_leaks()


# --- LlmClient.Options.waitFor --------------------------------------------------------------


async def test_wait_for_smallest_useful_call_resolves_an_approval_inline(
    provider: FakeProvider,
) -> None:
    """waitFor example 1: wait_for approves inline; the run finishes with the model's text."""
    stub_llm(provider, "send_payment", "Approved and sent.")

    def send(args: dict[str, Any], ctx: ToolContext | None) -> ToolResult:
        if ctx is None or ctx.answer is None:
            return ToolResult.pending(Request("", "approval", "Approve this payment?"))
        return ToolResult.ok("sent")

    send_payment = CustomTool("send_payment", "Send a payment; needs approval first.", send)

    async def always_yes(request: Request) -> Answer:
        # The host's own logic decides how an approval gets resolved; here, always yes.
        return Answer(request.id, True)

    with anyio.fail_after(10):
        async with (
            Toolkit.create(builtins=False, extra_tools=[send_payment]) as tk,
            client_for(provider, wait_for=always_yes) as client,
        ):
            res = await client.run("pay the invoice", tk)

    assert res.status == "done"
    assert res.text == "Approved and sent."
    tool_messages = [m for m in provider.bodies[1]["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == ["sent"], "the retry's result reaches the model"
    assert_no_leaks()


async def test_wait_for_realistic_case_sees_the_url_and_flips_state(provider: FakeProvider) -> None:
    """waitFor example 2: the login link reaches wait_for, which flips out-of-band state."""
    stub_llm(provider, "get_balance", "Done — your balance is 67417.")
    authed = False
    tool_output: list[str] = []

    def balance(args: dict[str, Any], ctx: ToolContext | None) -> ToolResult:
        if not authed:
            return ToolResult.auth_required(
                "https://example.com/login?token=abc", "Log in to view your balance"
            )
        answer_id = ctx.answer.id if ctx is not None and ctx.answer is not None else "none"
        result = ToolResult.ok(f"balance: 67417 (resolved via answer {answer_id})")
        tool_output.append(result.output)
        return result

    get_balance = CustomTool(
        "get_balance", "Return the account balance. Requires login first.", balance
    )
    link_seen: list[str | None] = []
    asked: list[Request] = []

    async def simulate_login(request: Request) -> Answer:
        # In real life: open a browser, text the link, forward it to another agent.
        nonlocal authed
        link_seen.append(request.url)
        asked.append(request)
        authed = True  # the world changed out-of-band
        return Answer(request.id, True)

    with anyio.fail_after(10):
        async with (
            Toolkit.create(builtins=False, extra_tools=[get_balance]) as tk,
            client_for(provider, wait_for=simulate_login) as client,
        ):
            res = await client.run("what is my balance?", tk)

    assert res.status == "done"
    assert res.pending is None, "no pending request once resolved"
    assert "67417" in res.text
    assert len(link_seen) == 1
    assert link_seen[0] is not None and "example.com/login" in link_seen[0], link_seen
    assert asked[0].kind == "authorization"
    # The retry ran with ctx.answer set to the answer that echoes the request id.
    assert tool_output == [f"balance: 67417 (resolved via answer {asked[0].id})"]
    tool_messages = [m for m in provider.bodies[1]["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == tool_output
    assert_no_leaks()


async def test_wait_for_full_surface_both_postures(provider: FakeProvider) -> None:
    """waitFor example 3: (A) with wait_for the run is "done"; (B) without, it is "pending"."""
    stub_llm(provider, "needs_approval", "resolved")

    def approval_toolkit(approved: list[bool]) -> Toolkit:
        tk = Toolkit.create(builtins=False)

        def gated(args: dict[str, Any], ctx: ToolContext | None) -> ToolResult:
            if not approved[0]:
                return ToolResult.pending(Request("", "approval", "Approve?"))
            return ToolResult.ok("done")

        tk.register(CustomTool("needs_approval", "Something gated behind approval.", gated))
        return tk

    # (A) wait_for provided: the engine resolves and retries transparently.
    approved_a = [False]

    async def approve_a(request: Request) -> Answer:
        approved_a[0] = True
        return Answer(request.id, True)

    with anyio.fail_after(10):
        async with (
            approval_toolkit(approved_a) as tk,
            client_for(provider, wait_for=approve_a) as client,
        ):
            a = await client.run("do the gated thing", tk)
    assert a.status == "done", f"A: {a.status}"
    assert a.text == "resolved"
    assert len(provider.requests) == 2

    # (B) no wait_for: run() halts with status "pending" and never hangs.
    provider.requests.clear()
    approved_b = [False]
    with anyio.fail_after(10):
        async with approval_toolkit(approved_b) as tk, client_for(provider) as client:
            b = await client.run("do the gated thing", tk)
    assert b.status == "pending", f"B: {b.status}"
    assert b.pending is not None and b.pending.kind == "approval", b.pending
    assert approved_b == [False]
    assert len(provider.requests) == 1
    assert_no_leaks()
