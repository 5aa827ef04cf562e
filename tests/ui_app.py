"""The serve app the front-end protocol tests drive, and what they share.

Its model, given the prompt ``"shop"``, asks in one turn for ``pay(amount=5)`` and
``refund(order="A1")`` (both behind ``require_approval``, ``pay`` editable) and for the
``question`` built-in ("Gift wrap?"): two approvals and a question open at once. Given
``"hold"``, it calls ``hold``, whose approval expires :data:`HOLD_SECONDS` after it is
asked. Once every call has its result it ends with ``name=output`` of each, joined by
``" | "``. Each execution of ``pay`` or ``refund`` is counted in :data:`EFFECTS`, so a test
sees that a replayed answer ran nothing twice.

The node clients (``tests/node/*.mjs``) are the protocols' own: :func:`node_script` finds
node and them, or skips, and fails under ``CI=true``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.test_serve_api import GuardedTestServer, closing
from toolnexus_async import (
    AssistantMessage,
    Hooks,
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
    require_approval,
)
from toolnexus_async.durable import SqliteRunStore
from toolnexus_async.serve import ServeInbox, create_app
from toolnexus_async.tools.builtin.question import QuestionTool

NODE_DIR = Path(__file__).resolve().parent / "node"
TOKEN = "ui-tests-token-0123456789"
HOLD_SECONDS = 1.5
LIMIT = 60

# Executions of pay and refund, by "name:arguments", since the process started.
EFFECTS: Counter[str] = Counter()


@define_tool
async def pay(amount: int) -> str:
    """Pay an amount."""
    EFFECTS[f"pay:{amount}"] += 1
    return f"paid {amount}"


@define_tool
async def refund(order: str) -> str:
    """Refund an order."""
    EFFECTS[f"refund:{order}"] += 1
    return f"refunded {order}"


@define_tool
async def hold(ctx: ToolContext | None = None) -> ToolResult:
    """Hold a table; the approval expires soon."""
    if ctx is not None and ctx.answer is not None:
        return ToolResult.ok("held")
    expires = (datetime.now(UTC) + timedelta(seconds=HOLD_SECONDS)).isoformat()
    return ToolResult.pending(Request("", "approval", "Hold the table?", expires_at=expires))


def model(messages: Sequence[Message], tools: Any) -> AssistantMessage | str:
    prompt = next(m.text for m in messages if isinstance(m, UserMessage))
    done = [m for m in messages if isinstance(m, ToolReturn)]
    if done:
        return " | ".join(f"{m.name}={m.output}" for m in done)
    if prompt == "hold":
        return AssistantMessage(None, (ToolCall("h1", "hold", {}),))
    wrap = {"questions": [{"question": "Gift wrap?", "options": ["yes", "no"]}]}
    return AssistantMessage(
        "Paying, refunding and asking.",
        (
            ToolCall("c1", "pay", {"amount": 5}),
            ToolCall("c2", "refund", {"order": "A1"}),
            ToolCall("c3", "question", wrap),
        ),
    )


def ui_tools() -> list[Any]:
    return [pay, refund, hold, QuestionTool()]


def ui_client(inbox: ServeInbox) -> LlmClient:
    gate = require_approval(["pay", "refund"], editable=True)
    return LlmClient.in_process(model, wait_for=inbox, hooks=Hooks(before_tool=gate))


def ui_toolkit() -> Toolkit:
    return Toolkit.create(builtins=False, extra_tools=ui_tools())


def node_script(name: str) -> tuple[str, Path]:
    """node and ``tests/node/<name>`` with its packages installed; else skip (fail on CI)."""
    node = shutil.which("node")
    script = NODE_DIR / name
    missing = [
        what
        for what, there in (
            ("node", node is not None),
            ("@ag-ui/client", (NODE_DIR / "node_modules" / "@ag-ui" / "client").is_dir()),
            ("ai", (NODE_DIR / "node_modules" / "ai").is_dir()),
            (str(script), script.is_file()),
        )
        if not there
    ]
    if missing:
        why = f"missing {', '.join(missing)} (npm ci --prefix tests/node)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    assert node is not None
    return node, script


async def run_node(name: str, given: dict[str, Any]) -> dict[str, Any]:
    """Run ``tests/node/<name>`` with ``given`` as JSON on stdin; its JSON output."""
    node, script = node_script(name)
    with anyio.fail_after(LIMIT):
        done = await anyio.run_process(
            [node, str(script)], input=json.dumps(given).encode(), cwd=NODE_DIR, check=False
        )
    if done.returncode != 0:
        raise AssertionError(f"{name} failed ({done.returncode}): {done.stderr.decode()}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


# (SQLite file) -> a server on it, yielding its base url.
Serving = Callable[[Path], AbstractAsyncContextManager[str]]


@asynccontextmanager
async def serving(path: Path) -> AsyncIterator[str]:
    """A serve app on the SQLite file ``path``, on a loopback port; its base url."""
    async with ui_toolkit() as toolkit, serving_on(SqliteRunStore(path), toolkit) as base:
        yield base


@asynccontextmanager
async def serving_on(store: Any, toolkit: Toolkit) -> AsyncIterator[str]:
    """A serve app on ``store`` (closed with it), on a loopback port; its base url."""
    app = create_app(make_client=ui_client, toolkit=toolkit, store=store, token=TOKEN)
    async with GuardedTestServer(closing(app, store)) as server:
        yield str(server.make_url("")).rstrip("/")
