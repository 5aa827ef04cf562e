"""Approval for the built-ins that act: ``bash``, ``write``, ``edit`` and ``apply_patch``.

Rules of this module:

- An acting built-in never acts unasked. Under the ``"ask"`` policy (the default) its first
  call suspends with ``ToolResult.pending(Request("", "approval", prompt, data))``, the
  package's own suspension, so ``wait_for``, the Inbox, halting and resuming all apply
  unchanged. ``data`` holds ``"tool"``, ``"arguments"``, what the call will run or change
  (``"command"`` and ``"workdir"``; ``"path"`` and ``"diff"``; ``"changes"`` and
  ``"diff"``) and ``"digest"``, a SHA-256 over exactly that.
- The tool acts only on the retry the suspension rule makes: with ``ctx.answer.ok`` and
  ``ctx.request`` being this tool's approval request for these very arguments. It then
  recomputes the preview and acts only when the digest is the one that was shown. A
  different digest (the file changed meanwhile) is an error result saying nothing was
  done; it does not ask again, since a retry that suspends again is "unresolved".
- An answer that is not ok is an error result; an answer without the matching request
  (e.g. a ``require_approval`` hook's approval, which the tool never asked for) is treated
  as no answer: the tool asks.
- ``"allow-all"`` lets every call run without asking (a sandbox, CI). A callable
  ``policy(tool_name, args)`` returning exactly ``True`` lets that call run; anything else,
  an exception included, means ask. It is called on the event loop: keep it quick.
"""

from __future__ import annotations

import difflib
import hashlib
import logging
import types
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeAlias

import attrs

from ..._core.errors import UsageError
from ..._core.types import Request, ToolContext, ToolResult
from ._regular import is_binary
from ._workspace import Workspace, WorkspaceTool

__all__ = (
    "ActingTool",
    "Approval",
    "ApprovalPolicy",
    "Decision",
    "Preview",
    "check_policy",
    "digest_of",
    "unified_diff",
)

log = logging.getLogger("toolnexus_async")

ApprovalPolicy: TypeAlias = Literal["ask", "allow-all"] | Callable[[str, Mapping[str, Any]], bool]

# How much of a diff the prompt shows; data["diff"] always holds all of it.
PROMPT_DIFF_LIMIT = 4000


def check_policy(approve: object) -> ApprovalPolicy:
    """``approve`` if it is a valid policy, else :class:`UsageError` naming the choices."""
    if approve == "ask" or approve == "allow-all" or callable(approve):
        return approve
    raise UsageError(
        f"approve must be 'ask', 'allow-all' or a callable (tool_name, args) -> bool, "
        f"got {approve!r}"
    )


def digest_of(*parts: bytes | str | None) -> str:
    """A SHA-256 over ``parts``, each length-prefixed so that no two lists collide."""
    sha = hashlib.sha256()
    for part in parts:
        if part is None:
            sha.update(b"-")
            continue
        data = part.encode("utf-8") if isinstance(part, str) else part
        sha.update(b"%d:" % len(data))
        sha.update(data)
    return "sha256:" + sha.hexdigest()


def _diff_name(shown: str, prefix: str) -> str:
    return shown if shown.startswith("/") else f"{prefix}/{shown}"


def _lines(data: bytes) -> list[str] | None:
    """The lines of ``data`` (ends kept), or None when it is not text."""
    if is_binary(data):
        return None
    try:
        return data.decode("utf-8").splitlines(keepends=True)
    except UnicodeDecodeError:
        return None


def unified_diff(before: bytes | None, after: bytes | None, old: str, new: str) -> str:
    """The unified diff from ``before`` to ``after`` (None: no file), as git writes one.

    ``old`` and ``new`` are the paths as shown; a missing side is ``/dev/null``. Binary
    content is described, not shown; a last line without a newline is marked as such.
    """
    old_name = "/dev/null" if before is None else _diff_name(old, "a")
    new_name = "/dev/null" if after is None else _diff_name(new, "b")
    header = f"--- {old_name}\n+++ {new_name}\n"
    old_lines = [] if before is None else _lines(before)
    new_lines = [] if after is None else _lines(after)
    if old_lines is None or new_lines is None:
        sizes = " -> ".join(f"{len(d)} bytes" for d in (before, after) if d is not None)
        return f"{header}Binary content ({sizes})\n"
    out = [
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
        for line in difflib.unified_diff(old_lines, new_lines, old_name, new_name)
    ]
    if out:
        return "".join(out)
    if before is None:
        return header + "(a new, empty file)\n"
    if after is None:
        return header + "(an empty file, deleted)\n"
    return header + "(the content stays the same)\n"


