"""``TaskOwner``: many long-lived tasks (one per run) owned as cheaply as asyncio allows.

Rules of this module:

- Every task started here has an owner: the ``asyncio.TaskGroup`` of one holder task,
  which is itself a task of the caller's anyio task group. Cancelling that anyio group
  (or its scope) cancels the holder, whose group cancels every task here and waits for
  them; a task that fails cancels its siblings, as in any task group.
- :meth:`TaskOwner.close` lets the holder leave once every task here has ended (one
  started meanwhile is waited for too, as an anyio group does while it exits); leaving
  the anyio group then waits for them. Once the holder has left, nothing can start.
- Why not the anyio group's own ``start_soon``: on asyncio, anyio keeps about 23
  GC-tracked objects per waiting task (its task state, a task handle with two events, a
  cancel scope, closures) against 8 for a task of an ``asyncio.TaskGroup``, and a server
  or a durable host holds one task per parked run: the collector walks all of them. The
  tasks still honour anyio cancel scopes of their own (the tool calls of a run open some).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVarTuple, Unpack

import anyio
from anyio.abc import TaskGroup, TaskStatus

from .._core.errors import UsageError

__all__ = ("TaskOwner",)

Ts = TypeVarTuple("Ts")


class TaskOwner:
    """Tasks owned by one holder task of an anyio task group (see :meth:`open_in`)."""

    __slots__ = ("_closed", "_group", "_name")

    def __init__(self, name: str) -> None:
        self._name = name
        self._group: asyncio.TaskGroup | None = None
        self._closed = anyio.Event()

    @classmethod
    async def open_in(cls, tg: TaskGroup, name: str) -> TaskOwner:
        """A new owner whose holder is a task of ``tg``, ready when this returns."""
        owner = cls(name)
        await tg.start(owner._hold, name=name)
        return owner

    async def _hold(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                task_status.started()
                await self._closed.wait()
        finally:
            self._group = None

    def start_soon(
        self,
        fn: Callable[[Unpack[Ts]], Coroutine[Any, Any, object]],
        *args: *Ts,
        name: str | None = None,
    ) -> None:
        """Start ``fn(*args)`` in a task of this owner."""
        group = self._group
        if group is not None:
            coro = fn(*args)
            try:
                group.create_task(coro, name=name)
            except RuntimeError:  # the group is finished, or cancelling its tasks
                coro.close()
            else:
                return
        raise UsageError(f"{self._name} has ended: no task can start in it")

    def close(self) -> None:
        """Let the holder leave once the tasks here (and any started meanwhile) have ended."""
        self._closed.set()
