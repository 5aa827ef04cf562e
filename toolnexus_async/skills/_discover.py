"""Finding ``SKILL.md`` files under folders, safely.

Rules of this module:

- A folder holding a ``SKILL.md`` is a skill; its subfolders are that skill's files, not
  more skills. Other folders are searched recursively, in name order, so the same tree
  always gives the same skills in the same order.
- ``.git`` and ``node_modules`` are never entered. A symlinked folder is followed once:
  each real folder (device and inode) is visited at most once, so a symlink loop ends.
- The search is bounded (``MAX_DEPTH`` levels, ``MAX_FOLDERS`` folders, ``MAX_SKILL_BYTES``
  per ``SKILL.md``): a huge or hostile tree costs a bounded walk, and what was left out is
  reported, never silently dropped.
- What cannot be read is reported with its reason (:class:`Found` with ``error``), never
  raised: one broken skill does not stop the others loading.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

__all__ = ("MAX_DEPTH", "MAX_FOLDERS", "MAX_SKILL_BYTES", "Found", "find_skill_files")

SKILL_FILE = "SKILL.md"
NEVER_ENTERED = frozenset({".git", "node_modules"})
MAX_DEPTH = 16
MAX_FOLDERS = 10_000
MAX_SKILL_BYTES = 1 << 20


class Found(NamedTuple):
    """A ``SKILL.md`` found (its path, and its text), or why it could not be read."""

    path: Path
    text: str | None
    error: str | None = None


def find_skill_files(root: Path) -> Iterator[Found]:
    """Each ``SKILL.md`` under ``root`` (``root`` itself may be a skill's folder)."""
    seen: set[tuple[int, int]] = set()
    folders = 0
    stack: list[tuple[Path, int]] = [(root, 0)]
    while stack:
        folder, depth = stack.pop()
        try:
            info = folder.stat()
        except OSError as exc:
            yield Found(folder, None, f"unreadable folder: {exc.strerror or exc}")
            continue
        if (info.st_dev, info.st_ino) in seen:
            continue  # a symlink back to a folder already searched
        seen.add((info.st_dev, info.st_ino))
        folders += 1
        if folders > MAX_FOLDERS:
            yield Found(folder, None, f"not searched: more than {MAX_FOLDERS} folders")
            return
        skill = folder / SKILL_FILE
        if skill.is_file():
            yield _read(skill)
            continue
        if os.path.lexists(skill):  # a dangling symlink, a folder, a FIFO: not a skill
            yield Found(skill, None, "unreadable: not a regular file")
            continue
        try:
            with os.scandir(folder) as entries:
                subfolders = sorted(
                    Path(entry.path)
                    for entry in entries
                    if entry.name not in NEVER_ENTERED and entry.is_dir(follow_symlinks=True)
                )
        except OSError as exc:
            yield Found(folder, None, f"unreadable folder: {exc.strerror or exc}")
            continue
        if subfolders and depth >= MAX_DEPTH:
            yield Found(folder, None, f"not searched: deeper than {MAX_DEPTH} folders")
            continue
        stack.extend((sub, depth + 1) for sub in reversed(subfolders))


def _read(path: Path) -> Found:
    try:
        with path.open("rb") as stream:
            data = stream.read(MAX_SKILL_BYTES + 1)
    except OSError as exc:
        return Found(path, None, f"unreadable: {exc.strerror or exc}")
    if len(data) > MAX_SKILL_BYTES:
        return Found(path, None, f"too large: more than {MAX_SKILL_BYTES} bytes")
    try:
        return Found(path, data.decode("utf-8"))
    except UnicodeDecodeError:
        return Found(path, None, "unreadable: not UTF-8 text")
