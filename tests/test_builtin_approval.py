"""The acting built-ins ask first: bash, write, edit and apply_patch, called directly.

What is asked (the exact preview), that an approved call acts once, that a call whose file
changed after the ask does nothing, and the "allow-all" and callable policies. Whole runs
are in test_builtin_approval_runs.py.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from toolnexus_async import Answer, Request, ToolContext, ToolResult, UsageError, pending_of
from toolnexus_async.tools.builtin import ApplyPatchTool, BashTool, EditTool, Workspace, WriteTool

PATCH = (
    "*** Begin Patch\n"
    "*** Add File: docs/new.md\n"
    "+# New\n"
    "*** Update File: app.py\n"
    "*** Move to: src/main.py\n"
    "@@ def main():\n"
    "-    print('hi')\n"
    "+    print('hello')\n"
    "*** Delete File: old.txt\n"
    "*** End Patch\n"
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "notes.txt").write_text("one\ntwo\n")
    (root / "app.py").write_text("def main():\n    print('hi')\n")
    (root / "old.txt").write_text("bye\n")
    return root


@pytest.fixture
def ws(root: Path) -> Workspace:
    return Workspace(root)


def asked(result: ToolResult) -> Request:
    """The approval request ``result`` suspends with (it must be one)."""
    request = pending_of(result)
    assert request is not None, result.output
    assert request.kind == "approval"
    assert request.data is not None
    assert isinstance(request.data["digest"], str) and request.data["digest"].startswith("sha256:")
    return request


def approved(request: Request) -> ToolContext:
    """The context of the retry the run makes once ``request`` was approved."""
    return ToolContext(answer=Answer(request.id, True), request=request, tool_name="x")


def without_digest(data: dict[str, Any] | None) -> dict[str, Any]:
    assert data is not None
    return {key: value for key, value in data.items() if key != "digest"}


# --- what is asked ---------------------------------------------------------------------


async def test_bash_asks_showing_the_command_and_the_real_workdir(root: Path, ws: Workspace):
    """The request holds the command and the directory it would run in; nothing ran."""
    (root / "sub").mkdir()
    args = {"command": "touch ran", "workdir": "sub"}
    request = asked(await BashTool(ws).execute(args))
    assert request.prompt == f"Allow bash to run this command in {root / 'sub'}?\n\ntouch ran"
    assert without_digest(request.data) == {
        "tool": "bash",
        "arguments": args,
        "command": "touch ran",
        "workdir": str(root / "sub"),
    }
    assert not (root / "sub" / "ran").exists()


async def test_write_asks_with_the_diff_of_the_file(root: Path, ws: Workspace):
    """Overwriting shows the unified diff; a new file shows its content; nothing is written."""
    tool = WriteTool(ws)
    over = asked(await tool.execute({"path": "notes.txt", "content": "one\n2\n"}))
    diff = "--- a/notes.txt\n+++ b/notes.txt\n@@ -1,2 +1,2 @@\n one\n-two\n+2\n"
    assert over.prompt == f"Allow write to overwrite notes.txt?\n\n{diff}".rstrip("\n")
    assert without_digest(over.data) == {
        "tool": "write",
        "arguments": {"path": "notes.txt", "content": "one\n2\n"},
        "path": "notes.txt",
        "diff": diff,
    }
    new = asked(await tool.execute({"path": "d/new.txt", "content": "a\nb"}))
    assert new.prompt.startswith("Allow write to create d/new.txt?\n\n")
    assert new.data is not None and new.data["diff"] == (
        "--- /dev/null\n+++ b/d/new.txt\n@@ -0,0 +1,2 @@\n+a\n+b\n\\ No newline at end of file\n"
    )
    assert (root / "notes.txt").read_text() == "one\ntwo\n"
    assert not (root / "d").exists()


async def test_edit_asks_with_the_diff_of_the_file(root: Path, ws: Workspace):
    """The diff is of the whole edit, every replacement included."""
    args = {"path": "notes.txt", "oldString": "o", "newString": "0", "replaceAll": True}
    request = asked(await EditTool(ws).execute(args))
    diff = "--- a/notes.txt\n+++ b/notes.txt\n@@ -1,2 +1,2 @@\n-one\n-two\n+0ne\n+tw0\n"
    assert request.prompt == f"Allow edit to change notes.txt?\n\n{diff}".rstrip("\n")
    assert without_digest(request.data) == {
        "tool": "edit",
        "arguments": args,
        "path": "notes.txt",
        "diff": diff,
    }
    assert (root / "notes.txt").read_text() == "one\ntwo\n"


async def test_apply_patch_asks_with_the_diff_of_every_file(root: Path, ws: Workspace):
    """The dry run's changes and the diff of each file, a move shown as one diff."""
    request = asked(await ApplyPatchTool(ws).execute({"patchText": PATCH}))
    changes = ["A docs/new.md", "M src/main.py (moved from app.py)", "D old.txt"]
    diff = (
        "--- /dev/null\n+++ b/docs/new.md\n@@ -0,0 +1 @@\n+# New\n"
        "--- a/app.py\n+++ b/src/main.py\n@@ -1,2 +1,2 @@\n def main():\n"
        "-    print('hi')\n+    print('hello')\n"
        "--- a/old.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-bye\n"
    )
    assert request.prompt == (
        "Allow apply_patch to change these files?\n" + "\n".join(changes) + "\n\n" + diff
    ).rstrip("\n")
    assert without_digest(request.data) == {
        "tool": "apply_patch",
        "arguments": {"patchText": PATCH},
        "changes": changes,
        "diff": diff,
    }
    assert sorted(p.name for p in root.iterdir()) == ["app.py", "notes.txt", "old.txt"]


