"""The built-in tools that :meth:`Toolkit.create` adds unless told otherwise.

Rules of this package:

- Every built-in is an ordinary tool (source ``"builtin"``), async, and never blocks the
  event loop; file work goes through a :class:`Workspace`, HTTP through the toolkit's one
  shared session. ``BUILTIN_NAMES`` is the whole set, in the order the toolnexus ports list
  it.
- Safe by default, with the whole set on: the built-ins that act (``bash``, ``write``,
  ``edit``, ``apply_patch``: :data:`ACTING_NAMES`) ask for approval before they act, as
  their ``approve`` policy says (:mod:`._approval`); the others only read or ask the user.
  The workspace is confined by default, and the file tools open regular files only.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..._core.types import Tool
from .._session import SharedSession
from ._approval import ApprovalPolicy, check_policy
from ._regular import SpecialFileError
from ._workspace import ConfinementError, Workspace
from .apply_patch import ApplyPatchTool
from .bash import BashTool
from .files import EditTool, ReadTool, WriteTool
from .question import QuestionTool
from .search import GlobTool, GrepTool
from .todowrite import TodoWriteTool
from .webfetch import WebFetchTool

__all__ = (
    "ACTING_NAMES",
    "BUILTIN_NAMES",
    "ApplyPatchTool",
    "ApprovalPolicy",
    "BashTool",
    "ConfinementError",
    "EditTool",
    "GlobTool",
    "GrepTool",
    "QuestionTool",
    "ReadTool",
    "SpecialFileError",
    "TodoWriteTool",
    "WebFetchTool",
    "Workspace",
    "WriteTool",
    "builtin_tools",
    "check_policy",
)

BUILTIN_NAMES: tuple[str, ...] = (
    "bash",
    "read",
    "write",
    "edit",
    "grep",
    "glob",
    "webfetch",
    "apply_patch",
    "todowrite",
    "question",
)


# The built-ins that change the machine or run code, and so ask first.
ACTING_NAMES: tuple[str, ...] = ("bash", "write", "edit", "apply_patch")


def builtin_tools(
    workspace: Workspace,
    session: SharedSession,
    *,
    approve: ApprovalPolicy = "ask",
    allow_hosts: Iterable[str] = (),
) -> list[Tool]:
    """A fresh instance of every built-in, in ``BUILTIN_NAMES`` order; the acting ones
    (``ACTING_NAMES``) get the ``approve`` policy, ``webfetch`` the ``allow_hosts``."""
    return [
        BashTool(workspace, approve=approve),
        ReadTool(workspace),
        WriteTool(workspace, approve=approve),
        EditTool(workspace, approve=approve),
        GrepTool(workspace),
        GlobTool(workspace),
        WebFetchTool(session, allow_hosts=allow_hosts),
        ApplyPatchTool(workspace, approve=approve),
        TodoWriteTool(),
        QuestionTool(),
    ]
