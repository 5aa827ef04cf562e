"""Opening files for the built-ins: regular files only, never a FIFO, device or socket.

Rules of this module:

- The file tools open files only through :func:`open_regular`, :func:`read_regular` and
  :func:`write_regular`. Reading a FIFO would block a worker thread until someone writes to
  it (forever, for a FIFO nobody writes to), reading ``/dev/zero`` never ends, and writing
  to a device or a socket is not "changing a file". Such a path is refused with
  :class:`SpecialFileError`, whose message names the path (as shown to the model) and what
  it is.
- The authoritative check is ``fstat`` on the opened descriptor, so a path swapped for a
  FIFO between a check and the open cannot slip through. The open itself uses
  ``O_NONBLOCK`` (opening a FIFO never waits for the other end) and ``O_NOCTTY`` (a
  terminal never becomes our controlling terminal). A ``stat`` before the open refuses the
  obvious cases without opening them at all, since opening some devices has effects of its
  own (a tape rewinds, a watchdog arms).
- Given ``within`` (the root of a confined workspace, which ``path`` lies under), the path
  is opened through :mod:`._beneath`: component by component from a descriptor of the
  root, never following a symlink out of it, so a symlink swapped in after the workspace
  checked the path cannot lead the open outside. The ``stat`` before the open is then an
  ``lstat`` of the last component in its directory. Without ``within`` (``confine=False``,
  or a platform without ``dir_fd``) the path is opened as given.
- A directory raises :class:`IsADirectoryError`, as ``open`` would; callers already word it.
- Writes never truncate before the check: a regular file is truncated through its
  descriptor once it is known to be one. Writing creates missing parent directories
  (beneath ``within`` when given).
- Binary means a NUL byte among the first :data:`BINARY_PROBE` bytes (:func:`is_binary`),
  the one test every text tool uses.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

from ._beneath import SUPPORTED, open_beneath

__all__ = (
    "BINARY_PROBE",
    "SpecialFileError",
    "is_binary",
    "open_regular",
    "read_regular",
    "write_regular",
)

BINARY_PROBE = 8192
_COMMON = os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)


class SpecialFileError(ValueError):
    """The path is a FIFO, a device or a socket: the built-ins use regular files only."""


def is_binary(head: bytes) -> bool:
    """The cheap test every text tool uses: a NUL byte among the first bytes."""
    return b"\0" in head[:BINARY_PROBE]


def _kind(mode: int) -> str | None:
    """What a non-regular file is, in words; None for a regular file or a directory."""
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return "not a regular file"


def _refuse(mode: int, shown: str) -> None:
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "Is a directory", shown)
    kind = _kind(mode)
    if kind is not None:
        raise SpecialFileError(f"{shown} is {kind}, not a regular file; refusing to use it")


def open_regular(
    path: Path, shown: str, *, write: bool = False, within: Path | None = None
) -> BinaryIO:
    """``path`` opened for binary reading (or, with ``write``, emptied for writing).

    Writing creates a missing file (mode 0o666 less the umask, as ``open`` does) and its
    missing parents. ``within`` confines the open to that directory (see the module's
    rules; :class:`ConfinementError` for a symlink leading out). Raises
    :class:`SpecialFileError` for anything but a regular file, ``IsADirectoryError`` for a
    directory, and ``OSError`` as ``open`` would otherwise.
    """
    flags = _COMMON | (os.O_WRONLY | os.O_CREAT if write else os.O_RDONLY)
    try:
        if within is not None and SUPPORTED:
            fd = open_beneath(
                within,
                path.relative_to(within),
                flags,
                shown,
                make_parents=write,
                check=lambda found: _refuse(found.st_mode, shown),
            )
        else:
            fd = _open_path(path, shown, flags, write=write)
    except OSError as exc:
        # A FIFO without a reader, opened to write, or a socket: it was swapped in after
        # the stat before the open.
        if exc.errno == errno.ENXIO:
            raise SpecialFileError(
                f"{shown} is a FIFO or a socket, not a regular file; refusing to use it"
            ) from None
        raise
    try:
        _refuse(os.fstat(fd).st_mode, shown)
        os.set_blocking(fd, True)
        if write:
            os.ftruncate(fd, 0)
        return os.fdopen(fd, "wb" if write else "rb")
    except BaseException:
        os.close(fd)
        raise


def _open_path(path: Path, shown: str, flags: int, *, write: bool) -> int:
    try:
        _refuse(os.stat(path).st_mode, shown)
    except FileNotFoundError:
        if not write:
            raise
        path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, flags, 0o666)


def read_regular(path: Path, shown: str, *, within: Path | None = None) -> bytes:
    """The bytes of the regular file ``path`` (see :func:`open_regular`)."""
    with open_regular(path, shown, within=within) as stream:
        return stream.read()


def write_regular(path: Path, data: bytes, shown: str, *, within: Path | None = None) -> None:
    """Replace the content of the regular file ``path`` with ``data``, creating it (and its
    parents)."""
    with open_regular(path, shown, write=True, within=within) as stream:
        stream.write(data)
