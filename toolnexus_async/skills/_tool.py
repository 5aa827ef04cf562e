"""The ``skill`` tool: a skill's instructions when the model asks, and its files.

Rules of this module:

- Called with a skill's name, it answers that skill's instructions, its base folder and a
  bounded list of its files (``MAX_LISTED``, in path order, ``.git`` and ``node_modules``
  left out); called with ``file`` too, it reads that file.
- A skill's file is read by the built-in ``read`` tool rooted at the skill's folder, so
  the workspace rule applies there as everywhere: ``..``, absolute paths and symlinks
  leading out of the folder are refused. A skill never runs anything: its scripts run
  only through the acting tools (``bash``), which ask a person first like any command.
- An unknown name or a bad argument is an error result naming what is there, never an
  exception.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio.to_thread

from .._core.types import ToolContext, ToolResult
from ..tools.builtin._workspace import Workspace
from ..tools.builtin.files import ReadTool
from ._discover import NEVER_ENTERED, SKILL_FILE
from ._skills import Skill, SkillSet

__all__ = ("MAX_LISTED", "SkillTool")

MAX_LISTED = 50


class SkillTool:
    """Loads a skill's instructions on demand (one tool for every skill of a set)."""

    name = "skill"
    source = "skills"

    def __init__(self, skills: SkillSet) -> None:
        self.skills = skills
        self.description = (
            "Load a skill: its instructions, its folder and a list of its files. Call it "
            "with a skill's name when a task matches the skill's description (the skills "
            "are listed in your instructions). With 'file' (a path inside the skill's "
            "folder, as listed), read that file instead; 'offset' and 'limit' page "
            "through it as with 'read'."
        )
        self.input_schema: dict[str, Any] = {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": list(skills.names)},
                "file": {"type": "string", "description": "A file of the skill to read."},
                "offset": {"type": "integer", "minimum": 1},
                "limit": {"type": "integer", "minimum": 1},
            },
            "required": ["name"],
            "additionalProperties": False,
        }

    async def execute(self, args: dict[str, Any], ctx: ToolContext | None = None) -> ToolResult:
        name = args.get("name")
        skill = self.skills.get(name) if isinstance(name, str) else None
        if skill is None:
            have = ", ".join(self.skills.names) or "none"
            return ToolResult.error(f"skill: no skill named {name!r} (available: {have})")
        given = args.get("file")
        if given is None:
            listed = await anyio.to_thread.run_sync(_sample, skill.base_dir)
            return ToolResult.ok(_loaded(skill, listed), {"skill": skill.name})
        if not isinstance(given, str):
            return ToolResult.error("skill: 'file' must be a path (text)")
        if skill.base_dir is None:
            return ToolResult.error(f"skill: {skill.name!r} was given as data; it has no files")
        reader = ReadTool(Workspace(skill.base_dir))
        read: dict[str, Any] = {"path": given}
        read.update((k, args[k]) for k in ("offset", "limit") if k in args)
        result = await reader.execute(read, ctx)
        if result.is_error:
            return ToolResult.error(f"skill {skill.name}: {result.output}")
        return result


def _loaded(skill: Skill, listed: tuple[list[str], int]) -> str:
    parts = [f"Skill {skill.name!r} loaded. Follow these instructions for the task."]
    if skill.base_dir is not None:
        parts.append(
            f"Its folder: {skill.base_dir} (paths in the instructions are relative to it)."
        )
    parts.append(f"\n{skill.instructions}\n")
    files, total = listed
    if files:
        shown = f"{len(files)} of {total}" if total > len(files) else str(total)
        parts.append(f"Files of this skill ({shown}; read one with file=...):")
        parts.extend(f"- {path}" for path in files)
    return "\n".join(parts)


def _sample(base: Path | None) -> tuple[list[str], int]:
    """The first ``MAX_LISTED`` files under ``base`` in path order, and how many there are
    (symlinks are listed, not followed)."""
    if base is None:
        return [], 0
    files: list[str] = []
    for folder, subfolders, names in os.walk(base):
        subfolders[:] = sorted(d for d in subfolders if d not in NEVER_ENTERED)
        here = Path(folder).relative_to(base)
        files.extend((here / name).as_posix() for name in names if here.parts or name != SKILL_FILE)
        if len(files) > 10 * MAX_LISTED:
            break  # enough to say "and more" without walking a huge tree
    files.sort()
    return files[:MAX_LISTED], len(files)
