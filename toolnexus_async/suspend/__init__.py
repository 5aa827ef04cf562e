"""Parking suspended runs: the :class:`Inbox` resolver, and :class:`GcFreezer` for hosts
that park many runs for long.

``Inbox`` is also importable from ``toolnexus_async``.
"""

from ._gc import GcFreezer
from ._inbox import Inbox

__all__ = ("GcFreezer", "Inbox")
