"""GcFreezer: what survives the young generations is frozen, and given back when asked.

Each test leaves the collector as it found it (nothing frozen but what the interpreter
keeps frozen by itself, no callback of ours), also when it fails: the ``freezer`` fixture
stops every freezer it made.

CPython 3.12 keeps its immortal objects that the collector tracks (375 tuples of the
built-in types at startup on 3.12.1) in the frozen generation: each full collection moves
those it finds there, whatever unfroze them. So the counts here are taken relative to
``settled()``, the count after a full collection with no freezer at work (0 on 3.11 and
3.13); right after ``gc.unfreeze()`` the count is 0 on every Python.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Callable, Iterator
from contextlib import aclosing
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from toolnexus_async import (
    Answer,
    AssistantMessage,
    Inbox,
    LlmClient,
    Message,
    Request,
    Tool,
    ToolContext,
    Toolkit,
    ToolResult,
    ToolReturn,
    UsageError,
    define_tool,
)
from toolnexus_async.suspend import GcFreezer
from toolnexus_async.testing import tool_call

Make = Callable[..., GcFreezer]


def settled() -> int:
    """What stays frozen with no freezer at work: the count after a full collection."""
    gc.collect()
    return gc.get_freeze_count()


# Taken before any test here froze anything: what the interpreter freezes by itself.
INTERPRETERS_OWN = settled()


@pytest.fixture
def freezer() -> Iterator[Make]:
    made: list[GcFreezer] = []

    def make(**options: Any) -> GcFreezer:
        made.append(GcFreezer(**options))
        return made[-1]

    assert settled() == INTERPRETERS_OWN  # nothing left frozen by an earlier test
    yield make
    for f in made:
        f.stop()
    left = settled()
    gc.unfreeze()  # leave the collector as found, also after a failed stop()
    assert left == INTERPRETERS_OWN  # stop() handed back everything the freezers froze


class Node:
    """A tracked object that can be part of a cycle."""

    def __init__(self) -> None:
        self.other: Node | None = None


def in_oldest(obj: object) -> bool:
    return any(o is obj for o in gc.get_objects(generation=2))


def test_what_survives_a_middle_collection_is_frozen_and_stop_gives_it_back(freezer):
    f = freezer()
    kept = Node()
    with f:
        assert f.active
        gc.collect(1)  # kept survives it: long-lived
        assert f.freezes >= 1 and gc.get_freeze_count() > 0
        assert not in_oldest(kept)  # frozen: no full collection walks it
        gc.collect()
        assert not in_oldest(kept)
    assert not f.active
    assert gc.get_freeze_count() == 0  # gc.unfreeze(): everything, the interpreter's too
    gc.collect()
    assert in_oldest(kept)
    assert gc.get_freeze_count() == INTERPRETERS_OWN  # the interpreter took its own back


def test_a_stopped_or_never_started_freezer_freezes_nothing(freezer):
    f = freezer()
    before = gc.get_freeze_count()
    gc.collect(1)
    assert f.freezes == 0 and gc.get_freeze_count() == before
    f.start()
    f.start()  # idempotent: one callback
    gc.collect(1)
    assert f.freezes == 1
    f.stop()
    f.stop()
    gc.collect(1)
    assert f.freezes == 1 and gc.get_freeze_count() == 0


def test_a_frozen_cycle_is_freed_only_once_given_back(freezer):
    f = freezer()
    f.start()
    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    gc.collect(1)  # the cycle is frozen while still in use
    del a, b
    gc.collect()
    assert gone() is not None  # garbage, but frozen: the price the docs name
    assert f.reclaim() >= 2
    assert gone() is None
    assert f.active and f.reclaims == 1
    # One full collection after gc.unfreeze(): only what the interpreter froze is back.
    assert gc.get_freeze_count() == INTERPRETERS_OWN


def test_reclaim_when_true_gives_everything_back_instead_of_freezing(freezer):
    parked: list[int] = [1]
    f = freezer(reclaim_when=lambda: not parked)
    f.start()
    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    gc.collect(1)
    assert f.freezes == 1
    del a, b
    parked.clear()  # "the inbox is empty"
    gc.collect(1)  # given back, not frozen again
    assert gc.get_freeze_count() == 0 and f.reclaims == 1 and f.freezes == 1
    gc.collect()
    assert gone() is None
    gc.collect(1)  # nothing frozen since: nothing to give back, not counted
    assert f.reclaims == 1


def test_reclaim_when_must_be_a_function():
    with pytest.raises(UsageError, match="reclaim_when must be a function"):
        GcFreezer(reclaim_when=True)  # type: ignore[arg-type]


def test_young_must_be_positive_seconds_and_needs_a_running_loop(freezer):
    for bad in (0, -1.0, True, "1"):
        with pytest.raises(UsageError, match="young must be > 0 seconds"):
            GcFreezer(young=bad)  # type: ignore[arg-type]
    f = freezer(young=0.01)
    with pytest.raises(UsageError, match="event loop"):
        f.start()
    assert not f.active and f.freezes == 0


async def test_young_collects_and_freezes_on_time_without_any_allocation_count(freezer):
    """With the collector's automatic collections off (as when frozen runs ending hold
    its allocation count down), the paced collections still free young cycles and
    freeze what lives; stop() ends them."""
    f = freezer(young=0.005)
    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    kept = Node()
    enabled = gc.isenabled()
    gc.disable()
    try:
        f.start()
        with anyio.fail_after(5):
            while gone() is not None or f.freezes < 2:
                await anyio.lowlevel.checkpoint()
        assert gc.get_freeze_count() > 0 and not in_oldest(kept)
        f.stop()
        assert gc.get_freeze_count() == 0  # right after the hand-back, on every Python
        count = f.freezes
        gc.collect(1)
        assert f.freezes == count  # stopped: neither the callback nor the timer freezes
    finally:
        if enabled:
            gc.enable()


async def test_young_paces_fast_only_while_something_is_frozen(freezer):
    """With everything handed back (reclaim_when true), the paced collections come once a
    second; once something is frozen, every ``young`` seconds again. Read off the timer
    the freezer scheduled (``_pacer``), so no sleep decides the outcome."""
    handing_back = [True]
    f: GcFreezer = freezer(young=0.005, reclaim_when=lambda: handing_back[0])
    f.start()
    loop = asyncio.get_running_loop()

    def delay() -> float:
        pacer = f._pacer
        assert pacer is not None
        return pacer.when() - loop.time()

    assert delay() <= 0.005  # the first paced collection comes after ``young``
    f._pace(loop)  # a paced collection with nothing frozen: handed back, not frozen
    assert f.freezes == 0 and 0.9 < delay() <= 1.0
    handing_back[0] = False
    f._pace(loop)  # now it freezes: the fast pace again
    assert f.freezes == 1 and delay() <= 0.005
    f._pace(loop)
    assert delay() <= 0.005
    f.stop()
    assert f._pacer is None


@define_tool
async def approve(n: int, ctx: ToolContext | None = None) -> ToolResult:
    """Ask for approval of ``n``, then say it was approved.

    Args:
        n: what to approve.
    """
    if ctx is None or ctx.answer is None:
        return ToolResult.pending(Request(f"req-{n}", "approval", f"approve {n}?"))
    return ToolResult.ok(f"{n} approved")


def model(messages: list[Message], tools: list[Tool]) -> AssistantMessage:
    last = messages[-1]
    if isinstance(last, ToolReturn):
        return AssistantMessage(last.output)
    n = int(str(getattr(last, "text", "")).split()[-1])
    return AssistantMessage(None, (tool_call("approve", {"n": n}, id="c1"),))


async def test_frozen_parked_runs_wake_and_finish(freezer):
    inbox = Inbox()
    toolkit = Toolkit.create(builtins=False, extra_tools=[approve])
    texts: dict[int, str] = {}
    with freezer(reclaim_when=lambda: len(inbox) == 0) as f:
        async with LlmClient.in_process(model, wait_for=inbox) as client:

            async def run(n: int) -> None:
                result = await client.run(f"approve {n}", toolkit)
                texts[n] = result.text

            async with aclosing(inbox.requests()) as arrivals, anyio.create_task_group() as tg:
                for n in range(20):
                    tg.start_soon(run, n)
                parked = 0
                async for _ in arrivals:
                    parked += 1
                    if parked == 20:
                        break
                gc.collect(1)  # the parked runs are long-lived now: frozen
                assert f.freezes >= 1 and gc.get_freeze_count() > 0
                slots = [inbox.get(f"req-{n}") for n in range(20)]
                assert all(s is not None and not in_oldest(s) for s in slots)
                for n in range(20):
                    await inbox.answer(Answer(f"req-{n}", True))
        gc.collect(1)  # the inbox is empty: everything is given back
        assert gc.get_freeze_count() == 0 and f.reclaims >= 1
    assert texts == {n: f"{n} approved" for n in range(20)}


async def test_the_library_leaves_the_collector_alone_unless_asked():
    """Parking and waking runs freezes nothing and adds no collector callback."""
    callbacks = list(gc.callbacks)
    before = settled()
    inbox = Inbox()
    toolkit = Toolkit.create(builtins=False, extra_tools=[approve])
    async with LlmClient.in_process(model, wait_for=inbox) as client:
        async with aclosing(inbox.requests()) as arrivals, anyio.create_task_group() as tg:
            tg.start_soon(client.run, "approve 1", toolkit)
            async for _ in arrivals:
                break
            gc.collect(1)
            assert gc.get_freeze_count() == before
            await inbox.answer(Answer("req-1", True))
    assert gc.callbacks == callbacks
    assert settled() == before
