"""What answers a suspended call: the resolver protocol, decided once per client.

Rule of this module: the runtime never probes a ``wait_for`` with ``getattr`` while a run
is going. :meth:`Resolver.of` looks at it once, when the client is built, and says what it
can do; the executor only reads that answer.

There are two kinds of resolver:

- **An async function** ``async (request) -> Answer`` (or an object whose ``__call__`` is
  one): the public protocol. The loop asks it and, when the request has an ``expires_at``,
  gives it until then (its passing is an expired answer). It may raise :class:`HaltRun` to
  stop waiting: the run halts.
- **A parking resolver** (the :class:`~toolnexus_async.Inbox`): it implements the private
  :class:`Parking` protocol, handing back the awaitable a run waits on, so that a parked
  run holds no frame of the resolver, and it enforces ``expires_at`` itself (one timer for
  all its requests, not a cancel scope per run). It is called like a function too.

A misconfigured resolver is a programming error, loud where it can be seen: a class
(``wait_for=Inbox``), something not callable or a plain (sync) function is refused when the
client is built, and an answer that is not an :class:`Answer` raises :class:`UsageError`
naming the resolver instead of reaching the model. A resolver that raises while working (a
network error) is not a misconfiguration: the model is told, as the design says.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Protocol, runtime_checkable

from .._core.errors import UsageError
from .._core.types import Answer, Request

__all__ = ("Parking", "Resolver", "WaitFor", "name_of")

WaitFor = Callable[[Request], Awaitable[Answer]]


@runtime_checkable
class Parking(Protocol):
    """A resolver that parks each request until it is answered (the Inbox)."""

    def _park(self, request: Request, run_id: str | None = None) -> Awaitable[Answer]:
        """The awaitable the run ``run_id`` waits on; it enforces ``expires_at`` and may
        raise :class:`HaltRun`."""
        ...


def name_of(wait_for: object) -> str:
    """How an error names a resolver: its qualified name, or its class for an object."""
    name = getattr(wait_for, "__qualname__", None)
    if isinstance(name, str):
        return name
    return f"a {type(wait_for).__qualname__} object"


def _is_async(wait_for: Callable[..., object]) -> bool:
    """An ``async def``, or an object whose ``__call__`` is one (a partial of one counts)."""
    return inspect.iscoroutinefunction(wait_for) or inspect.iscoroutinefunction(
        type(wait_for).__call__
    )


async def _answer_of(wait_for: WaitFor, request: Request) -> Answer:
    answer: object = wait_for(request)
    if inspect.isawaitable(answer):
        answer = await answer
    if not isinstance(answer, Answer):
        raise UsageError(
            f"wait_for {name_of(wait_for)} returned {type(answer).__name__}, not an Answer: "
            f"return Answer(request.id, ok=True) or Answer(request.id, ok=False)"
        )
    return answer


class Resolver:
    """A client's ``wait_for`` and what it can do, decided once."""

    __slots__ = ("enforces_expiry", "park", "wait_for")

    def __init__(self, wait_for: WaitFor) -> None:
        self.wait_for = wait_for
        # The awaitable a run waits on: the resolver's own for a parking one, a coroutine
        # over the function otherwise.
        self.park: Callable[[Request, str | None], Awaitable[Answer]] | None = (
            wait_for._park if isinstance(wait_for, Parking) else None
        )
        self.enforces_expiry = self.park is not None

    def ask(self, request: Request, run_id: str | None = None) -> Awaitable[Answer]:
        """What the resolver answers ``request`` of run ``run_id`` (awaitable, whatever its
        kind)."""
        if self.park is not None:
            return self.park(request, run_id)
        return _answer_of(self.wait_for, request)

    @classmethod
    def of(cls, wait_for: object) -> Resolver | None:
        """The resolver for ``wait_for`` (``None``: no resolver, suspensions halt).

        Raises:
            UsageError: ``wait_for`` cannot be a resolver: a class, not callable, or a plain
                (sync) function.
        """
        if wait_for is None:
            return None
        if inspect.isclass(wait_for):
            raise UsageError(
                f"wait_for={wait_for.__qualname__} is a class; pass an instance "
                f"(wait_for={wait_for.__qualname__}()) or an async def function"
            )
        if not callable(wait_for):
            raise UsageError(
                f"wait_for must be callable, got {type(wait_for).__name__}: "
                f"expected an async def function (request) -> Answer, or an Inbox()"
            )
        if not isinstance(wait_for, Parking) and not _is_async(wait_for):
            raise UsageError(
                f"wait_for {name_of(wait_for)} is not an async function: expected "
                f"async def (request) -> Answer, or an Inbox()"
            )
        return cls(wait_for)
