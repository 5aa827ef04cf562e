"""``resume_stored``: answering a stored run without a host, on the store's journal.

A stored run is resumed from what the store kept (recorded results never run again, the
accepted answers are used, still-pending requests are waited for again under the same
id), every step is kept as it goes, and answers that arrive while the run is held here are
not lost. A cancelled resume lets the run go for a host; a failed one is recorded.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.conftest import assert_no_leaks
from toolnexus_async import (
    AlreadyAnsweredError,
    AlreadyResumedError,
    Answer,
    LlmClient,
    Message,
    ProviderError,
    Request,
    RunResult,
    ToolContext,
    Toolkit,
    ToolResult,
    ToolReturn,
    UnknownRequestError,
    UsageError,
    define_tool,
)
from toolnexus_async.durable import DurableHost, MemoryRunStore, RunStore, resume_stored
from toolnexus_async.testing import reply, tool_call

LIMIT = 5


class Trip:
    """Two calls in one turn, each asking a person first; every execution is counted."""

    def __init__(self) -> None:
        self.ran: dict[str, list[str | None]] = {"flight": [], "seat": []}
        self.gate: anyio.Event | None = None  # when set: the flight, once approved, waits

        def tool(name: str) -> Any:
            @define_tool(name=name)
            async def step(ctx: ToolContext | None = None) -> ToolResult:
                """One step of the trip, approved first."""
                if ctx is None or ctx.answer is None:
                    return ToolResult.pending(Request("", "approval", f"{name}?"))
                if name == "flight" and self.gate is not None:
                    await self.gate.wait()
                self.ran[name].append(ctx.idempotency_key)
                return ToolResult.ok(f"{name} booked")

            return step

        self.toolkit = Toolkit.create(builtins=False, extra_tools=[tool("flight"), tool("seat")])


def trip_model(messages: list[Message], tools: list[Any]) -> Any:
    if isinstance(messages[-1], ToolReturn):
        return " | ".join(m.output for m in messages if isinstance(m, ToolReturn))
    return reply(tool_call("flight", id="c_flight"), tool_call("seat", id="c_seat"))


async def halted_trip(store: RunStore, trip: Trip) -> RunResult:
    async with LlmClient.in_process(trip_model) as client:
        halted = await client.run("book", trip.toolkit)
    assert [r.call.id for r in halted.suspended] == ["c_flight", "c_seat"]
    await store.save(halted)
    return halted


def requests_of(halted: RunResult) -> tuple[Request, Request]:
    flight, seat = (r.request for r in halted.suspended)
    assert flight is not None and seat is not None
    return flight, seat


async def test_a_pending_call_waits_for_its_same_request_and_is_not_run_again():
    trip = Trip()
    async with MemoryRunStore() as store, trip.toolkit, LlmClient.in_process(trip_model) as c:
        halted = await halted_trip(store, trip)
        flight, seat = requests_of(halted)
        again = await resume_stored(c, trip.toolkit, store, Answer(seat.id, True))
        assert again.status == "pending" and again.pending == flight  # the same request
        assert trip.ran == {"flight": [], "seat": [trip.ran["seat"][0]]}
        assert await store.requests() == [flight]
        done = await resume_stored(c, trip.toolkit, store, Answer(flight.id, True))
    assert done.text == "flight booked | seat booked"
    assert [len(keys) for keys in trip.ran.values()] == [1, 1]


async def test_answers_arriving_while_the_run_is_held_are_used_not_lost():
    """The seat is answered while the flight's resume holds the run: the second caller is
    told the run goes on elsewhere, and it does, with that answer, once."""
    trip = Trip()
    trip.gate = anyio.Event()
    outcomes: dict[str, Any] = {}
    async with MemoryRunStore() as store, trip.toolkit, LlmClient.in_process(trip_model) as c:
        halted = await halted_trip(store, trip)
        flight, seat = requests_of(halted)

        async def answer(name: str, request: Request) -> None:
            try:
                outcomes[name] = await resume_stored(
                    c, trip.toolkit, store, Answer(request.id, True)
                )
            except AlreadyResumedError as error:
                outcomes[name] = error

        with anyio.fail_after(LIMIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(answer, "flight", flight)
                while (await store.load(halted.run_id)).owner is None:
                    await anyio.lowlevel.checkpoint()
                await answer("seat", seat)  # the run is held by the flight's resume
                trip.gate.set()
    assert isinstance(outcomes["seat"], AlreadyResumedError)
    assert outcomes["flight"].text == "flight booked | seat booked"
    assert [len(keys) for keys in trip.ran.values()] == [1, 1]


async def test_a_second_answer_to_one_request_is_refused_before_anything_runs():
    trip = Trip()
    async with MemoryRunStore() as store, trip.toolkit, LlmClient.in_process(trip_model) as c:
        halted = await halted_trip(store, trip)
        flight, seat = requests_of(halted)
        await resume_stored(c, trip.toolkit, store, Answer(flight.id, True))
        with pytest.raises(AlreadyAnsweredError):
            await resume_stored(c, trip.toolkit, store, Answer(flight.id, False))
        with pytest.raises(UnknownRequestError):
            await resume_stored(c, trip.toolkit, store, Answer("req_nobody", True))
        with pytest.raises(UsageError, match="at least one"):
            await resume_stored(c, trip.toolkit, store, [])
        with pytest.raises(UsageError, match="lease"):
            await resume_stored(c, trip.toolkit, store, Answer(seat.id, True), lease=0)
    assert [len(keys) for keys in trip.ran.values()] == [1, 0]


async def test_a_cancelled_resume_lets_the_run_go_and_a_host_goes_on_without_redoing():
    """Cancelled while the flight runs (after the seat's result was recorded): the run is
    let go, not failed, and a host finishes it; the seat is not booked twice, the flight
    runs again with the same idempotency key."""
    trip = Trip()
    trip.gate = anyio.Event()
    results: list[RunResult] = []
    async with MemoryRunStore() as store, trip.toolkit, LlmClient.in_process(trip_model) as c:
        halted = await halted_trip(store, trip)
        flight, seat = requests_of(halted)
        await resume_stored(c, trip.toolkit, store, Answer(seat.id, True))  # seat booked
        with anyio.fail_after(LIMIT):
            with anyio.move_on_after(0.05):  # the flight waits on its gate meanwhile
                await resume_stored(c, trip.toolkit, store, Answer(flight.id, True))
            stored = await store.load(halted.run_id)
            assert (stored.status, stored.owner) == ("running", None)  # let go
            trip.gate.set()
            async with DurableHost(c, trip.toolkit, store, sweep=0.02, on_result=results.append):
                while not results:
                    await anyio.lowlevel.checkpoint()
    assert results[0].text == "flight booked | seat booked"
    assert len(trip.ran["seat"]) == 1 and len(trip.ran["flight"]) == 1
    assert_no_leaks()


async def test_a_model_failure_after_the_tools_ran_is_recorded_and_carries_the_state():
    trip = Trip()

    def revoked(messages: list[Message], tools: list[Any]) -> Any:
        raise ProviderError(401, "invalid api key", "https://llm.example.com/v1")

    async with MemoryRunStore() as store, trip.toolkit:
        halted = await halted_trip(store, trip)
        flight, seat = requests_of(halted)
        async with LlmClient.in_process(revoked) as client:
            with pytest.raises(ProviderError) as caught:
                await resume_stored(
                    client, trip.toolkit, store, [Answer(flight.id, True), Answer(seat.id, True)]
                )
        assert caught.value.run is not None and caught.value.run.limit == "model_error"
        assert (await store.load(halted.run_id)).status == "failed"
        assert await store.requests() == []
        [summary] = await store.runs()
        assert summary.status == "error" and "invalid api key" in (summary.error or "")
    assert [len(keys) for keys in trip.ran.values()] == [1, 1]
