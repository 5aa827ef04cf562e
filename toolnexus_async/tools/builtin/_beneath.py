"""Acting on a path beneath a directory without a symlink leading out of it, even in a race.

Rules of this module:

- Every call starts from a descriptor of ``root`` and walks the path one component at a
  time with ``dir_fd``: directories are opened with ``O_DIRECTORY | O_NOFOLLOW``, the last
  component is acted on relative to its directory's descriptor (opened with ``O_NOFOLLOW``,
  stat'ed, created or unlinked there). The kernel never follows a symlink for us, so a
  symlink swapped in after some earlier check is met here, as a symlink, and judged.
- A symlink met on the way is followed by hand when it stays beneath ``root``: its target
  is read (``readlink`` on the directory's descriptor) and the walk goes on from the
  directory holding the link (relative target) or from ``root`` (absolute target, taken
  relative to ``root``'s real path). ``..`` goes back to the descriptor already held for the
  parent, never through the file system, and ``..`` at ``root`` is an escape. An escape
  raises :class:`ConfinementError` saying a symlink leads out. At most :data:`MAX_LINKS`
  links are followed per call (``ELOOP`` beyond), which also bounds a racer that keeps
  swapping.
- What is opened is therefore always in ``root``'s subtree as the walk saw it. A directory
  moved out of the tree by another process while the walk holds it is not detected (the
  same is true of ``openat2(RESOLVE_BENEATH)``, except for ``..``).
- :data:`SUPPORTED` says whether the platform has what this needs (``dir_fd`` for open,
  stat, mkdir, unlink and readlink, ``O_NOFOLLOW``, ``O_DIRECTORY``, ``scandir`` of a
  descriptor). Callers fall back to plain paths where it is False, checked then used (the
  documented limitation); nothing here is imported conditionally.
- Every descriptor opened here is closed before the call returns, except the one it
  returns.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ..._core.errors import ConfinementError

__all__ = (
    "MAX_LINKS",
    "SUPPORTED",
    "open_beneath",
    "stat_beneath",
    "unlink_beneath",
)

MAX_LINKS = 40  # Linux's own bound on the links one lookup follows
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC

SUPPORTED = (
    bool(_O_NOFOLLOW and _O_DIRECTORY)
    and {os.open, os.stat, os.mkdir, os.unlink, os.readlink} <= os.supports_dir_fd
    and os.scandir in os.supports_fd
)

_T = TypeVar("_T")


class _Walk:
    """The descriptors of the directories from ``root`` down to where the walk stands, and
    the components still to walk."""

    def __init__(self, root: Path, relative: Path, shown: str) -> None:
        self.root = root
        self.shown = shown
        self.links = 0
        self.todo = list(reversed(relative.parts))  # the next component last
        self.fds = [os.open(root, _DIR_FLAGS & ~_O_NOFOLLOW)]

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()

    def _escape(self) -> ConfinementError:
        return ConfinementError(self.shown, self.root, "follows a symlink out of")

    def follow(self, name: str) -> None:
        """``name``, in the current directory, is a symlink: walk its target next. If it is
        no longer a link (swapped back), walk ``name`` again; either way it counts."""
        self.links += 1
        if self.links > MAX_LINKS:
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), self.shown)
        try:
            target = os.readlink(name, dir_fd=self.fds[-1])
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            self.todo.append(name)
            return
        if os.path.isabs(target):
            # Taken relative to the root's real path; spelled through another name of the
            # root (a link to it), it is resolved once here and the walk checks the rest.
            real = Path(os.path.realpath(target))
            if not real.is_relative_to(self.root):
                raise self._escape()
            for fd in self.fds[1:]:
                os.close(fd)
            del self.fds[1:]
            target = str(real.relative_to(self.root))
        self.todo.extend(reversed(Path(target).parts))

    def descend(self, *, make: bool = False) -> tuple[int, str]:
        """Walk every component but the last; the last one's directory and name.

        ``make`` creates missing directories on the way (mode 0o777 less the umask).
        """
        while True:
            name = self.todo.pop() if self.todo else "."
            if name == "..":
                if len(self.fds) == 1:
                    raise self._escape()
                os.close(self.fds.pop())
                continue
            if name == "." and self.todo:
                continue
            if not self.todo:
                return self.fds[-1], name
            self._enter(name, make=make)

    def _enter(self, name: str, *, make: bool) -> None:
        parent = self.fds[-1]
        try:
            self.fds.append(os.open(name, _DIR_FLAGS, dir_fd=parent))
            return
        except FileNotFoundError:
            if not make:
                raise
            try:
                os.mkdir(name, 0o777, dir_fd=parent)
            except FileExistsError:
                pass  # made meanwhile, by someone else: entered (and judged) below
            self.todo.append(name)
        except OSError as exc:
            # O_DIRECTORY | O_NOFOLLOW on a symlink: ENOTDIR on Linux, ELOOP elsewhere.
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR) or not _is_link(name, parent):
                raise
            self.follow(name)


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _walk(
    root: Path,
    relative: Path,
    shown: str,
    act: Callable[[int, str], _T],
    *,
    make: bool = False,
    follow_last: bool = True,
) -> _T:
    """``act(dir_fd, name)`` on the last component of ``relative`` under ``root``.

    With ``follow_last``, ``act`` raising ``OSError(ELOOP)`` (what ``O_NOFOLLOW`` says of a
    symlink; ``ENOTDIR`` with ``O_DIRECTORY``) has the link followed and ``act`` called
    again. A name swapped back from a link meanwhile is simply tried again; both count
    towards :data:`MAX_LINKS`.
    """
    walk = _Walk(root, relative, shown)
    try:
        while True:
            dir_fd, name = walk.descend(make=make)
            try:
                return act(dir_fd, name)
            except OSError as exc:
                if not follow_last:
                    raise
                if exc.errno != errno.ELOOP:
                    if exc.errno != errno.ENOTDIR or not _is_link(name, dir_fd):
                        raise
            walk.follow(name)
    finally:
        walk.close()


def open_beneath(
    root: Path,
    relative: Path,
    flags: int,
    shown: str,
    *,
    mode: int = 0o666,
    make_parents: bool = False,
    check: Callable[[os.stat_result], None] | None = None,
    follow_last: bool = True,
) -> int:
    """A descriptor of ``root / relative``, opened with ``flags | O_NOFOLLOW``.

    ``check`` sees the ``lstat`` of the last component before it is opened (not called
    when it does not exist); ``make_parents`` creates missing directories; a last
    component that is a symlink is followed when it stays beneath ``root`` (unless
    ``follow_last`` is False: then opening it fails with ``ELOOP``, or ``ENOTDIR`` with
    ``O_DIRECTORY``).
    """

    def act(dir_fd: int, name: str) -> int:
        if check is not None:
            try:
                found = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                pass
            else:
                if stat.S_ISLNK(found.st_mode):
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), shown)
                check(found)
        return os.open(name, flags | _O_NOFOLLOW | _O_CLOEXEC, mode, dir_fd=dir_fd)

    return _walk(root, relative, shown, act, make=make_parents, follow_last=follow_last)


def stat_beneath(root: Path, relative: Path, shown: str) -> os.stat_result:
    """What ``root / relative`` is, a symlink staying beneath ``root`` followed."""

    def act(dir_fd: int, name: str) -> os.stat_result:
        found = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISLNK(found.st_mode):
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), shown)
        return found

    return _walk(root, relative, shown, act)


def unlink_beneath(root: Path, relative: Path, shown: str) -> None:
    """Remove the file ``root / relative`` (a symlink there is removed, not followed)."""
    _walk(root, relative, shown, lambda dir_fd, name: os.unlink(name, dir_fd=dir_fd))
