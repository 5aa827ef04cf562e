"""The built-in tools that :meth:`Toolkit.create` adds unless told otherwise.

Rule of this package: every built-in is an ordinary tool (source ``"builtin"``), async, and
never blocks the event loop; file work goes through a :class:`Workspace`, HTTP through the
toolkit's one shared session. ``BUILTIN_NAMES`` is the whole set, in the order the toolnexus
ports list it.
"""

from __future__ import annotations

from ..._types import Tool
from .._session import SharedSession
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
    "BUILTIN_NAMES",
    "ApplyPatchTool",
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


def builtin_tools(workspace: Workspace, session: SharedSession) -> list[Tool]:
    """A fresh instance of every built-in, in ``BUILTIN_NAMES`` order."""
    return [
        BashTool(workspace),
        ReadTool(workspace),
        WriteTool(workspace),
        EditTool(workspace),
        GrepTool(workspace),
        GlobTool(workspace),
        WebFetchTool(session),
        ApplyPatchTool(workspace),
        TodoWriteTool(),
        QuestionTool(),
    ]