async def test_a_long_diff_is_cut_in_the_prompt_but_whole_in_the_data(ws: Workspace):
    """The person gets a readable prompt; data['diff'] has every line."""
    content = "".join(f"line {i}\n" for i in range(2000))
    request = asked(await WriteTool(ws).execute({"path": "big.txt", "content": content}))
    assert request.data is not None and request.data["diff"].endswith("+line 1999\n")
    assert len(request.prompt) < 4200
    assert "the diff goes on" in request.prompt and "data['diff']" in request.prompt


async def test_a_call_that_would_fail_does_not_ask(root: Path, ws: Workspace):
    """Nothing to approve: bad arguments, a missing text, an escape are plain errors."""
    results = [
        await BashTool(ws).execute({"command": "true", "workdir": "nope"}),
        await EditTool(ws).execute({"path": "notes.txt", "oldString": "x", "newString": "y"}),
        await WriteTool(ws).execute({"path": "../out.txt", "content": "x"}),
        await ApplyPatchTool(ws).execute({"patchText": "*** Begin Patch\n*** End Patch"}),
    ]
    for result in results:
        assert result.is_error and pending_of(result) is None, result.output


# --- approved, changed, refused --------------------------------------------------------


async def test_approved_calls_act_once(root: Path, ws: Workspace):
    """The retry with the answer and its request acts, exactly once per approval."""
    bash = BashTool(ws)
    args = {"command": "echo x >> ran; echo done"}
    result = await bash.execute(args, approved(asked(await bash.execute(args))))
    assert result.output == "done\n"
    assert (root / "ran").read_text() == "x\n"

    calls: list[tuple[Any, dict[str, Any]]] = [
        (WriteTool(ws), {"path": "notes.txt", "content": "new\n"}),
        (EditTool(ws), {"path": "old.txt", "oldString": "bye", "newString": "ciao"}),
        (ApplyPatchTool(ws), {"patchText": PATCH}),
    ]
    for tool, call in calls:
        done = await tool.execute(call, approved(asked(await tool.execute(call))))
        assert not done.is_error and pending_of(done) is None, done.output
    assert (root / "notes.txt").read_text() == "new\n"
    assert (root / "src" / "main.py").read_text() == "def main():\n    print('hello')\n"
    assert not (root / "old.txt").exists()  # edited to "ciao", then deleted by the patch


@pytest.mark.parametrize("tool", ["write", "edit", "apply_patch"])
async def test_a_file_changed_after_the_ask_is_left_alone(root: Path, ws: Workspace, tool: str):
    """What was approved is not what would happen now: an error, nothing is written."""
    tools: dict[str, tuple[Any, dict[str, Any]]] = {
        "write": (WriteTool(ws), {"path": "app.py", "content": "x = 1\n"}),
        "edit": (EditTool(ws), {"path": "app.py", "oldString": "hi", "newString": "yo"}),
        "apply_patch": (ApplyPatchTool(ws), {"patchText": PATCH}),
    }
    instance, args = tools[tool]
    request = asked(await instance.execute(args))
    (root / "app.py").write_text("def main():\n    print('hi')\n# edited later\n")
    before = {p.name: p.read_bytes() for p in root.iterdir()}

    result = await instance.execute(args, approved(request))

    assert result.is_error and pending_of(result) is None
    assert result.output.startswith(f"{tool}: ")
    assert "changed after the approval was asked" in result.output
    assert "nothing was done" in result.output
    assert {p.name: p.read_bytes() for p in root.iterdir()} == before


