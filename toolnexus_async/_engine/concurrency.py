"""Runs the jobs of one turn concurrently, paying for a task only when a job must wait.

Rules of this module:

- Jobs start in the order given, each in its own copy of the caller's context (as a task
  would get), when :func:`run_concurrently` is called: it is not a coroutine, and hands
  back the results when no job waited, else an awaitable that goes on from the first job
  that waits. A job that finishes
  without awaiting anything needs no task and no trip through the event loop: the next
  job starts at once. This is what Python 3.12 calls eager task execution; most tool
  calls (arithmetic, lookups, validation errors) are such jobs, and on the hot path a
  task per call was the largest single cost of a run.
- The last job is the caller's when every job before it finished: it awaits that job
  itself, in its own frame and context, as it would await a lone job (:func:`run_all`
  does it for a caller that wants one awaitable). Such a job needs no object to carry it
  nor a copy of the context, and it is the usual one to wait (a turn's held call).
- The first job that does wait goes on in the calling task, which is where it started,
  so anything it tied to its task (an anyio cancel scope, ``asyncio.timeout``, a lock
  owner) stays valid. Every job after it starts in a task of an ``asyncio.TaskGroup``
  at that moment; from there on they all run concurrently, as before.
- The group is structured: a failure or a cancellation cancels the jobs still running
  and waits for them, and nothing outlives the call.
- Results come back in the order of the jobs, whatever order they finished in.
"""

from __future__ import annotations

import asyncio
import contextvars
import types
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Final, Generic, Self, TypeVar

__all__ = ("run_concurrently",)

T = TypeVar("T")
X = TypeVar("X")


def run_concurrently(
    start: Callable[[X], Coroutine[Any, Any, T]],
    items: Sequence[X],
    plain: tuple[type[Exception], ...] = (),
) -> tuple[T, ...] | Awaitable[list[T]]:
    """``start(item)`` for every item (there is at least one) but the last, and for the
    last too if one of the others waits, concurrently. ``plain``: errors of these types
    raised by a job in a task come out as themselves (the first of them), not inside the
    group's ``ExceptionGroup``.

    ``start(item)`` is a job: a coroutine made only when its turn comes. The jobs that do
    not wait run here, before this returns. When every job but the last finished, a
    tuple of their results is handed back (the empty tuple, which is shared, for a lone
    job), and the caller awaits ``start(items[-1])`` itself (the usual turn: no awaitable
    made for it, and nothing but the caller's own frame holds a last job that waits:
    ``benchmarks/peers`` parking over HTTP, a carrier object and a context fewer per
    parked run; a run parked on a lone call holds no list for the results before it,
    ``park.py`` 34 pymalloc blocks per parked run with one, 33 without). Else what is
    handed back is an awaitable of every result, in order, that goes on from the first
    job that waited. Not a coroutine itself.
    """
    results: list[T] = []
    # By index, not enumerate(), and a coroutine's send through the type, not bound per
    # job: two objects the collector tracks fewer per job.
    for index in range(len(items) - 1):
        coro = start(items[index])
        context = contextvars.copy_context()
        try:
            if type(coro) is _Coroutine:
                waiting_on = context.run(_send, coro, None)
            else:
                waiting_on = context.run(coro.send, None)
        except StopIteration as done:
            # Finished without awaiting: no task was needed.
            results.append(done.value)
            continue
        carried = _Carried(coro, context, waiting_on, results)
        return _in_group(start, items[index + 1 :], carried, plain)
    return tuple(results)


def run_all(
    start: Callable[[X], Coroutine[Any, Any, T]],
    items: Sequence[X],
    plain: tuple[type[Exception], ...] = (),
) -> Awaitable[list[T]]:
    """:func:`run_concurrently` with its last job awaited too: one awaitable of every
    result, for a caller that needs no frame of its own to hold that job."""
    started = run_concurrently(start, items, plain)
    return _and_last(started, start, items[-1]) if isinstance(started, tuple) else started


async def _and_last(
    before: tuple[T, ...], start: Callable[[X], Coroutine[Any, Any, T]], last: X
) -> list[T]:
    result = await start(last)
    return [*before, result]


async def _in_group(
    start: Callable[[X], Coroutine[Any, Any, T]],
    rest: Sequence[X],
    carried: Awaitable[list[T]],
    plain: tuple[type[Exception], ...],
) -> list[T]:
    """The jobs after the first that waits, each in a task, while that one goes on here."""
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(start(later)) for later in rest]
            results = await carried
    except ExceptionGroup as failed:
        mine, _ = failed.split(plain) if plain else (None, None)
        if mine is None:
            raise
        first: BaseException = mine
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None
    results.extend(task.result() for task in tasks)
    return results


class _Carried(Generic[T]):
    """Drives a job that has already taken its first step, in the task that awaits this;
    the job's result is appended to ``results``, which are what the await returns.

    What the job yields (the future it waits on) goes to the awaiting task, and what the
    task sends or throws back goes to the job, in the job's own context: what ``await job``
    would do had the first step not been taken already. An object of four slots rather
    than a generator: a run parked on a job that has jobs after it holds it
    (``benchmarks/peers`` parking over HTTP, when it was every parked run's: 10,000
    parked, 6,379 -> 6,171 bytes per parked run; 64 bytes against 264).
    """

    __slots__ = ("_context", "_job", "_results", "_waiting_on")

    def __init__(
        self,
        job: Coroutine[Any, Any, T],
        context: contextvars.Context,
        waiting_on: Any,
        results: list[T],
    ) -> None:
        self._job = job
        self._context = context
        self._waiting_on = waiting_on
        self._results = results

    def __await__(self) -> Self:
        return self

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> Any:
        return self.send(None)

    def send(self, value: Any) -> Any:
        waiting_on = self._waiting_on
        if waiting_on is not _HANDED:
            # The first step: what the job waits on goes to the task.
            self._waiting_on = _HANDED
            return waiting_on
        try:
            return self._context.run(self._job.send, value)
        except StopIteration as done:
            self._results.append(done.value)
        # Raised outside the except block: no chained StopIteration (a wake ends here).
        raise StopIteration(self._results)

    def throw(self, kind: Any, value: Any = None, traceback: Any = None) -> Any:
        self._waiting_on = _HANDED
        error = kind if value is None and isinstance(kind, BaseException) else value
        if not isinstance(error, BaseException):
            error = kind() if value is None else kind(value)
        if traceback is not None:
            error = error.with_traceback(traceback)
        try:
            return self._context.run(self._job.throw, error)
        except StopIteration as done:
            self._results.append(done.value)
        raise StopIteration(self._results)

    def close(self) -> None:
        self._job.close()


_Coroutine: Final = types.CoroutineType
_send: Final = types.CoroutineType.send
_HANDED: Final = object()  # _Carried: the job's first wait went to the task already
