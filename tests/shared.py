"""Test helpers used by several test files: tools with countable side effects, a custom
tool that asks for approval, waiters that are only ever cancelled, raw SQL on a store's
file, and aiohttp apps served on 127.0.0.1 inside the test's own event loop."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, closing
from pathlib import Path
from typing import Any, NoReturn

import anyio
from aiohttp import web

from toolnexus_async import (
    LlmClient,
    Message,
    Request,
    ToolContext,
    Toolkit,
    ToolResult,
    ToolReturn,
    define_tool,
)


class Ledger:
    """Tools whose side effects are counted: a payment made twice would show here.

    ``lookup`` completes, ``pay`` asks for approval, ``notify`` asks for input.
    """

    def __init__(self) -> None:
        self.paid: list[int] = []
        self.looked_up = 0

    def toolkit(self) -> Toolkit:
        @define_tool
        async def lookup(invoice: str) -> str:
            """Find an invoice."""
            self.looked_up += 1
            return f"{invoice}: 30 EUR"

        @define_tool
        async def pay(amount: int, ctx: ToolContext | None = None) -> ToolResult:
            """Pay an amount; needs approval."""
            if ctx is None or ctx.answer is None:
                return ToolResult.pending(
                    Request("", "approval", f"Pay {amount} EUR?", data={"amount": amount})
                )
            self.paid.append(amount)
            return ToolResult.ok(f"paid {amount}")

        @define_tool
        async def notify(ctx: ToolContext | None = None) -> ToolResult:
            """Ask who to notify."""
            if ctx is None or ctx.answer is None:
                return ToolResult.pending(Request("", "input", "Who should know?"))
            return ToolResult.ok(f"notified {(ctx.answer.data or {}).get('who')}")

        return Toolkit.create(builtins=False, extra_tools=[lookup, pay, notify])


class ApprovedPay:
    """A custom tool (no define_tool) that asks for approval, then reports "paid"."""

    name = "pay"
    source = "custom"
    description = "pays, after approval"
    input_schema: dict[str, Any] = {"type": "object", "properties": {}}  # noqa: RUF012

    async def execute(self, args: dict[str, Any], ctx: ToolContext | None = None) -> ToolResult:
        if ctx is None or ctx.answer is None:
            return ToolResult.pending(Request("", "approval", "Pay?"))
        return ToolResult.ok("paid")


class Holding:
    """Waiters that wait until they are cancelled, for tests of cancellation.

    ``all_here`` is set once ``expected`` of them wait at the same time; ``cancelled``
    lists the name of each one that was cancelled.
    """

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.waiting = 0
        self.all_here = anyio.Event()
        self.cancelled: list[str] = []

    async def hold(self, name: str) -> NoReturn:
        self.waiting += 1
        if self.waiting == self.expected:
            self.all_here.set()
        try:
            await anyio.sleep_forever()
        finally:
            self.cancelled.append(name)
        raise AssertionError("sleep_forever returned")


def final_from_results(messages: list[Message]) -> str:
    """A model that answers with every tool result it was given, in transcript order."""
    return " | ".join(f"{m.call_id}={m.output}" for m in messages if isinstance(m, ToolReturn))


@asynccontextmanager
async def loopback(app: web.Application) -> AsyncIterator[str]:
    """Serve ``app`` on 127.0.0.1 (a free port) for the block; yields its base URL."""
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@asynccontextmanager
async def every_path(
    handle: Callable[[web.Request], Awaitable[web.StreamResponse]], release: Callable[[], Any]
) -> AsyncIterator[str]:
    """Serve ``handle`` for every method and path on 127.0.0.1; yields the base URL.

    ``release()`` is called on the way out, so a handler held on it ends before the server
    stops.
    """
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    async with loopback(app) as url:
        try:
            yield url
        finally:
            release()


def raw_sql(path: Path, sql: str, *params: Any) -> list[Any]:
    """Run one statement straight on a SQLite file, as a foreign writer would."""
    with closing(sqlite3.connect(path)) as db, db:
        return db.execute(sql, params).fetchall()


async def run_or_stream(
    client: LlmClient, stream: bool, prompt: str = "hi", toolkit: Toolkit | None = None
) -> None:
    """One run of ``prompt``, through ``client.stream`` (read to the end) or ``client.run``."""
    tools = toolkit if toolkit is not None else Toolkit.create(builtins=False)
    if stream:
        async with client.stream(prompt, tools) as events:
            async for _ in events:
                pass
    else:
        await client.run(prompt, tools)