@attrs.frozen
class Preview:
    """What an acting call will do, as shown for approval.

    Attributes:
        prompt: the text for the person; long diffs are cut here, never in ``details``.
        details: the tool's own keys of ``Request.data`` (``"diff"``, ``"command"``, ...).
        digest: :func:`digest_of` everything the call depends on.
        subject: what changed when the digest differs on the retry ("notes.txt").
    """

    prompt: str
    details: dict[str, Any]
    digest: str
    subject: str

    def request(self, tool: str, args: Mapping[str, Any]) -> Request:
        data = {"tool": tool, "arguments": dict(args), **self.details, "digest": self.digest}
        return Request("", "approval", self.prompt, data=data)


def cut_for_prompt(diff: str) -> str:
    """``diff``, or its head with a note when it is too long for a readable prompt."""
    if len(diff) <= PROMPT_DIFF_LIMIT:
        return diff
    head = diff[:PROMPT_DIFF_LIMIT].rpartition("\n")[0]
    return f"{head}\n[... the diff goes on: {len(diff)} characters in all, see data['diff']]"


@attrs.frozen
class Decision:
    """What an acting call may do: ``"run"`` now, ``"ask"`` first, or ``"verify"`` that the
    preview still has the approved ``digest`` before it runs."""

    mode: Literal["run", "ask", "verify"]
    digest: str | None = None

    @property
    def needs_preview(self) -> bool:
        return self.mode != "run"

    def check(self, tool: str, args: Mapping[str, Any], preview: Preview) -> ToolResult | None:
        """None to go ahead; else the result to return instead of acting."""
        if self.mode == "run":
            return None
        if self.mode == "ask":
            return ToolResult.pending(preview.request(tool, args))
        if preview.digest == self.digest:
            return None
        return ToolResult.error(
            f"{tool}: {preview.subject} changed after the approval was asked, so what was "
            "approved is not what would happen now; nothing was done. Make the call again "
            "to be asked afresh."
        )


_RUN = Decision("run")
_ASK = Decision("ask")


class Approval:
    """One acting tool's policy, applied to each call (see the module rules)."""

    def __init__(self, approve: ApprovalPolicy = "ask") -> None:
        self.policy = check_policy(approve)

    def decide(
        self, tool: str, args: Mapping[str, Any], ctx: ToolContext | None
    ) -> Decision | ToolResult:
        """The decision for this call, or an error result when it was refused."""
        policy = self.policy
        if policy == "allow-all":
            return _RUN
        if callable(policy) and self._allows(policy, tool, args):
            return _RUN
        if ctx is None or ctx.answer is None:
            return _ASK
        if not ctx.answer.ok:
            return ToolResult.error(f"{tool}: the call was not approved; nothing was done")
        digest = _approved_digest(ctx, tool, args)
        return _ASK if digest is None else Decision("verify", digest)

    @staticmethod
    def _allows(
        policy: Callable[[str, Mapping[str, Any]], bool], tool: str, args: Mapping[str, Any]
    ) -> bool:
        try:
            return policy(tool, types.MappingProxyType(dict(args))) is True
        except Exception:
            log.exception("the approve policy raised for %r; asking instead", tool)
            return False


def _approved_digest(ctx: ToolContext, tool: str, args: Mapping[str, Any]) -> str | None:
    """The digest of the approval ``ctx`` answers, if it is this call's own request."""
    request, answer = ctx.request, ctx.answer
    if request is None or answer is None or request.id != answer.id:
        return None
    data = request.data
    if request.kind != "approval" or data is None or "gate" in data:
        return None
    if data.get("tool") != tool or data.get("arguments") != dict(args):
        return None
    digest = data.get("digest")
    return digest if isinstance(digest, str) else None


class ActingTool(WorkspaceTool):
    """A built-in that changes the machine or runs code: it works in a workspace and asks
    before it acts, as ``approve`` says (``"ask"`` by default)."""

    def __init__(self, workspace: Workspace | None = None, *, approve: ApprovalPolicy = "ask"):
        super().__init__(workspace)
        self.approval = Approval(approve)
