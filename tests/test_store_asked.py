"""``RunStore.suspend(..., state=...)``, on every store: a request written with the turn
that raised it (or, new, with the run's start), whole or not at all (issue 41).

The journal writes a turn with the request its ``require_approval`` gate raised
(``tests/test_turn_with_request.py``); here is the store's side of it, run against
MemoryRunStore, SqliteRunStore and PostgresRunStore alike (``tests/test_store.py``'s
fixtures): a refusal of either part writes neither, the events come in order, a later turn
closes the earlier one's requests, and writes queued together (grouped on PostgreSQL)
are each told their own outcome.
"""

from __future__ import annotations

import anyio
import pytest

from tests.test_host import LIMIT
from tests.test_store import (  # noqa: F401 (the fixtures of every store)
    LEASE,
    NOW,
    database,
    fresh_state,
    make_store,
    store,
    store_kind,
    turn_state,
)
from toolnexus_async import Request, UnknownRequestError, UsageError
from toolnexus_async.durable import LeaseLostError, RunStore
from toolnexus_async.testing import tool_call


async def test_a_request_with_its_turn_is_written_whole_or_not_at_all(store: RunStore):  # noqa: F811
    c1, c2 = tool_call("pay", id="c1"), tool_call("pay", id="c2")
    await store.start(fresh_state("run_1"), "A", NOW + LEASE)
    await store.start(fresh_state("run_2"), "A", NOW + LEASE)
    await store.turn(turn_state("run_2", c1), 1, "A")
    await store.suspend("run_2", "c1", Request("req_taken", "approval", "Pay?"), "A")
    # Not held by B: neither part written.
    with pytest.raises(LeaseLostError):
        await store.suspend(
            "run_1", "c1", Request("req_1", "approval", "Pay?"), "B",
            state=turn_state("run_1", c1), turn=1,
        )  # fmt: skip
    # A request id taken: neither part written either.
    with pytest.raises(UsageError, match="req_taken"):
        await store.suspend(
            "run_1", "c1", Request("req_taken", "approval", "Pay?"), "A",
            state=turn_state("run_1", c1), turn=1,
        )  # fmt: skip
    stored = await store.load("run_1")
    assert (stored.turn, stored.requests) == (0, {})
    await store.suspend(
        "run_1", "c1", Request("req_1", "approval", "Pay?"), "A",
        state=turn_state("run_1", c1), turn=1,
    )  # fmt: skip
    stored = await store.load("run_1")
    assert (stored.turn, stored.requests["c1"].request.id) == (1, "req_1")
    assert stored.state.messages[-1] == turn_state("run_1", c1).messages[-1]
    # A later turn closes the earlier one's requests, as ``turn`` does.
    later = turn_state("run_1", c2)
    await store.suspend(
        "run_1", "c2", Request("req_2", "approval", "Pay?"), "A", state=later, turn=2
    )
    assert [r.id for r in await store.requests()] == ["req_taken", "req_2"]
    kinds = [e.kind for e in (await store.events(0)).events if e.run_id == "run_1"]
    assert kinds == ["run_started", "tool_call", "pending", "tool_call", "pending"]
    # A new run, started with its turn and its request (``host.run``'s first ask).
    state = turn_state("run_3", c1)
    await store.suspend(
        "run_3", "c1", Request("req_3", "approval", "Pay?"), "A",
        state=state, turn=1, lease_until=NOW + LEASE,
    )  # fmt: skip
    stored = await store.load("run_3")
    assert (stored.turn, stored.owner, stored.requests["c1"].status) == (1, "A", "pending")
    with pytest.raises(UsageError, match="stored already"):
        await store.suspend(
            "run_3", "c1", Request("req_4", "approval", "Pay?"), "A",
            state=state, turn=1, lease_until=NOW + LEASE,
        )  # fmt: skip
    with pytest.raises(UnknownRequestError):
        await store.find("req_4")
    kinds = [e.kind for e in (await store.events(0)).events if e.run_id == "run_3"]
    assert kinds == ["run_started", "tool_call", "pending"]


async def test_requests_with_their_turns_at_once_are_each_told_their_own_outcome(
    store: RunStore,  # noqa: F811
):
    """Queued together (one batch, grouped on PostgreSQL): each is written whole or
    refused alone, and a refusal leaves nothing of its turn."""
    runs = [f"run_{n}" for n in range(20)]
    for run_id in runs:
        await store.start(fresh_state(run_id), "A", NOW + LEASE)
    await store.turn(turn_state("run_0", tool_call("pay", id="c0")), 1, "A")
    await store.suspend("run_0", "c0", Request("req_run_0", "approval", "Pay?"), "A")
    outcomes: dict[str, str | None] = {}

    async def ask(run_id: str, owner: str, request_id: str) -> None:
        try:
            await store.suspend(
                run_id, "c1", Request(request_id, "approval", "Pay?"), owner,
                state=turn_state(run_id, tool_call("pay", id="c1")), turn=1,
            )  # fmt: skip
            outcomes[run_id] = None
        except Exception as exc:
            outcomes[run_id] = type(exc).__name__

    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(ask, "run_1", "B", "req_run_1")  # not B's
            tg.start_soon(ask, "run_2", "A", "req_run_0")  # that id is run_0's
            for run_id in runs[3:]:
                tg.start_soon(ask, run_id, "A", f"req_{run_id}")
    assert outcomes == {
        "run_1": "LeaseLostError",
        "run_2": "UsageError",
        **{run_id: None for run_id in runs[3:]},
    }
    for run_id in runs[1:]:
        stored = await store.load(run_id)
        written = run_id not in ("run_1", "run_2")
        assert (stored.turn, "c1" in stored.requests) == (int(written), written), run_id
