"""Ending a ``bash`` command's whole process tree, daemons and ``setsid`` children included.

Rules of this module:

- On Linux the shell is made a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``, set by
  :func:`preexec_fn` between fork and exec; it survives the exec). A process of the tree
  whose parent exits (a double-forked daemon, ``setsid cmd &`` in a subshell) is then
  adopted by the shell instead of init, so the whole tree stays reachable by parent pid,
  whatever sessions and groups its members moved to.
- :func:`end_tree` first freezes, then kills: the shell's process group gets SIGSTOP at
  once, then every member found gets SIGSTOP, and the search is repeated until it finds no
  one new (a stopped process can neither fork nor exit, so the tree cannot change under the
  search). Only then does every member get SIGKILL, the deepest first and the shell last,
  and the group once more. A member is: the shell and its descendants (by parent pid in
  ``/proc``), any process of the shell's group, and any process holding the write end of
  the command's output pipe.
- The tree is searched from the shell only while it is alive: a reaped shell's pid may
  belong to someone else by then, and its orphans have moved to init anyway (the group and
  the pipe still find those that matter). This process is never a member, and neither is a
  process that only holds the pipe's read end (a sibling ``bash`` call forking at that
  moment inherits ours until its exec).
- :func:`wait_gone` blocks (in a worker thread) until no member is alive, zombies not
  counting, or until its limit.
- Without ``/proc`` (macOS, the BSDs) only the process group is signalled, as before: a
  member that left the group (``setsid``) survives. Without ``prctl`` (not Linux, or a
  kernel older than 3.4) descendants are still found while their parents live, but an
  orphan reparented to init is found only through the group or the pipe.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable

__all__ = ("end_tree", "pipe_id", "preexec_fn", "wait_gone")

_PR_SET_CHILD_SUBREAPER = 36
# A search that keeps finding new members (a fork bomb racing the SIGSTOPs) still ends.
_MAX_ROUNDS = 20
_GONE = (b"Z", b"X")


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


# Resolved once, in the parent: the child between fork and exec only calls it (no import, no
# symbol lookup, no lock another thread might have held at the fork).
_PRCTL = _load_prctl()


def _become_subreaper() -> None:
    assert _PRCTL is not None
    _PRCTL(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # a failure only loses the orphans' tracking


def preexec_fn() -> Callable[[], None] | None:
    """What to pass as ``preexec_fn`` when starting the shell (None where prctl is missing)."""
    return _become_subreaper if _PRCTL is not None else None


def pipe_id(fd: int) -> str | None:
    """How ``/proc/<pid>/fd`` names the pipe ``fd`` belongs to (``pipe:[inode]``)."""
    try:
        return f"pipe:[{os.fstat(fd).st_ino}]"
    except OSError:
        return None


# pid -> (ppid, pgrp, state)
_Table = dict[int, tuple[int, int, bytes]]


def _table() -> _Table | None:
    """Every process's parent, group and state, from /proc; None without /proc."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    table: _Table = {}
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat_file:
                stat = stat_file.read()
        except OSError:
            continue  # it exited while we looked
        # The command name, in parentheses, may itself hold ')' and spaces; the fields after
        # the last ')' are fixed: state, ppid, pgrp, ...
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2:
            table[int(name)] = (int(fields[1]), int(fields[2]), fields[0])
    return table


def _writes_to(pid: int, fd: str) -> bool:
    try:
        with open(f"/proc/{pid}/fdinfo/{fd}", "rb") as info:
            for line in info:
                if line.startswith(b"flags:"):
                    return int(line.split()[1], 8) & os.O_ACCMODE != os.O_RDONLY
    except (OSError, ValueError, IndexError):
        pass
    return False


def _pipe_writers(table: _Table, pipe: str) -> Iterable[int]:
    me = os.getpid()
    for pid, (_, _, state) in table.items():
        if pid == me or state in _GONE:
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue  # gone, or not ours to look at
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") != pipe:
                    continue
            except OSError:
                continue
            if _writes_to(pid, fd):
                yield pid
                break


def _members(table: _Table, shell: int, shell_alive: bool, pipe: str | None) -> dict[int, int]:
    """The live members of the command's tree, each with its depth (the shell's is 0)."""
    found: dict[int, int] = {}
    entry = table.get(shell)
    # pgrp == shell: still the session leader we started, not a stranger with a reused pid.
    if shell_alive and entry is not None and entry[1] == shell:
        children: dict[int, list[int]] = {}
        for pid, (ppid, _, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        level, depth = [shell], 0
        while level:
            nxt = []
            for pid in level:
                if pid not in found:
                    found[pid] = depth
                    nxt += children.get(pid, [])
            level, depth = nxt, depth + 1
    for pid, (_, pgrp, _) in table.items():
        if pgrp == shell and pid != shell:
            found.setdefault(pid, 1)
    if pipe is not None:
        for pid in _pipe_writers(table, pipe):
            found.setdefault(pid, 1)
    me = os.getpid()
    return {pid: d for pid, d in found.items() if pid != me and table[pid][2] not in _GONE}


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # already gone, or not ours to signal


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def end_tree(shell: int, pipe: str | None, shell_alive: bool) -> set[int]:
    """Freeze, then SIGKILL, every member of the tree of ``shell`` (see the module rules).

    ``shell`` is also the process group id (the shell was started with ``setsid``). Returns
    the pids signalled, for :func:`wait_gone`. Blocking: call it from a worker thread.
    """
    _signal_group(shell, signal.SIGSTOP)
    frozen: dict[int, int] = {}
    try:
        table = _table()
        for _ in range(_MAX_ROUNDS):
            if table is None:
                break
            new = {
                pid: depth
                for pid, depth in _members(table, shell, shell_alive, pipe).items()
                if pid not in frozen
            }
            if not new:
                break
            for pid in new:
                _signal(pid, signal.SIGSTOP)
            frozen.update(new)
            table = _table()
    finally:
        for pid in sorted(frozen, key=frozen.__getitem__, reverse=True):
            _signal(pid, signal.SIGKILL)
        _signal_group(shell, signal.SIGKILL)
    return set(frozen)


def _alive(pids: set[int], pgid: int) -> bool:
    table = _table()
    if table is None:
        # No /proc: ask the kernel, which counts zombies as members too; the caller's wait
        # is bounded, so an unreaped orphan only costs that bound.
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return any(
        state not in _GONE and (pid in pids or pgrp == pgid)
        for pid, (_, pgrp, state) in table.items()
    )


def wait_gone(pids: set[int], pgid: int, limit_s: float) -> None:
    """Block until none of ``pids`` and no member of group ``pgid`` runs, or ``limit_s``."""
    deadline = time.monotonic() + limit_s
    while _alive(pids, pgid) and time.monotonic() < deadline:
        time.sleep(0.002)
