"""Which queued writes of a group commit are still in time (both stores' committers).

Rule of this module: a write still queued past its deadline is failed, never tried, so
its caller knows it was not committed; the others go, with the seconds left to the
earliest of them (what their transaction may wait for a lock).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ("in_time",)

T = TypeVar("T")


def in_time(
    batch: list[T],
    due: list[float],
    future_of: Callable[[T], asyncio.Future[Any]],
    late: Callable[[], Exception],
) -> tuple[list[T], float]:
    """The writes of ``batch`` whose deadline (``due``, ``time.monotonic()``) has not
    passed, and the seconds left to the earliest of them; each other one's future is
    failed with ``late()``."""
    now = time.monotonic()
    live: list[T] = []
    earliest = math.inf
    for item, deadline in zip(batch, due, strict=True):
        if deadline > now:
            live.append(item)
            earliest = min(earliest, deadline)
        else:
            future = future_of(item)
            if not future.done():
                future.set_exception(late())
    return live, earliest - now
