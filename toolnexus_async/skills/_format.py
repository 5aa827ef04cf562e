"""What a ``SKILL.md`` says: its YAML front matter and its body, checked.

Rules of this module (the Agent Skills format, agentskills.io):

- A ``SKILL.md`` opens with front matter: a line ``---``, YAML, a line ``---``; the rest is
  the body, the instructions an agent loads when the skill is used.
- The YAML is read with a real parser's safe loader (no tags, no objects) and must be a
  mapping. ``name`` (1 to 64 lowercase letters, digits and single hyphens, neither first
  nor last) and ``description`` (1 to 1,024 characters) are required; a folder's skill is
  named as its folder.
- Anything wrong is a :class:`SkillFormatError` whose message is the reason a skill is
  skipped, shown to the person who keeps the skills; it never stops the others loading.

Pure: text in, values or an error out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import yaml

__all__ = ("SkillFormatError", "check_description", "check_name", "split_front_matter")

MAX_NAME = 64
MAX_DESCRIPTION = 1024
_NAME = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
_FENCE = re.compile(r"\A---[ \t]*\r?\n(.*?)^---[ \t]*(?:\r?\n|\Z)", re.S | re.M)


class SkillFormatError(ValueError):
    """A ``SKILL.md`` (or a skill given as data) that cannot be a skill; the message says why."""


def split_front_matter(text: str) -> tuple[Mapping[str, Any], str]:
    """The front matter (a mapping) and the body of a ``SKILL.md``."""
    text = text.removeprefix("\ufeff")
    found = _FENCE.match(text)
    if found is None:
        raise SkillFormatError("no front matter: SKILL.md must open with a '---' line")
    try:
        front = yaml.safe_load(found.group(1))
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" (line {where.line + 2})" if where is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise SkillFormatError(f"malformed front matter{line}: {problem}") from None
    if not isinstance(front, dict):
        raise SkillFormatError(
            f"malformed front matter: a mapping of keys expected, got {type(front).__name__}"
        )
    return front, text[found.end() :].strip("\r\n")


def check_name(name: object, folder: str | None) -> str:
    """``name`` if it is a valid skill name (and, for a folder's skill, the folder's name)."""
    if name is None or name == "":
        raise SkillFormatError("no name: the front matter needs 'name'")
    if not isinstance(name, str):
        raise SkillFormatError(f"name must be text, got {type(name).__name__}")
    if len(name) > MAX_NAME or _NAME.fullmatch(name) is None:
        raise SkillFormatError(
            f"name {name!r} is not a skill name: 1 to {MAX_NAME} lowercase letters, digits "
            "and single hyphens, neither first nor last"
        )
    if folder is not None and name != folder:
        raise SkillFormatError(f"name {name!r} is not its folder's name {folder!r}")
    return name


def check_description(description: object) -> str:
    """``description`` if it is one: the text that tells an agent when to use the skill."""
    if not isinstance(description, str) or not description.strip():
        raise SkillFormatError("no description: the front matter needs 'description'")
    if len(description) > MAX_DESCRIPTION:
        raise SkillFormatError(
            f"description has {len(description)} characters, more than {MAX_DESCRIPTION}"
        )
    return description.strip()
