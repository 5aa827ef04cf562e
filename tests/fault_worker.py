"""One serve worker for the database fault tests, run as a child process by them.

``python -m tests.fault_worker (--dsn DSN | --sqlite PATH) --token TOKEN --lease SECONDS
--ledger PATH --store-timeout SECONDS [--work SECONDS]`` serves the approval inbox
(``create_app``, ``run_server`` on a free port, printing ``Open the inbox: <url>/`` once it
listens) on a ``PostgresRunStore(dsn, command_timeout=store_timeout,
call_timeout=store_timeout)``, or on a ``SqliteRunStore(path, timeout=store_timeout)``, as
``serve --store ... --store-timeout`` opens them.

Rules of this module:

- Its one tool, ``pay``, asks for an approval; once approved it works for ``--work``
  seconds. Each execution of an approved call first appends one line to the ledger file,
  ``<run id> <idempotency key> <pid> <time>``, so that the tests count executions across
  processes. The ledger is a plain file, not a table, because the database may be down
  while the tool runs; each line is one ``write`` to a file opened with ``O_APPEND``, so
  two processes never interleave their lines, and it is on its way to the disk before the
  work begins (a payment, once sent, cannot be unsent).
- The line is written when the execution begins, not when it ends: an execution cut off
  half way and run again elsewhere is two executions of the call, and must show as two.
- The prompt ``"pay N"`` makes the model call ``pay(amount=N)`` once, then end with
  ``"pay=<output>"`` (``"pay=paid N"`` once approved).
- What the durable host and the store log goes to stderr, with the time, which the tests
  print when they fail: the lines that say why a run was lost or driven twice.
"""

from __future__ import annotations

import argparse
import logging
import os
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
from toolnexus_async.durable import PostgresRunStore, RunStore, SqliteRunStore
from toolnexus_async.serve import create_app, run_server


def model(messages: Sequence[Message], tools: Any) -> AssistantMessage | str:
    """``"pay N"``: call ``pay(amount=N)``, then end with every result."""
    prompt = next(m.text for m in messages if isinstance(m, UserMessage))
    done = [m for m in messages if isinstance(m, ToolReturn)]
    if not done:
        amount = int((prompt or "").split()[1])
        return AssistantMessage(None, (ToolCall("c1", "pay", {"amount": amount}),))
    return " | ".join(f"{m.name}={m.output}" for m in done)


def append_line(ledger: str, line: str) -> None:
    """``line`` as one write at the end of ``ledger``, on disk before this returns."""
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.fault_worker")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--dsn")
    where.add_argument("--sqlite", help="the SQLite file of the store")
    parser.add_argument("--token", required=True)
    parser.add_argument("--lease", type=float, required=True)
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--store-timeout", type=float, required=True)
    parser.add_argument("--work", type=float, default=0.5, help="seconds a payment takes")
    return parser.parse_args(argv)


async def main(args: argparse.Namespace) -> None:
    @define_tool
    async def pay(amount: int, ctx: ToolContext | None = None) -> ToolResult:
        """Pay an amount; needs approval."""
        assert ctx is not None
        if ctx.answer is None:
            return ToolResult.pending(Request("", "approval", f"Pay {amount} EUR?"))
        append_line(
            args.ledger, f"{ctx.run_id} {ctx.idempotency_key} {os.getpid()} {time.time():.3f}"
        )
        # The payment itself: it takes a while, so that faults land while tools execute.
        await anyio.sleep(args.work)
        logging.getLogger("fault_worker").info("paid %s (%s)", ctx.run_id, ctx.idempotency_key)
        return ToolResult.ok(f"paid {amount}")

    store: RunStore = (
        PostgresRunStore(
            args.dsn, command_timeout=args.store_timeout, call_timeout=args.store_timeout
        )
        if args.dsn is not None
        else SqliteRunStore(args.sqlite, timeout=args.store_timeout)
    )
    async with (
        store,
        Toolkit.create(builtins=False, extra_tools=[pay]) as toolkit,
    ):
        app = create_app(
            make_client=lambda inbox: LlmClient.in_process(model, wait_for=inbox),
            toolkit=toolkit,
            store=store,
            park_timeout=600,
            lease=args.lease,
            token=args.token,
            store_timeout=args.store_timeout,  # /readyz waits no longer than a statement
        )
        await run_server(
            app, port=0, on_ready=lambda url: print(f"Open the inbox: {url}/", flush=True)
        )


if __name__ == "__main__":
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s.%(msecs)03d {os.getpid()} %(name)s %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
    )
    # aiohttp's access log would drown the lines that matter.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    anyio.run(main, parse())
