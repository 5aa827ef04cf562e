"""Skills, the set an agent is given, and what the model is told of them.

Rules of this module:

- A :class:`SkillSet` is loaded once, from folders (searched by :mod:`._discover`) and
  skills given as data, in the order given; the first skill of a name wins and each later
  one is skipped as a duplicate. Every skip keeps its reason (:attr:`SkillSet.skipped`).
- ``allow`` and ``deny`` name skills; a name that is not among those found is refused with
  :class:`UsageError` when the set is made (fail closed, as every allow-list here), so a
  typo never quietly lets every skill through or keeps one out.
- The model sees names and descriptions up front (:meth:`SkillSet.catalogue`, only when
  there are skills) and a skill's instructions only when it asks (the ``skill`` tool).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from .._core.errors import UsageError
from ._discover import find_skill_files
from ._format import SkillFormatError, check_description, check_name, split_front_matter

__all__ = ("Skill", "SkillSet", "Skipped")


@attrs.frozen
class Skill:
    """One skill: its name, when to use it, its instructions and (for a folder's skill)
    the folder its files are in.

    ``metadata`` holds the front matter's other keys (``license``, ``allowed-tools``, ...)
    as they were written; nothing here acts on them.
    """

    name: str
    description: str
    instructions: str
    base_dir: Path | None = None
    metadata: Mapping[str, Any] = attrs.field(factory=dict, repr=False)

    def __attrs_post_init__(self) -> None:
        check_name(self.name, None)
        check_description(self.description)

    @classmethod
    def from_text(cls, text: str, *, base_dir: str | os.PathLike[str] | None = None) -> Skill:
        """The skill a ``SKILL.md``'s text describes; with ``base_dir``, its name must be
        that folder's name.

        Raises:
            SkillFormatError: the text is not a skill (the message says why).
        """
        folder = Path(base_dir) if base_dir is not None else None
        front, body = split_front_matter(text)
        name = check_name(front.get("name"), folder.name if folder is not None else None)
        description = check_description(front.get("description"))
        rest = {k: v for k, v in front.items() if k not in ("name", "description")}
        return cls(name, description, body, folder, rest)


@attrs.frozen
class Skipped:
    """Something that was not loaded as a skill, and why."""

    where: str
    reason: str


@attrs.frozen
class SkillSet:
    """The skills an agent may use, and an inventory of what was skipped.

    Build one with :meth:`load`; pass it (or the folders) to ``Toolkit.create(skills=...)``.
    """

    skills: tuple[Skill, ...] = ()
    skipped: tuple[Skipped, ...] = ()

    @classmethod
    def load(
        cls,
        sources: Iterable[str | os.PathLike[str] | Skill],
        *,
        allow: Iterable[str] | None = None,
        deny: Iterable[str] = (),
    ) -> SkillSet:
        """Search folders for ``SKILL.md`` files and take skills given as data.

        Reads the file system when called (at start-up, not per request). A folder that
        does not exist is reported in ``skipped``, as is each ``SKILL.md`` that is
        unreadable, malformed, nameless or a duplicate.

        Raises:
            UsageError: ``allow`` or ``deny`` names a skill that was not found, or a
                source is neither a path nor a :class:`Skill`.
        """
        if isinstance(sources, str | os.PathLike | Skill):
            sources = [sources]
        skills: dict[str, Skill] = {}
        where: dict[str, str] = {}
        skipped: list[Skipped] = []

        def take(skill: Skill, place: str) -> None:
            if skill.name in skills:
                skipped.append(
                    Skipped(place, f"duplicate of {skill.name!r} at {where[skill.name]}")
                )
            else:
                skills[skill.name] = skill
                where[skill.name] = place

        for source in sources:
            if isinstance(source, Skill):
                take(source, f"<skill {source.name!r} given as data>")
                continue
            if not isinstance(source, str | os.PathLike):
                raise UsageError(
                    f"skills: a folder or a Skill expected, got {type(source).__name__}"
                )
            root = Path(source).expanduser()
            if not root.is_dir():
                skipped.append(Skipped(str(root), "not a folder"))
                continue
            for found in find_skill_files(root):
                place = str(found.path)
                if found.text is None:
                    skipped.append(Skipped(place, found.error or "unreadable"))
                    continue
                try:
                    skill = Skill.from_text(found.text, base_dir=found.path.parent)
                except SkillFormatError as exc:
                    skipped.append(Skipped(place, str(exc)))
                    continue
                take(skill, place)
        return cls(tuple(skills.values()), tuple(skipped)).only(allow=allow, deny=deny)

    def only(self, *, allow: Iterable[str] | None = None, deny: Iterable[str] = ()) -> SkillSet:
        """The skills ``allow`` names (all when None) less those ``deny`` names.

        Raises:
            UsageError: a name in ``allow`` or ``deny`` is not one of these skills.
        """
        allowed = None if allow is None else _names(allow, "allow")
        denied = _names(deny, "deny")
        known = {skill.name for skill in self.skills}
        unknown = sorted(((allowed or set()) | denied) - known)
        if unknown:
            have = ", ".join(sorted(known)) or "none"
            raise UsageError(
                f"skills: unknown skill name(s) {', '.join(map(repr, unknown))} "
                f"in allow/deny (the skills found: {have})"
            )
        kept = tuple(
            skill
            for skill in self.skills
            if (allowed is None or skill.name in allowed) and skill.name not in denied
        )
        return attrs.evolve(self, skills=kept)

    def get(self, name: str) -> Skill | None:
        """The skill of that name, or None."""
        return next((skill for skill in self.skills if skill.name == name), None)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(skill.name for skill in self.skills)

    def catalogue(self) -> str | None:
        """What the system prompt says of these skills: each name and description, and
        how to load one; None when there are none (nothing is added then)."""
        if not self.skills:
            return None
        lines = "\n".join(f"- {skill.name}: {skill.description}" for skill in self.skills)
        return (
            "Skills are available: folders of instructions for particular tasks. When a "
            "task matches a skill's description, call the `skill` tool with its name to "
            "load its instructions, and follow them; load only the skills the task needs.\n"
            f"Available skills:\n{lines}"
        )

    def __len__(self) -> int:
        return len(self.skills)


def _names(given: Iterable[str], what: str) -> set[str]:
    if isinstance(given, str):
        raise UsageError(f"skills: {what} takes a list of names, got the string {given!r}")
    names = set(given)
    bad = [name for name in names if not isinstance(name, str)]
    if bad:
        raise UsageError(f"skills: {what} takes names (str), got {type(bad[0]).__name__}")
    return names
