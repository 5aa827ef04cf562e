"""A batch of queued store writes: applied in one transaction, its callers told.

Rules of this module:

- :func:`apply` runs in the store's worker thread, never on the event loop: every write
  of the batch in one ``BEGIN IMMEDIATE`` transaction, each write's outcome (its value, or
  the refusal it raised) in order.
- :class:`Teller` runs on the event loop: once a batch committed, its callers are told
  their outcomes a slice per loop iteration, in the order the transactions committed.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections import deque
from collections.abc import Callable
from typing import Any

from ..._core.errors import ToolnexusError
from ._ops import Ops

__all__ = ("Queued", "Teller", "apply")

log = logging.getLogger("toolnexus_async.durable")

Queued = tuple[Callable[..., Any], tuple[Any, ...], "asyncio.Future[Any]"]


def apply(conn: sqlite3.Connection, batch: list[Queued], keep: int) -> list[Any]:
    """The outcomes of the batch's writes, all committed in one transaction.

    The operations check before they write (``_ops``), so a refused one has changed
    nothing and needs no savepoint. Should one break that rule, the batch is undone and
    each write goes again in a transaction of its own, so that its refusal undoes only
    itself.
    """
    ops = Ops(conn)
    outcomes: list[Any] = []
    conn.execute("BEGIN IMMEDIATE")
    try:
        for op, args, _ in batch:
            changes = conn.total_changes
            try:
                outcomes.append(op(ops, *args))
            except ToolnexusError as refused:
                if conn.total_changes != changes:
                    conn.execute("ROLLBACK")
                    log.error("a run store write changed rows before refusing: %r", refused)
                    return [_apply_alone(conn, op, args, keep) for op, args, _ in batch]
                outcomes.append(refused)
        ops.finish_batch(keep)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return outcomes


def _apply_alone(
    conn: sqlite3.Connection, op: Callable[..., Any], args: tuple[Any, ...], keep: int
) -> Any:
    ops = Ops(conn)
    conn.execute("BEGIN IMMEDIATE")
    try:
        outcome = op(ops, *args)
        ops.finish_batch(keep)
    except ToolnexusError as refused:
        conn.execute("ROLLBACK")
        return refused
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return outcome


# Callers told per loop iteration once their batch committed, across all batches. Each
# caller goes on at once (a run starts its tool, or parks, or wakes), so telling a batch
# of thousands at one go would stop the loop for all of their steps; a slice at a time,
# the steps of other tasks (a web request, a heartbeat) come in between, and the next
# batch's commit has started already. The bound is the store's, not each batch's: when
# iterations are slow, commits end faster than their callers are told, and a slice per
# batch would let the callers of many batches go on in one iteration.
_TELL_SLICE = 64


class Teller:
    """The callers of committed batches, told ``_TELL_SLICE`` per loop iteration in the
    order their transactions committed."""

    __slots__ = ("_pending", "_scheduled")

    def __init__(self) -> None:
        self._pending: deque[tuple[asyncio.Future[Any], Any]] = deque()
        self._scheduled = False

    def add(self, batch: list[Queued], outcomes: list[Any]) -> None:
        self._pending.extend(zip((q[2] for q in batch), outcomes, strict=True))
        if not self._scheduled:
            self._tell()

    def _tell(self) -> None:
        pending = self._pending
        for _ in range(min(_TELL_SLICE, len(pending))):
            future, outcome = pending.popleft()
            if future.done():  # its caller was cancelled meanwhile
                continue
            if isinstance(outcome, BaseException):  # a refusal: its caller raises it
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
        self._scheduled = bool(pending)
        if pending:
            asyncio.get_running_loop().call_soon(self._tell)
