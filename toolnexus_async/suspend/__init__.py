"""Parking suspended runs: the :class:`Inbox` resolver.

``Inbox`` is also importable from ``toolnexus_async``.
"""

from ._inbox import Inbox

__all__ = ("Inbox",)
