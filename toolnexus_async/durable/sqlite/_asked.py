"""A request kept with the turn that raised it: one write, one transaction (SQLite).

Rule of this module: the turn's part (``Ops.turn``, or ``Ops.start`` for a run not stored
yet) and the request's (``Ops.suspend``) go in one operation, so that the group commit
never puts them in two transactions; like every operation of ``_ops`` it checks before it
writes, so a refusal of either part has written nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..._core.errors import UsageError
from ._ops import Ops

__all__ = ("asked_with_turn",)


def asked_with_turn(
    ops: Ops, first: Callable[..., None], first_args: tuple[Any, ...], asked: tuple[Any, ...]
) -> None:
    """``first(ops, *first_args)`` (``Ops.turn`` or ``Ops.start``), then
    ``ops.suspend(*asked)``. The request's id is checked first: ``first`` refuses before
    it writes, and once it wrote, the run is held here and ``suspend`` cannot refuse."""
    request_id = asked[3]
    if ops.conn.execute("SELECT 1 FROM requests WHERE request_id = ?", (request_id,)).fetchone():
        raise UsageError(f"request id {request_id!r} is stored already; ids must be unique")
    first(ops, *first_args)
    ops.suspend(*asked)
