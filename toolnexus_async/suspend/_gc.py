"""``GcFreezer``: keep long-lived objects (parked runs) out of the collector's full passes.

Rules of this module:

- Nothing here runs unless asked: the library never changes the process's collector by
  itself. A :class:`GcFreezer` acts only between its ``start()`` and ``stop()`` (or inside
  ``with``), and ``stop()`` gives the collector back everything it froze.
- The lever is ``gc.freeze()`` (constant time: it moves lists, it walks nothing), called
  right after each collection of the middle generation. What survived two young
  collections is long-lived; frozen, it is never walked again, so no automatic full
  collection walks 100,000 parked runs (0.7 s or more with the event loop stopped).
  Young collections run as before and free young garbage as before; reference counting
  frees everything that is not in a cycle, frozen or not.
- The price, said where it is offered: a reference cycle that becomes garbage after it was
  frozen is not freed until the objects are unfrozen. ``reclaim_when`` (checked at each
  middle-generation collection, so it must be cheap) unfreezes when it returns true, say
  when the inbox is empty; :meth:`GcFreezer.reclaim` does it now, with one full
  collection of everything (the pause the freezer otherwise avoids).
- Handing back is ``gc.unfreeze()``, all or nothing: :mod:`gc` cannot unfreeze only what
  this freezer froze (a freeze moves every generation, so what it froze is mixed with
  what others froze). That is kept on purpose and said where it is offered. It also
  hands back another library's ``gc.freeze()``, and on CPython 3.12 the interpreter's
  own: 3.12 keeps the immortal objects its collector tracks (375 tuples of the built-in
  types at startup on 3.12.1) in the frozen generation, since their reference counts
  mean nothing. That is harmless: the next full collection finds them immortal before
  it reads any count and puts them back (``gc.get_freeze_count()`` is 0 right after a
  hand-back, then that figure again); a few hundred objects, walked once.
- ``young`` (opt-in): a collection of both young generations (so a freeze) every
  ``young`` seconds, on the event loop that started the freezer. CPython counts a freed
  object against the young generation's allocation count, so while frozen runs end (an
  answer burst) as fast as new objects are made, the count stays near zero, no
  collection starts, and the young generation grows to the whole of what the runs in
  flight hold (a 100 ms+ pause when one finally starts). Paced, each young collection
  walks only what came since the last one. While nothing is frozen (all of it handed back,
  say because no run is parked), no frozen object can end and hold that count down, so
  the pace drops to one young collection a second: an idle process does not wake 200
  times a second.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable
from types import TracebackType
from typing import Self

from .._core.errors import UsageError

__all__ = ("GcFreezer",)

# The generation whose collection promotes objects into the oldest one.
_MIDDLE = 1
# Seconds between paced young collections while nothing is frozen (see the module's rules).
_IDLE_PACE = 1.0


class GcFreezer:
    """Freeze (``gc.freeze()``) what survives the collector's young generations, so that
    its full collections never walk the runs parked for a long time::

        with GcFreezer(reclaim_when=lambda: len(inbox) == 0):
            ...  # park and answer runs: no full collection walks the parked ones

    Args:
        reclaim_when: a cheap ``() -> bool``, asked at each collection of the middle
            generation (in whichever thread triggered it; it must not raise: Python
            reports that as unraisable and nothing is frozen that time); when true,
            everything frozen is handed back to the collector (``gc.unfreeze()``), whose
            next full collection then frees the cycles among it, and nothing is frozen
            that time. ``None``: only :meth:`reclaim` and :meth:`stop` hand it back.
        young: seconds between young collections forced while active and something is
            frozen (``None``: none forced), so that no young collection walks more than
            what came since the last one; one a second at most while nothing is.
            :meth:`start` must then be called on a running event loop, whose timer paces
            them.
    """

    def __init__(
        self,
        *,
        reclaim_when: Callable[[], bool] | None = None,
        young: float | None = None,
    ) -> None:
        if reclaim_when is not None and not callable(reclaim_when):
            raise UsageError(
                f"reclaim_when must be a function () -> bool, got {type(reclaim_when).__name__}"
            )
        if young is not None and (
            isinstance(young, bool) or not isinstance(young, int | float) or not young > 0
        ):
            raise UsageError(f"young must be > 0 seconds or None, got {young!r}")
        self._reclaim_when = reclaim_when
        self._young = young
        self._pacer: asyncio.TimerHandle | None = None
        self._active = False
        self._frozen = False  # froze something not handed back since
        self.freezes = 0  # how many times it froze
        self.reclaims = 0  # how many times it handed everything back

    def __repr__(self) -> str:
        state = "active" if self._active else "stopped"
        return f"<GcFreezer {state} freezes={self.freezes} reclaims={self.reclaims}>"

    @property
    def active(self) -> bool:
        return self._active

    def start(self) -> None:
        """Freeze after each middle-generation collection from now on; idempotent.

        Raises:
            UsageError: ``young`` is set and no event loop runs in this thread.
        """
        if not self._active:
            if self._young is not None:
                try:
                    loop = asyncio.get_running_loop()
                except RuntimeError:
                    raise UsageError(
                        "GcFreezer(young=...) paces young collections on an event loop: "
                        "start it from code running on one"
                    ) from None
                self._pacer = loop.call_later(self._young, self._pace, loop)
            gc.callbacks.append(self._collected)
            self._active = True

    def stop(self) -> None:
        """Stop freezing, and hand back to the collector what was frozen; idempotent.

        ``gc.unfreeze()`` hands back everything frozen in the process, also what other
        code froze with ``gc.freeze()`` (before a ``fork``, say), and on CPython 3.12 the
        immortal objects the interpreter keeps frozen itself (its next full collection
        freezes those again). Nothing is handed back if nothing was frozen since the
        last hand-back.
        """
        if self._active:
            gc.callbacks.remove(self._collected)
            self._active = False
            if self._pacer is not None:
                self._pacer.cancel()
                self._pacer = None
            self._thaw()

    def reclaim(self) -> int:
        """Hand back everything frozen (``gc.unfreeze()``, as :meth:`stop` does) and
        collect everything now (one full collection: the loop stops for as long as it
        takes); the number of unreachable objects found. Afterwards only what the
        interpreter keeps frozen by itself is frozen (CPython 3.12's immortal objects,
        none on 3.11 and 3.13). Freezing goes on afterwards if started."""
        gc.unfreeze()
        self._frozen = False
        self.reclaims += 1
        return gc.collect()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _collected(self, phase: str, info: dict[str, int]) -> None:
        # Called by the collector, in whatever thread triggered it, with its lists
        # consistent again ("stop"): freezing moves them, and allocates nothing.
        if phase != "stop" or info["generation"] != _MIDDLE:
            return
        reclaim = self._reclaim_when
        if reclaim is not None and reclaim():
            if self._frozen:
                self._thaw()
                self.reclaims += 1
            return
        gc.freeze()
        self._frozen = True
        self.freezes += 1

    def _pace(self, loop: asyncio.AbstractEventLoop) -> None:
        # Both young generations, and so a freeze (see _collected): each paced pause
        # walks what came in the last ``young`` seconds and is still alive, and no more.
        young = self._young
        assert young is not None
        gc.collect(_MIDDLE)
        delay = young if self._frozen else max(young, _IDLE_PACE)
        self._pacer = loop.call_later(delay, self._pace, loop)

    def _thaw(self) -> None:
        if self._frozen:
            gc.unfreeze()
            self._frozen = False