async def test_bash_refuses_when_its_workdir_now_leads_elsewhere(root: Path, ws: Workspace):
    """The directory shown is the one approved: a symlink swapped meanwhile stops the run."""
    (root / "a").mkdir()
    (root / "b").mkdir()
    (root / "here").symlink_to(root / "a", target_is_directory=True)
    bash = BashTool(ws)
    args = {"command": "touch ran", "workdir": "here"}
    request = asked(await bash.execute(args))
    (root / "here").unlink()
    (root / "here").symlink_to(root / "b", target_is_directory=True)

    result = await bash.execute(args, approved(request))

    assert result.is_error and "the working directory changed" in result.output
    assert not (root / "a" / "ran").exists() and not (root / "b" / "ran").exists()


async def test_only_the_calls_own_approval_lets_it_act(root: Path, ws: Workspace):
    """A refusal is an error; an answer without the matching request means ask (again)."""
    write = WriteTool(ws)
    args = {"path": "notes.txt", "content": "changed\n"}
    request = asked(await write.execute(args))
    assert request.data is not None

    declined = await write.execute(
        args, ToolContext(answer=Answer(request.id, False, reason="declined"), request=request)
    )
    assert declined == ToolResult.error("write: the call was not approved; nothing was done")

    def other(**changes: Any) -> Request:
        return Request(request.id, "approval", "?", data={**request.data, **changes})  # type: ignore[dict-item]

    not_matching = [
        ToolContext(answer=Answer(request.id, True)),  # e.g. a require_approval hook's
        ToolContext(answer=Answer("other-id", True), request=request),
        ToolContext(answer=Answer(request.id, True), request=other(tool="edit")),
        ToolContext(answer=Answer(request.id, True), request=other(arguments={"path": "x"})),
        ToolContext(answer=Answer(request.id, True), request=other(gate="require_approval")),
        ToolContext(answer=Answer(request.id, True), request=other(digest=None)),
    ]
    for ctx in not_matching:
        again = await write.execute(args, ctx)
        assert pending_of(again) is not None, ctx
    assert (root / "notes.txt").read_text() == "one\ntwo\n"


# --- policies --------------------------------------------------------------------------


async def test_allow_all_runs_without_asking(root: Path, ws: Workspace):
    """ "allow-all" is for sandboxes and CI: every acting tool acts at once."""
    assert (await BashTool(ws, approve="allow-all").execute({"command": "echo hi"})).output == (
        "hi\n"
    )
    written = await WriteTool(ws, approve="allow-all").execute({"path": "n.txt", "content": "n"})
    assert written.output == "wrote 1 bytes to n.txt (created)"
    assert (root / "n.txt").read_text() == "n"


async def test_a_callable_policy_lets_chosen_calls_run_unasked(root: Path, ws: Workspace):
    """policy(name, args) is True: runs; anything else (False, 1, an exception): asks."""
    seen: list[tuple[str, dict[str, Any]]] = []

    def policy(name: str, args: Any) -> Any:
        seen.append((name, dict(args)))
        command = args["command"]
        if command == "boom":
            raise RuntimeError("policy bug")
        return {"echo status": True, "echo truthy": 1}.get(command, False)

    bash = BashTool(ws, approve=policy)
    assert (await bash.execute({"command": "echo status"})).output == "status\n"
    for command in ("echo truthy", "rm -rf x", "boom"):
        assert pending_of(await bash.execute({"command": command})) is not None, command
    assert seen == [
        ("bash", {"command": command})
        for command in ("echo status", "echo truthy", "rm -rf x", "boom")
    ]


@pytest.mark.parametrize("approve", ["never", "ALLOW-ALL", True, 0, None])
def test_a_bad_policy_is_refused(ws: Workspace, approve: Any):
    """Each acting tool checks its policy when built."""
    for cls in (BashTool, WriteTool, EditTool, ApplyPatchTool):
        with pytest.raises(UsageError, match="approve must be 'ask', 'allow-all' or a callable"):
            cls(ws, approve=approve)


def test_the_default_workdir_is_confined_to_the_cwd(root: Path, monkeypatch: pytest.MonkeyPatch):
    """Built without a workspace, an acting tool works confined in the current directory."""
    monkeypatch.chdir(root)
    tool = WriteTool()
    assert tool.workspace.root == Path(os.getcwd()) and tool.workspace.confine
