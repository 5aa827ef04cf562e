"""Runs the jobs of one turn concurrently, paying for a task only when a job must wait.

Rules of this module:

- Jobs start in the order given, each in its own copy of the caller's context (as a task
  would get). A job that finishes without awaiting anything needs no task and no trip
  through the event loop: the next job starts at once. This is what Python 3.12 calls
  eager task execution; most tool calls (arithmetic, lookups, validation errors) are such
  jobs, and on the hot path a task per call was the largest single cost of a run.
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
from collections.abc import Callable, Coroutine, Generator, Sequence
from typing import Any, TypeVar

__all__ = ("run_concurrently",)

T = TypeVar("T")
X = TypeVar("X")


async def run_concurrently(
    start: Callable[[X], Coroutine[Any, Any, T]], items: Sequence[X]
) -> list[T]:
    """``start(item)`` for every item, concurrently; the results in the order of the items.

    ``start(item)`` is a job: a coroutine made only when its turn comes.
    """
    results: list[T] = []
    for index, item in enumerate(items):
        coro = start(item)
        context = contextvars.copy_context()
        try:
            waiting_on = context.run(coro.send, None)
        except StopIteration as done:
            # Finished without awaiting: no task was needed.
            results.append(done.value)
            continue
        rest = items[index + 1 :]
        if not rest:
            results.append(await _carry_on(coro, context, waiting_on))
            return results
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(start(later)) for later in rest]
            results.append(await _carry_on(coro, context, waiting_on))
        results.extend(task.result() for task in tasks)
        return results
    return results


@types.coroutine
def _carry_on(
    coro: Coroutine[Any, Any, T], context: contextvars.Context, waiting_on: Any
) -> Generator[Any, Any, T]:
    """Drive a coroutine that has already taken its first step, in the calling task.

    What the coroutine yields (the future it waits on) goes to the task that awaits this,
    and what the task sends or throws back goes to the coroutine, in its own context:
    what ``await coro`` would do had the first step not been taken already.
    """
    while True:
        try:
            sent = yield waiting_on
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:
            try:
                waiting_on = context.run(coro.throw, exc)
            except StopIteration as done:
                result: T = done.value
                return result
        else:
            try:
                waiting_on = context.run(coro.send, sent)
            except StopIteration as done:
                result = done.value
                return result
