"""Where the built-in tools may act, and how they read their arguments.

Rules of this module:

- Every path a built-in touches goes through :meth:`Workspace.resolve` (or
  :meth:`Workspace.resolve_dir`). With ``confine=True``, the default, the answer is always
  the real path of something under ``root``: ``..`` escapes, absolute paths elsewhere and
  symlinks leading out (at any point of the path, the last component included) raise
  :class:`ConfinementError` instead. Resolution reads the file system (symlinks), so tools
  call it from a worker thread, never on the event loop.
- That answer is a check, and names the file for the model; the file tools then *use* the
  path only through :attr:`Workspace.within` (handed to :mod:`._regular`) and the
  workspace's own :meth:`~Workspace.stat`, :meth:`~Workspace.is_dir`,
  :meth:`~Workspace.exists` and :meth:`~Workspace.unlink`. Confined, these walk the path
  from a descriptor of the root without following a symlink out of it (:mod:`._beneath`),
  so a symlink swapped in between the check and the use is refused, not followed. Where
  the platform lacks ``dir_fd`` and ``O_NOFOLLOW`` (:data:`._beneath.SUPPORTED` is False)
  they use the path as checked, and such a race is not stopped.
- Confined is the default here as in ``Toolkit.create``: a tool built without a workspace
  stays in the current directory; ``Workspace(root, confine=False)`` lets paths lead
  anywhere, and every use is by plain path.

Confinement covers the file tools, not ``bash``: its working directory is checked, then
handed to the new process by path, and the command can reach anything the user running it
can.

The argument helpers raise :class:`ArgumentError` naming the field; every built-in turns it
into an error result, so a malformed call never raises across ``execute``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from ..._core.errors import ConfinementError
from ._beneath import SUPPORTED, stat_beneath, unlink_beneath

__all__ = (
    "ArgumentError",
    "ConfinementError",
    "Workspace",
    "WorkspaceTool",
    "optional_bool",
    "optional_int",
    "optional_str",
    "required_str",
)


class ArgumentError(ValueError):
    """A tool argument is missing or of the wrong type; the message names the field."""


def _real_root(root: str | os.PathLike[str]) -> Path:
    # realpath, not Path.resolve: on Python 3.11 resolve() raises RuntimeError on symlink loops.
    return Path(os.path.realpath(os.path.abspath(root)))


def _realpath(candidate: str, given: str) -> str:
    # A link swapped for a file between realpath's lstat and its readlink makes it raise
    # (EINVAL on Python 3.11); looked at again, the path is what it has become.
    for _ in range(3):
        try:
            return os.path.realpath(candidate)
        except OSError:
            continue
    raise ValueError(f"path {given!r} kept changing while it was resolved; try again")


@attrs.frozen
class Workspace:
    """The directory the built-in tools work in, and whether they must stay inside it.

    ``Workspace()`` is the current directory, confined. Relative paths are taken relative
    to ``root``; ``root`` is stored absolute with its symlinks resolved.
    """

    root: Path = attrs.field(factory=Path.cwd, converter=_real_root)
    confine: bool = True

    def resolve(self, path: str) -> Path:
        """The real absolute path ``path`` names; :class:`ConfinementError` if it escapes.

        Raises ``ValueError`` for an empty path, one containing a NUL byte, or one that keeps
        changing while it is resolved.
        """
        if not path:
            raise ValueError("path is empty")
        if "\0" in path:
            raise ValueError(f"path {path!r} contains a NUL byte")
        candidate = os.path.join(self.root, path)  # an absolute ``path`` replaces the root
        real = Path(_realpath(candidate, path))
        if not self.confine or real.is_relative_to(self.root):
            return real
        # Tell the two kinds of escape apart: the text of the path itself leaves the root,
        # or it stays inside on paper and a symlink on the way leads out.
        if Path(os.path.normpath(candidate)).is_relative_to(self.root):
            why = "follows a symlink out of"
        elif os.path.isabs(path):
            why = "is an absolute path outside"
        else:
            why = "climbs out of"
        raise ConfinementError(path, self.root, why)

    def resolve_dir(self, path: str | None) -> Path:
        """The directory ``path`` names (``root`` when None or empty), checked to exist."""
        directory = self.root if not path else self.resolve(path)
        if not directory.is_dir():
            what = "does not exist" if not directory.exists() else "is not a directory"
            raise ValueError(f"directory {path!r} {what}")
        return directory

    @property
    def within(self) -> Path | None:
        """The root every use of a path must stay beneath: ``root`` when confined on a
        platform that can enforce it, else None (paths are used as given)."""
        return self.root if self.confine and SUPPORTED else None

    def stat(self, path: Path) -> os.stat_result:
        """What the resolved ``path`` is now, its symlinks followed (inside ``root`` only,
        when confined: :class:`ConfinementError` for one leading out)."""
        within = self.within
        if within is None:
            return os.stat(path)
        return stat_beneath(within, path.relative_to(within), self.display(path))

    def is_dir(self, path: Path) -> bool:
        """``path`` is a directory now (False when it is missing or leads out)."""
        try:
            return stat.S_ISDIR(self.stat(path).st_mode)
        except (OSError, ValueError):
            return False

    def exists(self, path: Path) -> bool:
        """Something is at ``path`` now (False when it leads out)."""
        try:
            self.stat(path)
        except (OSError, ValueError):
            return False
        return True

    def unlink(self, path: Path) -> None:
        """Remove the file ``path``; a symlink there is removed itself, never followed."""
        within = self.within
        if within is None:
            path.unlink()
        else:
            unlink_beneath(within, path.relative_to(within), self.display(path))

    def display(self, path: Path) -> str:
        """``path`` as the model should see it: relative to ``root`` when under it."""
        if path == self.root:
            return "."
        if path.is_relative_to(self.root):
            return path.relative_to(self.root).as_posix()
        return str(path)


class WorkspaceTool:
    """What the built-ins that work with files share: the workspace they work in, and their
    source. ``Workspace()`` (the current directory, confined) when none is given."""

    source = "builtin"

    def __init__(self, workspace: Workspace | None = None) -> None:
        self.workspace = workspace if workspace is not None else Workspace()


def _check_args(args: object) -> Mapping[str, Any]:
    if not isinstance(args, Mapping):
        raise ArgumentError(f"arguments must be a JSON object, got {type(args).__name__}")
    return args


def required_str(args: object, key: str, *, allow_empty: bool = False) -> str:
    """``args[key]`` as a string; :class:`ArgumentError` if missing, not a string or empty."""
    args = _check_args(args)
    if key not in args or args[key] is None:
        raise ArgumentError(f"'{key}' is required")
    value = args[key]
    if not isinstance(value, str):
        raise ArgumentError(f"'{key}' must be a string, got {type(value).__name__}")
    if not value and not allow_empty:
        raise ArgumentError(f"'{key}' must not be empty")
    return value


def optional_str(args: object, key: str) -> str | None:
    """``args[key]`` as a string, or None when absent, null or empty."""
    value = _check_args(args).get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ArgumentError(f"'{key}' must be a string, got {type(value).__name__}")
    return value or None


def optional_int(args: object, key: str, default: int, *, minimum: int = 1) -> int:
    """``args[key]`` as an integer of at least ``minimum``, or ``default`` when absent."""
    value = _check_args(args).get(key)
    if value is None:
        return default
    # JSON has one number type, so 5.0 is accepted as 5; a bool is not a number here.
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ArgumentError(f"'{key}' must be an integer, got {type(value).__name__}")
    if value < minimum:
        raise ArgumentError(f"'{key}' must be at least {minimum}, got {value}")
    return value


def optional_bool(args: object, key: str, default: bool) -> bool:
    """``args[key]`` as a bool, or ``default`` when absent."""
    value = _check_args(args).get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ArgumentError(f"'{key}' must be true or false, got {type(value).__name__}")
    return value
