"""One serve worker on a PostgreSQL run store, run as a child process by the worker tests.

``python -m tests.serve_worker DSN TOKEN LEASE`` serves the approval inbox (``create_app``,
``run_server`` on a free port, printing ``Open the inbox: <url>/`` when it listens) on a
:class:`PostgresRunStore` at ``DSN``, with ``LEASE`` seconds of lease. Its one tool,
``pay``, asks for an approval and then pays; each ask and each payment is one row of the
``effects`` table (:data:`EFFECTS_TABLE`) in the same database, committed with asyncpg
before the tool returns, tagged with the process id and the call's idempotency key, so a
test can count what every process did. The prompt ``"pay N"`` makes the model call
``pay(amount=N)`` once, then end with ``"pay=<output>"``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import anyio

from toolnexus_async import (
    AssistantMessage,
    LlmClient,
    Message,
    Request,
    ToolCall,
    ToolContext,
    Toolkit,
    ToolResult,
    ToolReturn,
    UserMessage,
    define_tool,
)
from toolnexus_async.durable import PostgresRunStore
from toolnexus_async.serve import create_app, run_server

# What each tool execution did: "asked" (it raised its request) or "paid".
EFFECTS_TABLE = """CREATE TABLE public.effects (
    seq BIGSERIAL PRIMARY KEY,
    what TEXT NOT NULL,
    key TEXT NOT NULL,
    run_id TEXT NOT NULL,
    pid INTEGER NOT NULL,
    at DOUBLE PRECISION NOT NULL)"""


def model(messages: Sequence[Message], tools: Any) -> AssistantMessage | str:
    """``"pay N"``: call ``pay(amount=N)``, then end with every result."""
    prompt = next(m.text for m in messages if isinstance(m, UserMessage))
    done = [m for m in messages if isinstance(m, ToolReturn)]
    if not done:
        amount = int((prompt or "").split()[1])
        return AssistantMessage(None, (ToolCall("c1", "pay", {"amount": amount}),))
    return " | ".join(f"{m.name}={m.output}" for m in done)


async def main(dsn: str, token: str, lease: str) -> None:
    import asyncpg

    async with asyncpg.create_pool(dsn, min_size=1, max_size=4) as pool:

        async def effect(what: str, ctx: ToolContext) -> None:
            """One row per execution, committed before the tool goes on."""
            await pool.execute(
                "INSERT INTO public.effects (what, key, run_id, pid, at)"
                " VALUES ($1, $2, $3, $4, $5)",
                what,
                ctx.idempotency_key,
                ctx.run_id,
                os.getpid(),
                time.time(),
            )

        @define_tool
        async def pay(amount: int, ctx: ToolContext | None = None) -> ToolResult:
            """Pay an amount; needs approval."""
            assert ctx is not None
            if ctx.answer is None:
                await effect("asked", ctx)
                return ToolResult.pending(Request("", "approval", f"Pay {amount} EUR?"))
            await effect("paid", ctx)
            return ToolResult.ok(f"paid {amount}")

        async with (
            PostgresRunStore(dsn) as store,
            Toolkit.create(builtins=False, extra_tools=[pay]) as toolkit,
        ):
            app = create_app(
                make_client=lambda inbox: LlmClient.in_process(model, wait_for=inbox),
                toolkit=toolkit,
                store=store,
                park_timeout=600,
                lease=float(lease),
                token=token,
            )
            await run_server(
                app, port=0, on_ready=lambda url: print(f"Open the inbox: {url}/", flush=True)
            )


if __name__ == "__main__":
    dsn, token, lease = sys.argv[1:4]
    anyio.run(main, dsn, token, lease)
