"""Skills as a tool source: the ``skill`` tool, and the catalogue for the system prompt.

Rule of this module: a :class:`SkillTools` offers one tool and one piece of instructions,
both from the :class:`SkillSet` it was given, and nothing when that set is empty. It
opens nothing (the skills were read when the set was loaded), so a toolkit can take it
before it is entered.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Self

from .._core.errors import UsageError
from .._core.types import Tool
from ._skills import SkillSet
from ._tool import SkillTool

__all__ = ("SkillTools",)


class SkillTools:
    """A tool source of skills: compose it into a toolkit, or pass ``skills=`` to
    ``Toolkit.create``."""

    def __init__(self, skills: SkillSet) -> None:
        if not isinstance(skills, SkillSet):
            raise UsageError(
                f"SkillTools takes a SkillSet (SkillSet.load(folders)), got {type(skills).__name__}"
            )
        self.skills = skills
        self._tools: tuple[Tool, ...] = (SkillTool(skills),) if skills.skills else ()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    def tools(self) -> Sequence[Tool]:
        return self._tools

    def instructions(self) -> str | None:
        """The skills' catalogue for the system prompt (None without skills)."""
        return self.skills.catalogue()

    def __repr__(self) -> str:
        return f"<SkillTools {', '.join(self.skills.names) or 'none'}>"
