"""The walk behind ``grep`` and ``glob``: every regular file under a path, in a fixed order.

Rules of this module:

- The walk runs in a worker thread, in a fixed (name-sorted) order, and checks for
  cancellation at every entry, so a call cancelled through an anyio cancel scope stops
  promptly instead of finishing the walk.
- The walk never follows a symlinked directory (no loops, no escapes) and skips version
  control directories (``.git``, ``.hg``, ``.svn``). Under confinement a symlinked file that
  leads out of the root is skipped as if absent, and each directory is opened and listed
  through the workspace's root descriptor (:mod:`._beneath`): one swapped for a symlink
  after its parent was listed is skipped, never listed through the link.
- Only regular files are yielded: FIFOs, devices and sockets met on the walk are skipped.
- A directory that cannot be listed (unreadable, vanished or swapped) is skipped: a search
  shows what it can reach.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import anyio.from_thread

from ._beneath import SUPPORTED, open_beneath
from ._workspace import Workspace

_SKIP_DIRS = frozenset({".git", ".hg", ".svn"})


class _Entry(NamedTuple):
    """What the walk needs of a directory entry, taken while its listing is open: a listing
    of a descriptor answers ``is_file()`` through that descriptor, closed with it."""

    name: str
    is_dir: bool
    is_link: bool
    is_file: bool


def _list(workspace: Workspace, directory: Path) -> list[_Entry]:
    """The entries of ``directory`` in name order; OSError if it cannot be listed."""
    within = workspace.within
    if within is None or not SUPPORTED:
        with os.scandir(directory) as scan:
            entries = [_entry(entry) for entry in scan]
    else:
        fd = open_beneath(
            within,
            directory.relative_to(within),
            os.O_RDONLY | os.O_DIRECTORY,
            workspace.display(directory),
            follow_last=False,
        )
        try:
            with os.scandir(fd) as scan:
                entries = [_entry(entry) for entry in scan]
        finally:
            os.close(fd)
    return sorted(entries, key=lambda entry: entry.name)


def _entry(entry: os.DirEntry[str]) -> _Entry:
    return _Entry(
        entry.name,
        entry.is_dir(follow_symlinks=False),
        entry.is_symlink(),
        entry.is_file(follow_symlinks=False),
    )


def _files(workspace: Workspace, base: Path) -> Iterator[Path]:
    """Every regular file under ``base`` (``base`` itself when it is a file), in walk order."""
    if not workspace.is_dir(base):
        yield base
        return
    stack = [base]
    while stack:
        anyio.from_thread.check_cancelled()
        directory = stack.pop()
        try:
            entries = _list(workspace, directory)
        except (OSError, ValueError):
            continue  # unreadable, vanished or swapped: a search shows what it can reach
        subdirs: list[Path] = []
        for entry in entries:
            anyio.from_thread.check_cancelled()
            path = directory / entry.name
            if entry.is_dir:
                if entry.name not in _SKIP_DIRS:
                    subdirs.append(path)
                continue
            if entry.is_link:
                try:
                    # Followed through the workspace: ConfinementError when it leads out.
                    if not stat.S_ISREG(workspace.stat(path).st_mode):
                        continue  # a directory (never followed), a FIFO, a device
                except (OSError, ValueError):
                    continue  # dangling, or leading out
            elif not entry.is_file:
                continue  # sockets, FIFOs, devices
            yield path
        stack.extend(reversed(subdirs))


def _base(workspace: Workspace, path: str | None) -> Path:
    base = workspace.resolve(path) if path else workspace.root
    if not workspace.exists(base):
        raise ValueError(f"path {path!r} does not exist")
    return base
