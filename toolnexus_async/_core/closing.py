"""``async with`` for the library's resources: leaving the block is ``aclose()``.

Rule of this module: a resource says how it closes (``aclose``, idempotent) and, if it
must, what entering it checks; how ``async with`` maps onto that is written here once.
"""

from __future__ import annotations

from types import TracebackType
from typing import Self

from .errors import UsageError

__all__ = ("Closing", "FlagClosing")


class Closing:
    """A resource that ``async with`` closes on the way out.

    Subclasses define :meth:`aclose`. ``__aenter__`` hands back the resource; a subclass
    that refuses to be entered (closed already, say) overrides it.
    """

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class FlagClosing(Closing):
    """A resource whose closing is a flag: once closed, using or entering it is refused.

    Subclasses name themselves in ``_kind`` (for the message) and call
    :meth:`_check_open` where a closed resource must not be used.
    """

    _kind = "resource"
    _closed = False

    async def aclose(self) -> None:
        self._closed = True

    async def __aenter__(self) -> Self:
        self._check_open()
        return self

    def _check_open(self) -> None:
        if self._closed:
            raise UsageError(f"this {self._kind} is closed")
