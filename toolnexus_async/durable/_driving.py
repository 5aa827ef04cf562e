"""``Driving``: the runs one durable host drives now, and waiting until none is left.

Rule of this module: a run is counted from the moment its host starts it (a run claimed
from the store, from the claim's return, before the host next awaits: so the sweep and an
answer cannot both start it) until its drive ends, however it ends; the idle event is set
exactly when nothing is counted.
"""

from __future__ import annotations

import anyio

__all__ = ("Driving",)


class Driving:
    """The ids of the runs a host drives now."""

    __slots__ = ("_idle", "_ids")

    def __init__(self) -> None:
        self._ids: set[str] = set()
        self._idle = anyio.Event()
        self._idle.set()

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._ids

    def add(self, run_id: str) -> None:
        self._ids.add(run_id)
        if self._idle.is_set():
            self._idle = anyio.Event()

    def discard(self, run_id: str) -> None:
        self._ids.discard(run_id)
        if not self._ids:
            self._idle.set()

    async def settle(self, patience: float) -> int:
        """Wait until no run is driven, or none ended for ``patience`` seconds; returns how
        many are still driven (0 once all ended)."""
        left = len(self._ids)
        quiet_since = anyio.current_time()
        while self._ids:
            with anyio.move_on_after(min(1.0, patience)):
                await self._idle.wait()
            now = anyio.current_time()
            if len(self._ids) < left:
                left, quiet_since = len(self._ids), now
            elif now - quiet_since >= patience:
                return left
        return 0
