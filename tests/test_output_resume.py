"""A run with an output type halts, is stored, and is resumed elsewhere against the schema
it was started with: in another process that does not even know the type (the stored
schema asks and validates; the output is the validated JSON), and in this one with the
type given again (the output is built as that type)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from toolnexus_async import (
    Answer,
    LlmClient,
    Message,
    OutputValidationError,
    Request,
    RunResult,
    ToolContext,
    Toolkit,
    ToolResult,
    UserMessage,
    define_tool,
)
from toolnexus_async.durable import DurableHost, SqliteRunStore
from toolnexus_async.testing import ScriptedModel, reply, tool_call

# Generous: an interpreter starts and imports aiohttp; a hang must still end the test.
LIMIT = 60


@dataclasses.dataclass
class Receipt:
    paid: int
    note: str


@define_tool
async def pay(amount: int, ctx: ToolContext | None = None) -> ToolResult:
    """Pay; needs approval."""
    if ctx is None or ctx.answer is None:
        return ToolResult.pending(Request("", "approval", f"Pay {amount} EUR?"))
    return ToolResult.ok(f"paid {amount}")


# What the resuming processes share: no Receipt anywhere, only the stored run and the tool.
CHILD_HEAD = """
import json, sys

import anyio

from toolnexus_async import Answer, LlmClient, OutputValidationError, Request, ToolContext
from toolnexus_async import Toolkit, ToolResult, UserMessage, define_tool
from toolnexus_async.durable import SqliteRunStore, resume_stored

DB, REQUEST = sys.argv[1:3]


@define_tool
async def pay(amount: int, ctx: ToolContext | None = None) -> ToolResult:
    \"\"\"Pay; needs approval.\"\"\"
    if ctx is None or ctx.answer is None:
        return ToolResult.pending(Request("", "approval", f"Pay {amount} EUR?"))
    return ToolResult.ok(f"paid {amount}")
"""

# The resuming process whose model's first answer breaks the schema (a string where an
# integer is due), and its second keeps it.
CHILD = (
    CHILD_HEAD
    + """
SEEN = []
REPLIES = iter(['{"paid": "30", "note": "ok"}', '{"paid": 30, "note": "ok"}'])


def model(messages, tools):
    SEEN.append([getattr(m, "text", None) for m in messages])
    return next(REPLIES)


async def main():
    toolkit = Toolkit.create(builtins=False, extra_tools=[pay])
    async with SqliteRunStore(DB) as store, LlmClient.in_process(model) as client:
        result = await resume_stored(client, toolkit, store, Answer(REQUEST, True))
    print(json.dumps({"result": result.to_dict(), "seen": SEEN}))


anyio.run(main)
"""
)


def child_env() -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}


async def resume_in_a_child(tmp_path: Path, code: str, db: Path, request_id: str) -> Any:
    """Run ``code`` in another interpreter on the store ``db`` and the answered request;
    what it printed, as JSON."""
    script = tmp_path / "child.py"
    script.write_text(code)
    with anyio.fail_after(LIMIT):
        done = await anyio.run_process(
            [sys.executable, "-W", "error", str(script), str(db), request_id],
            env=child_env(),
            check=False,
        )
    assert done.returncode == 0, done.stderr.decode()
    return json.loads(done.stdout)


def toolkit() -> Toolkit:
    return Toolkit.create(builtins=False, extra_tools=[pay])


async def halt_in_store(db: Path) -> Any:
    model = ScriptedModel(reply(tool_call("pay", {"amount": 30}, id="c1")))
    async with (
        SqliteRunStore(db) as store,
        LlmClient.in_process(model) as client,
        DurableHost(client, toolkit(), store) as host,
    ):
        halted = await host.run("pay 30", output_type=Receipt)
        stored = await store.load(halted.run_id)
    return halted, stored


async def test_a_halted_typed_run_is_resumed_by_another_process(tmp_path: Path):
    db = tmp_path / "runs.db"
    halted, stored = await halt_in_store(db)
    assert halted.status == "pending"
    assert halted.output_spec is not None and halted.output_spec.name == "Receipt"
    # What the store keeps says which schema the output must match.
    assert stored.state.output_spec == halted.output_spec

    out = await resume_in_a_child(tmp_path, CHILD, db, halted.pending.id)
    result = out["result"]
    assert result["status"] == "done"
    assert result["run_id"] == halted.run_id
    assert result["output"] == {"paid": 30, "note": "ok"}
    assert result["output_spec"]["name"] == "Receipt"
    assert result["output_spec"]["method"] == "prompt"
    first, second = out["seen"]
    # The other process asked with the stored schema, and checked the reply against it.
    assert '"title":"Receipt"' in first[0]
    assert "paid must be integer, got string" in second[-1]


async def test_a_halted_typed_run_resumed_with_its_type_builds_it(tmp_path: Path):
    halted, _ = await halt_in_store(tmp_path / "runs.db")
    again: list[Message] = []

    def model(messages: list[Message], tools: list[Any]) -> str:
        again.extend(messages)
        return '{"paid": 30, "note": "approved"}'

    async with LlmClient.in_process(model) as client, toolkit() as tools:
        result = await client.resume(
            halted, tools, answers=Answer(halted.pending.id, True), output_type=Receipt
        )
    assert result.output == Receipt(30, "approved")
    assert result.output_method == "prompt"


# The resuming process for the retry count: it reports how many corrections it sent and
# whether the run ended with a typed error or a value.
CHILD_RETRIES = (
    CHILD_HEAD
    + """
