"""A real crash: a process halts a run, saves it and is SIGKILLed; a new process finishes it.

The child script below runs in two fresh interpreters. Its tools append what they do to an
effects file, one line per execution tagged with the process id, so the test can count
executions across both processes.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from tests.conftest import assert_no_leaks
from toolnexus_async import AlreadyAnsweredError, Answer
from toolnexus_async.durable import SqliteRunStore

CHILD = '''
import json, os, sys

import anyio
import pytest

from toolnexus_async import (
    Answer, LlmClient, Request, ToolContext, Toolkit, ToolResult, ToolReturn, define_tool,
)
from toolnexus_async.durable import SqliteRunStore, resume_stored
from toolnexus_async.testing import ScriptedModel, reply, tool_call

MODE, DB, EFFECTS = sys.argv[1:4]


def effect(line):
    with open(EFFECTS, "a") as f:
        f.write(f"{os.getpid()} {line}\\n")


@define_tool
async def lookup(invoice: str) -> str:
    """Find an invoice."""
    effect(f"lookup {invoice}")
    return f"{invoice}: 30 EUR"


@define_tool
async def pay(amount: int, ctx: ToolContext | None = None) -> ToolResult:
    """Pay; needs approval."""
    if ctx is None or ctx.answer is None:
        effect("pay asked")
        return ToolResult.pending(Request("", "approval", f"Pay {amount} EUR?"))
    effect(f"pay {amount} note={(ctx.answer.data or {}).get('note')}")
    return ToolResult.ok(f"paid {amount}")


@define_tool
async def notify(ctx: ToolContext | None = None) -> ToolResult:
    """Ask who to notify."""
    if ctx is None or ctx.answer is None:
        effect("notify asked")
        return ToolResult.pending(Request("", "input", "Who should know?"))
    who = (ctx.answer.data or {}).get("who")
    effect(f"notify {who}")
    return ToolResult.ok(f"notified {who}")


TOOLKIT = Toolkit.create(builtins=False, extra_tools=[lookup, pay, notify])


def final(messages):
    return " | ".join(f"{m.call_id}={m.output}" for m in messages if isinstance(m, ToolReturn))


async def halt():
    model = ScriptedModel(reply(
        tool_call("lookup", {"invoice": "INV-1"}, id="c1"),
        tool_call("pay", {"amount": 30}, id="c2"),
        tool_call("notify", id="c3"),
    ))
    async with LlmClient.in_process(model) as client:
        halted = await client.run("pay INV-1", TOOLKIT)
    store = SqliteRunStore(DB)  # left open: the crash comes with the connection live
    await store.save(halted)
    line = {"request": halted.pending.id, "status": halted.status, "run_id": halted.run_id,
            "suspended": [r.call.id for r in halted.suspended]}
    print(json.dumps(line), flush=True)
    await anyio.sleep_forever()


async def resume(request_id):
    async def approve(request):
        effect(f"wait_for {request.kind}")
        return Answer(request.id, True, data={"who": "ops"})

    model = ScriptedModel(final)
    async with SqliteRunStore(DB) as store, LlmClient.in_process(model, wait_for=approve) as client:
        answer = Answer(request_id, True, data={"note": "ok by Ann"})
        result = await resume_stored(client, TOOLKIT, store, answer)
        left = [r.id for r in await store.requests()]
    print(json.dumps({"result": result.to_dict(), "left": left}), flush=True)


anyio.run(halt) if MODE == "halt" else anyio.run(resume, sys.argv[4])
'''

# Generous: two interpreters start and import aiohttp; a hang must still end the test.
LIMIT = 60


def child_env() -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}


def effects_by_process(path: Path) -> dict[str, Counter[str]]:
    out: dict[str, Counter[str]] = {}
    for line in path.read_text().splitlines():
        pid, what = line.split(" ", 1)
        out.setdefault(pid, Counter())[what] += 1
    return out


async def test_a_run_survives_sigkill_and_a_new_process_finishes_it(tmp_path: Path):
    """Halt, save, SIGKILL; a new process resumes from the file: done, nothing run twice."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    db, effects = tmp_path / "runs.db", tmp_path / "effects.log"
    args = [sys.executable, "-W", "error", str(script)]
    halt_err = tmp_path / "halt.err"

    with halt_err.open("wb") as err:
        async with await anyio.open_process(
            [*args, "halt", str(db), str(effects)], stderr=err, env=child_env()
        ) as halting:
            assert halting.stdout is not None
            try:
                with anyio.fail_after(LIMIT):
                    raw = await BufferedByteReceiveStream(halting.stdout).receive_until(
                        b"\n", 1 << 16
                    )
            except BaseException:
                halting.kill()
                await halting.wait()
                raise AssertionError(f"the halting child failed: {halt_err.read_text()}") from None
            halted: dict[str, Any] = json.loads(raw)
            halting.send_signal(signal.SIGKILL)
            with anyio.fail_after(LIMIT):
                assert await halting.wait() == -signal.SIGKILL

    assert halted["status"] == "pending"
    assert halted["suspended"] == ["c2", "c3"]

    with anyio.fail_after(LIMIT):
        resumed = await anyio.run_process(
            [*args, "resume", str(db), str(effects), halted["request"]],
            env=child_env(),
            check=False,
        )
    assert resumed.returncode == 0, resumed.stderr.decode()
    assert resumed.stderr == b""  # -W error: not even a ResourceWarning on the way out
    out = json.loads(resumed.stdout)
    result = out["result"]

    assert result["status"] == "done"
    assert result["text"] == "c1=INV-1: 30 EUR | c2=paid 30 | c3=notified ops"
    assert result["run_id"] == halted["run_id"]
    first, second = effects_by_process(effects).values()
    # The halted turn, before the crash: one completed call and two suspensions.
    assert first == Counter({"lookup INV-1": 1, "pay asked": 1, "notify asked": 1})
    # After it: the completed call is not repeated, the answered one runs with its answer,
    # and the other suspended call waits for the same request again (it is not asked
    # twice: its tool does not run to ask again), which this process's wait_for approves.
    assert second == Counter({"pay 30 note=ok by Ann": 1, "wait_for input": 1, "notify ops": 1})
    assert out["left"] == []
    async with SqliteRunStore(db) as store:
        assert await store.requests() == []
        with pytest.raises(AlreadyAnsweredError):
            await store.accept(Answer(halted["request"], True), time.time())
        (summary,) = await store.runs()
        assert (summary.run_id, summary.status) == (halted["run_id"], "done")
    assert_no_leaks()
