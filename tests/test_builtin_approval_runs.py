"""The acting built-ins' approval in whole runs: declined through wait_for or an Inbox,
halted without wait_for and resumed, behind a require_approval hook."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.conftest import assert_no_leaks
from tests.test_builtin_approval import PATCH, without_digest
from toolnexus_async import (
    Answer,
    Hooks,
    Inbox,
    LlmClient,
    Message,
    Request,
    RunResult,
    Toolkit,
    ToolReturn,
    require_approval,
)
from toolnexus_async.testing import ScriptedModel, reply, tool_call


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "notes.txt").write_text("one\ntwo\n")
    (root / "app.py").write_text("def main():\n    print('hi')\n")
    (root / "old.txt").write_text("bye\n")
    return root


def tool_said(messages: list[Message]) -> str:
    """A model's last turn: it repeats what the tool said."""
    last = messages[-1]
    assert isinstance(last, ToolReturn)
    return f"tool said: {last.output}"


def model_calling(name: str, args: dict[str, Any]) -> ScriptedModel:
    """Calls ``name`` once, then repeats what the tool said."""
    return ScriptedModel(reply(None, tool_call(name, args)), tool_said)


async def test_a_run_whose_wait_for_declines_changes_nothing(root: Path):
    """The model learns it was declined; the file and the shell are untouched."""
    seen: list[Request] = []

    async def decline(request: Request) -> Answer:
        seen.append(request)
        return Answer(request.id, False, reason="declined")

    for name, args in [
        ("write", {"path": "notes.txt", "content": "gone\n"}),
        ("bash", {"command": "touch ran"}),
    ]:
        async with (
            Toolkit.create(workdir=root) as toolkit,
            LlmClient.in_process(model_calling(name, args), wait_for=decline) as client,
        ):
            result = await client.run("go", toolkit)
        assert result.text == f"tool said: declined/expired: {seen[-1].prompt}"
        assert result.tool_calls[0].answered_ok is False
    assert [r.data["tool"] for r in seen if r.data] == ["write", "bash"]
    assert (root / "notes.txt").read_text() == "one\ntwo\n"
    assert not (root / "ran").exists()
    assert_no_leaks()


async def through_inbox(root: Path, ok: bool) -> RunResult:
    """A run of apply_patch whose approval is parked in an Inbox and answered ``ok``."""
    inbox = Inbox()
    results: list[RunResult] = []

    async def run() -> None:
        model = model_calling("apply_patch", {"patchText": PATCH})
        async with (
            Toolkit.create(workdir=root) as toolkit,
            LlmClient.in_process(model, wait_for=inbox) as client,
        ):
            results.append(await client.run("go", toolkit))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            while not inbox.pending():
                await anyio.lowlevel.checkpoint()
            [request] = inbox.pending()
            assert request.data is not None and request.data["tool"] == "apply_patch"
            await inbox.answer(Answer(request.id, ok, reason=None if ok else "declined"))
    [result] = results
    assert result.status == "done"
    return result


async def test_a_run_declined_through_an_inbox_changes_nothing_approved_acts(root: Path):
    """An Inbox parks the approval; answered no, nothing changes; yes, the patch applies."""
    declined = await through_inbox(root, False)
    assert declined.text.startswith("tool said: declined/expired: Allow apply_patch")
    assert sorted(p.name for p in root.iterdir()) == ["app.py", "notes.txt", "old.txt"]
    approved = await through_inbox(root, True)
    assert approved.text.startswith("tool said: Applied the patch:")
    assert not (root / "old.txt").exists() and (root / "src" / "main.py").exists()
    assert_no_leaks()


async def test_without_wait_for_the_run_halts_on_the_approval_and_resumes(root: Path):
    """Halted: status pending, the approval request; resumed from JSON with yes: it acts."""
    args = {"path": "notes.txt", "oldString": "two", "newString": "2"}
    async with Toolkit.create(workdir=root) as toolkit:
        async with LlmClient.in_process(model_calling("edit", args)) as client:
            halted = await client.run("go", toolkit)
        assert halted.status == "pending"
        assert halted.pending is not None and halted.pending.kind == "approval"
        assert without_digest(halted.pending.data) == {
            "tool": "edit",
            "arguments": args,
            "path": "notes.txt",
            "diff": "--- a/notes.txt\n+++ b/notes.txt\n@@ -1,2 +1,2 @@\n one\n-two\n+2\n",
        }
        assert (root / "notes.txt").read_text() == "one\ntwo\n"

        stored = RunResult.from_dict(json.loads(json.dumps(halted.to_dict())))
        assert stored.pending is not None
        repeats = ScriptedModel(tool_said)
        async with LlmClient.in_process(repeats) as other:  # as if in another process
            done = await other.resume(stored, toolkit, answers=Answer(stored.pending.id, True))

    assert done.status == "done"
    assert done.text == "tool said: replaced 1 occurrence in notes.txt"
    assert (root / "notes.txt").read_text() == "one\n2\n"


async def test_a_halted_approval_resumed_after_the_file_changed_does_nothing(root: Path):
    """The model is told the file changed; the new content stays."""
    args = {"path": "notes.txt", "content": "mine\n"}
    model = model_calling("write", args)
    async with Toolkit.create(workdir=root) as toolkit, LlmClient.in_process(model) as client:
        halted = await client.run("go", toolkit)
        assert halted.pending is not None
        (root / "notes.txt").write_text("someone else's\n")
        done = await client.resume(halted, toolkit, answers=Answer(halted.pending.id, True))

    assert done.text.startswith("tool said: write: notes.txt changed after the approval")
    assert done.tool_calls[-1].result.is_error
    assert (root / "notes.txt").read_text() == "someone else's\n"


async def test_behind_require_approval_the_tool_still_asks_unless_allowed(root: Path):
    """The hook's approval is not the tool's: with "ask" both are asked, in that order;
    with approve="allow-all" behind the hook, only the hook asks."""
    hooks = Hooks(before_tool=require_approval(["bash"]))
    for approve, expected in (("ask", ["gate", "bash"]), ("allow-all", ["gate"])):
        seen: list[str] = []

        async def yes(request: Request, seen: list[str] = seen) -> Answer:
            data = request.data or {}
            seen.append("gate" if "gate" in data else data["tool"])
            return Answer(request.id, True)

        model = model_calling("bash", {"command": "echo ran"})
        async with (
            Toolkit.create(workdir=root, approve=approve) as toolkit,  # type: ignore[arg-type]
            LlmClient.in_process(model, wait_for=yes, hooks=hooks) as client,
        ):
            result = await client.run("go", toolkit)
        assert seen == expected
        assert result.text == "tool said: ran\n"