TOLD = []
REPLIES = iter(["still not JSON", "nor this", '{"paid": 30, "note": "ok"}'])


def model(messages, tools):
    if isinstance(messages[-1], UserMessage) and "JSON Schema" in messages[-1].text:
        TOLD.append(messages[-1].text)
    return next(REPLIES)


async def main():
    toolkit = Toolkit.create(builtins=False, extra_tools=[pay])
    async with SqliteRunStore(DB) as store, LlmClient.in_process(model) as client:
        try:
            result = await resume_stored(client, toolkit, store, Answer(REQUEST, True))
            out = {"status": result.status, "used": result.output_retries_used}
        except OutputValidationError as exc:
            out = {"status": "invalid", "used": exc.run.output_retries_used}
    print(json.dumps({**out, "told": len(TOLD)}))


anyio.run(main)
"""
)


async def halt_after_a_correction(db: Path) -> Any:
    """A run allowed 2 output retries that used 1 (a reply that was not JSON) and then
    halted on a tool's request, kept in the store at ``db``."""
    model = ScriptedModel(
        reply("not JSON at all"), reply(tool_call("pay", {"amount": 30}, id="c1"))
    )
    async with (
        SqliteRunStore(db) as store,
        LlmClient.in_process(model) as client,
        DurableHost(client, toolkit(), store) as host,
    ):
        halted = await host.run("pay 30", output_type=Receipt, output_retries=2)
    return halted


async def test_the_retries_used_survive_a_halt_in_the_same_process(tmp_path: Path):
    halted = await halt_after_a_correction(tmp_path / "runs.db")
    assert (halted.status, halted.output_retries_used) == ("pending", 1)
    stored = RunResult.from_dict(json.loads(json.dumps(halted.to_dict())))
    assert stored.output_retries_used == 1
    told: list[str] = []

    def model(messages: list[Message], tools: list[Any]) -> str:
        last = messages[-1]
        if isinstance(last, UserMessage) and "JSON Schema" in last.text:
            told.append(last.text)
        return "again no JSON"

    async with LlmClient.in_process(model) as client, toolkit() as tools:
        with pytest.raises(OutputValidationError) as caught:
            await client.resume(stored, tools, answers=Answer(halted.pending.id, True))
    # 2 allowed, 1 used before the halt: one correction after it, not two.
    assert len(told) == 1
    assert caught.value.run.output_retries_used == 2


async def test_the_retries_used_survive_a_halt_resumed_by_another_process(tmp_path: Path):
    db = tmp_path / "runs.db"
    halted = await halt_after_a_correction(db)
    out = await resume_in_a_child(tmp_path, CHILD_RETRIES, db, halted.pending.id)
    # The other process had one correction left: it sent it, and the second invalid reply
    # ended the run (with a fresh count of 2 the third reply would have passed).
    assert out == {"status": "invalid", "used": 2, "told": 1}
