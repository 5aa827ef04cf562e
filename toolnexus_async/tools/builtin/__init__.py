"""The built-in tools that :meth:`Toolkit.create` adds unless told otherwise.

``BUILTIN_NAMES`` is the whole family's set, so that ``builtins={"tools": {"bash": False}}``
is accepted for every name the toolnexus ports share; :func:`builtin_tools` returns the ones
this release implements.
"""

from __future__ import annotations

from ..._types import Tool
from .question import QuestionTool

__all__ = ("BUILTIN_NAMES", "QuestionTool", "builtin_tools")

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


def builtin_tools() -> list[Tool]:
    """A fresh instance of every implemented built-in."""
    return [QuestionTool()]
