"""Agent Skills: folders of instructions an agent loads when a task needs them.

A skill is a folder with a ``SKILL.md``: YAML front matter naming the skill and saying when
to use it, then the instructions, and files beside it (references, scripts). The model is
told each skill's name and description up front; it loads a skill's instructions, and
reads its files, through the one ``skill`` tool when a task matches (progressive
disclosure, so the context stays small). ``Toolkit.create(skills=...)`` takes folders or a
:class:`SkillSet`; docs/skills.md shows the whole of it.
"""

from ._format import SkillFormatError
from ._skills import Skill, SkillSet, Skipped
from ._source import SkillTools
from ._tool import SkillTool

__all__ = ("Skill", "SkillFormatError", "SkillSet", "SkillTool", "SkillTools", "Skipped")
