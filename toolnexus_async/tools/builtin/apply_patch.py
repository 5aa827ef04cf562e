"""The ``apply_patch`` built-in: add, change, move and delete files in one step.

Rules of this module:

- All files change or none do. The patch is parsed completely (by :mod:`._patch`, which
  holds the grammar), then every file's new content is computed in memory against what is
  on disk (earlier operations of the same patch included); only when every hunk of every
  file has matched is anything written. If writing itself fails part-way (a full disk, a
  permission), the files already written are put back as they were.
- That in-memory plan is also the dry run the approval shows (:mod:`._approval`): the
  request carries the unified diff of every file the patch touches, and on the approved
  retry the plan is made again and written only if its digest is the one approved.
- Files are read and written through :mod:`._regular`, and deleted through the
  :class:`Workspace`, both with its confinement held at the use (a symlink swapped in to
  lead out is refused, not followed): a FIFO, device or socket in the patch is refused,
  and nothing is written. A move is a write of the target and a deletion of the source.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from ..._core.types import ToolContext, ToolResult
from ._approval import ActingTool, Decision, Preview, cut_for_prompt, digest_of, unified_diff
from ._patch import (
    AddFile,
    DeleteFile,
    Hunk,
    Operation,
    PatchError,
    UpdateFile,
    apply_hunks,
    parse_patch,
)
from ._regular import is_binary, read_regular, write_regular
from ._workspace import ArgumentError, Workspace, required_str
from .files import MUTATION_LOCK, NotTextError, describe_os_error

# The grammar's names are re-exported: callers (and the tests) import them from here.
__all__ = (
    "AddFile",
    "ApplyPatchTool",
    "DeleteFile",
    "Hunk",
    "Operation",
    "PatchError",
    "UpdateFile",
    "parse_patch",
)


class _PartialWrite(Exception):
    """Writing failed part-way and putting the old content back failed too."""


class _Plan:
    """The files a patch touches: their content on disk and their content afterwards."""

    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace
        self.before: dict[Path, bytes | None] = {}
        self.after: dict[Path, bytes | None] = {}
        # Move targets and where they were moved from, for the diff a person approves.
        self.moves: dict[Path, Path] = {}

    def path(self, given: str) -> tuple[Path, str]:
        path = self.workspace.resolve(given)
        return path, self.workspace.display(path)

    def current(self, path: Path, shown: str) -> bytes | None:
        if path not in self.after:
            if self.workspace.is_dir(path):
                raise PatchError(f"{shown} is a directory")
            try:
                data: bytes | None = read_regular(path, shown, within=self.workspace.within)
            except FileNotFoundError:
                data = None
            except OSError as exc:
                raise PatchError(describe_os_error(exc, shown)) from None
            self.before[path] = self.after[path] = data
        return self.after[path]

    def text(self, path: Path, shown: str) -> str:
        data = self.current(path, shown)
        if data is None:
            raise PatchError(f"Update File {shown}: no such file")
        if is_binary(data):
            raise NotTextError(f"Update File {shown}: the file is binary")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise NotTextError(f"Update File {shown}: the file is not UTF-8 text") from None

    def commit(self) -> None:
        changed = [p for p in self.after if self.after[p] != self.before[p]]
        # Writes before deletions: a failed write then leaves no file already deleted.
        changed.sort(key=lambda p: self.after[p] is None)
        touched: list[Path] = []
        try:
            for path in changed:
                touched.append(path)
                data = self.after[path]
                if data is None:
                    self.workspace.unlink(path)
                else:
                    shown = self.workspace.display(path)
                    write_regular(path, data, shown, within=self.workspace.within)
        except (OSError, ValueError) as exc:  # ValueError: a FIFO, device or link out swapped in
            failed = self._restore(touched)
            shown = self.workspace.display(touched[-1])
            problem = describe_os_error(exc, shown) if isinstance(exc, OSError) else str(exc)
            if failed:
                raise _PartialWrite(
                    f"writing failed: {problem}; the patch is HALF APPLIED: could not restore "
                    f"{', '.join(failed)}"
                ) from None
            raise PatchError(
                f"writing failed: {problem}; the files written were restored"
            ) from None

    def _restore(self, touched: Sequence[Path]) -> list[str]:
        failed = []
        for path in reversed(touched):
            original = self.before[path]
            try:
                if original is None:
                    with contextlib.suppress(FileNotFoundError):
                        self.workspace.unlink(path)
                else:
                    shown = self.workspace.display(path)
                    write_regular(path, original, shown, within=self.workspace.within)
            except (OSError, ValueError):
                failed.append(self.workspace.display(path))
        return failed

    def preview(self, report: Sequence[str]) -> Preview:
        """The dry run as a person approves it: every change as a unified diff."""
        display = self.workspace.display
        moved = {t: s for t, s in self.moves.items() if self.before[t] is None}
        shown_with_target = {s for s in moved.values() if self.after[s] is None}
        diffs: list[str] = []
        parts: list[bytes | str | None] = ["apply_patch"]
        for path, after in self.after.items():
            before = self.before[path]
            parts += [str(path), before, after]
            if before == after or path in shown_with_target:
                continue
            source = moved.get(path, path)
            diffs.append(unified_diff(self.before[source], after, display(source), display(path)))
        diff = "".join(diffs)
        listing = "\n".join(report)
        return Preview(
            prompt=f"Allow apply_patch to change these files?\n{listing}\n\n"
            f"{cut_for_prompt(diff)}".rstrip("\n"),
            details={"changes": list(report), "diff": diff},
            digest=digest_of(*parts),
            subject="a file the patch touches",
        )


def _plan(workspace: Workspace, ops: Sequence[Operation]) -> tuple[_Plan, list[str]]:
    plan = _Plan(workspace)
    report: list[str] = []
    for op in ops:
        path, shown = plan.path(op.path)
        if isinstance(op, AddFile):
            if plan.current(path, shown) is not None:
                raise PatchError(
                    f"Add File {shown}: the file already exists (use Update File, or Delete "
                    "File before adding it)"
                )
            text = "".join(line + "\n" for line in op.lines)
            plan.after[path] = text.encode("utf-8")
            report.append(f"A {shown}")
        elif isinstance(op, DeleteFile):
            if plan.current(path, shown) is None:
                raise PatchError(f"Delete File {shown}: no such file")
            plan.after[path] = None
            report.append(f"D {shown}")
        else:
            new_text = apply_hunks(plan.text(path, shown), op.hunks, shown)
            if op.move_to is None:
                plan.after[path] = new_text.encode("utf-8")
                report.append(f"M {shown}")
                continue
            target, target_shown = plan.path(op.move_to)
            if target != path and plan.current(target, target_shown) is not None:
                raise PatchError(f"Move to {target_shown}: the file already exists")
            plan.after[path] = None
            plan.after[target] = new_text.encode("utf-8")
            if target != path:
                plan.moves[target] = path
            report.append(f"M {target_shown} (moved from {shown})")
    return plan, report


_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "patchText": {
            "type": "string",
            "description": "The whole patch, from '*** Begin Patch' to '*** End Patch'.",
        }
    },
    "required": ["patchText"],
}


class ApplyPatchTool(ActingTool):
    """Apply a multi-file patch atomically, once approved: every file changes, or none does."""

    name = "apply_patch"
    description = (
        "Add, update, move and delete files with one patch:\n"
        "*** Begin Patch\n"
        "*** Add File: new.txt\n+line\n"
        "*** Update File: src/app.py\n*** Move to: src/main.py   (optional)\n"
        "@@ def handler():\n context line\n-removed line\n+added line\n"
        "*** Delete File: old.txt\n"
        "*** End Patch\n"
        "Context (' ') and removed ('-') lines must match the file. If any hunk does not "
        "match, no file is changed."
    )
    input_schema = _SCHEMA

    async def execute(self, args: dict[str, Any], ctx: ToolContext | None = None) -> ToolResult:
        try:
            patch = required_str(args, "patchText")
        except ArgumentError as exc:
            return ToolResult.error(f"apply_patch: {exc}")
        decision = self.approval.decide(self.name, args, ctx)
        if isinstance(decision, ToolResult):
            return decision
        return await anyio.to_thread.run_sync(self._apply, args, patch, decision)

    def _apply(self, args: dict[str, Any], patch: str, decision: Decision) -> ToolResult:
        try:
            ops = parse_patch(patch)
            with MUTATION_LOCK:
                plan, report = _plan(self.workspace, ops)
                if decision.needs_preview:
                    stop = decision.check(self.name, args, plan.preview(report))
                    if stop is not None:
                        return stop
                plan.commit()
        except ValueError as exc:
            return ToolResult.error(f"apply_patch: {exc}\nNo file was changed.")
        except _PartialWrite as exc:
            return ToolResult.error(f"apply_patch: {exc}")
        return ToolResult.ok("Applied the patch:\n" + "\n".join(report), {"changes": report})
