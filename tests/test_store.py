"""Run stores: the contract both stores keep, SQLite's file rules, and resume_stored."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest

from tests.conftest import assert_no_leaks
from tests.shared import Ledger, final_from_results, raw_sql
from toolnexus_async import (
    AlreadyResumedError,
    Answer,
    AnswerMismatchError,
    Hooks,
    LlmClient,
    Message,
    PayloadError,
    ProviderError,
    RetryPolicy,
    RunResult,
    StoreError,
    Toolkit,
    ToolResult,
    UnknownRequestError,
    UsageError,
)
from toolnexus_async.durable import MemoryRunStore, RunStore, SqliteRunStore, resume_stored
from toolnexus_async.testing import ScriptedModel, reply, tool_call

StoreFactory = Callable[..., RunStore]


@attrs.define
class Case:
    """A run halted on two suspended calls (pay, notify) after one completed (lookup)."""

    ledger: Ledger
    toolkit: Toolkit
    halted: RunResult

    @property
    def ids(self) -> list[str]:
        return ids_of(self.halted)


async def halt(toolkit: Toolkit) -> RunResult:
    """Run until the model's one turn (lookup, pay, notify) halts on pay and notify."""
    calls = [
        tool_call("lookup", {"invoice": "INV-1"}, id="c1"),
        tool_call("pay", {"amount": 30}, id="c2"),
        tool_call("notify", id="c3"),
    ]
    async with LlmClient.in_process(ScriptedModel(reply(*calls)), model="m") as client:
        return await client.run("pay INV-1", toolkit)


def ids_of(run: RunResult) -> list[str]:
    return [r.request.id for r in run.suspended if r.request is not None]


@pytest.fixture
async def case() -> Case:
    """A fresh ledger, its toolkit, and a run halted on it."""
    ledger = Ledger()
    toolkit = ledger.toolkit()
    return Case(ledger, toolkit, await halt(toolkit))


@pytest.fixture(params=["memory", "sqlite"])
async def make_store(request: Any, tmp_path: Path) -> AsyncIterator[StoreFactory]:
    """A factory of stores of one kind; every store it made is closed afterwards."""
    made: list[RunStore] = []

    def make(**options: Any) -> RunStore:
        store: RunStore
        if request.param == "sqlite":
            store = SqliteRunStore(tmp_path / "runs.db", **options)
        else:
            store = MemoryRunStore(**options)
        made.append(store)
        return store

    yield make
    for store in made:
        await store.aclose()


@pytest.fixture
def store(make_store: StoreFactory) -> RunStore:
    """One store of each kind (the suite runs once per kind)."""
    return make_store()


async def test_a_saved_run_loads_under_each_request_id_as_a_fresh_object(store, case):
    """Every outstanding request id finds the whole run; each load is a new object."""
    await store.save(case.halted)

    first, second = [await store.load(i) for i in case.ids]

    assert first == case.halted and second == case.halted
    assert first is not case.halted and first is not second
    assert isinstance(store, RunStore)


async def test_requests_lists_outstanding_requests_oldest_save_first(store, case):
    """Runs in save order, each run's requests in call order; a re-save counts as new."""
    a, b = case.halted, await halt(case.toolkit)
    await store.save(a)
    await store.save(b)

    assert [r.id for r in await store.requests()] == ids_of(a) + ids_of(b)
    await store.save(a)
    assert [r.id for r in await store.requests()] == ids_of(b) + ids_of(a)
    assert [r.kind for r in await store.requests()] == ["approval", "input"] * 2


async def test_saving_a_run_again_replaces_it_and_its_request_ids(store, case):
    """A run that halted again is filed under its new ids only."""
    await store.save(case.halted)
    answer = Answer(case.ids[1], True, data={"who": "Cy"})
    async with LlmClient.in_process(ScriptedModel()) as client:
        again = await client.resume(case.halted, case.toolkit, answer)
    assert again.run_id == case.halted.run_id and ids_of(again)[0] not in case.ids

    await store.save(again)

    assert await store.load(ids_of(again)[0]) == again
    for old in case.ids:
        with pytest.raises(UnknownRequestError):
            await store.load(old)
    assert [r.id for r in await store.requests()] == ids_of(again)


async def test_claim_takes_the_whole_run_exactly_once(store, case):
    """Claiming by one id removes the run; any of its ids then says AlreadyResumedError."""
    await store.save(case.halted)

    assert await store.claim(case.ids[1]) == case.halted

    for request_id in case.ids:
        with pytest.raises(AlreadyResumedError, match=request_id) as caught:
            await store.claim(request_id)
        assert caught.value.request_id == request_id
        with pytest.raises(AlreadyResumedError):
            await store.load(request_id)
    assert await store.requests() == []
    # An id never stored is neither loaded nor claimed.
    with pytest.raises(UnknownRequestError, match="nope"):
        await store.load("nope")
    with pytest.raises(UnknownRequestError, match="nope"):
        await store.claim("nope")


async def test_two_concurrent_claims_of_one_run_let_exactly_one_win(store, case):
    """Two tasks claim the run through its two ids at once: one run, one AlreadyResumedError."""
    await store.save(case.halted)
    outcomes: list[object] = []

    async def claim(request_id: str) -> None:
        try:
            outcomes.append(await store.claim(request_id))
        except AlreadyResumedError as exc:
            outcomes.append(exc)

    async with anyio.create_task_group() as tg:
        for request_id in case.ids:
            tg.start_soon(claim, request_id)

    assert case.halted in outcomes
    assert sorted(type(o).__name__ for o in outcomes) == ["AlreadyResumedError", "RunResult"]


async def test_only_a_halted_json_run_with_its_own_ids_is_stored(store, case):
    """Refused at save, storing nothing: a finished run, non-JSON metadata, a taken id."""
    done = attrs.evolve(case.halted, status="done", suspended=(), pending=None)
    with pytest.raises(UsageError, match="halted"):
        await store.save(done)
    lookup = case.halted.tool_calls[0]
    odd = attrs.evolve(lookup, result=ToolResult.ok("x", metadata={"when": object()}))
    with pytest.raises(PayloadError, match="metadata"):
        await store.save(attrs.evolve(case.halted, tool_calls=(odd,)))
    assert await store.requests() == []

    await store.save(case.halted)
    with pytest.raises(UsageError, match="already filed"):
        await store.save(attrs.evolve(case.halted, run_id="someone-else"))
    assert (await store.load(case.ids[0])).run_id == case.halted.run_id


async def test_claimed_ids_are_remembered_within_a_bound(make_store, case):
    """With remember=2, the oldest tombstones are forgotten and become unknown."""
    store = make_store(remember=2)
    second = await halt(case.toolkit)
    for run in (case.halted, second):
        await store.save(run)
        await store.claim(ids_of(run)[0])

    for forgotten in case.ids:
        with pytest.raises(UnknownRequestError):
            await store.claim(forgotten)
    for remembered in ids_of(second):
        with pytest.raises(AlreadyResumedError):
            await store.claim(remembered)


async def test_a_closed_store_refuses_work(make_store):
    """After aclose (via async with), every operation is a usage error."""
    async with make_store() as store:
        assert await store.requests() == []

    with pytest.raises(UsageError, match="closed"):
        await store.requests()
    with pytest.raises(UsageError, match="closed"):
        await store.load("x")
    with pytest.raises(UsageError, match="run store is closed"):
        async with store:
            pass
    await store.aclose()  # idempotent


# SQLite: the file, its rows, other connections.


def put_row(path: Path, run_id: str, body: str, request_id: str) -> None:
    raw_sql(path, "INSERT INTO runs (run_id, created, body) VALUES (?, 0, ?)", run_id, body)
    raw_sql(path, "INSERT INTO requests (request_id, run_id) VALUES (?, ?)", request_id, run_id)


async def test_corrupt_and_foreign_rows_fail_alone(tmp_path: Path, case, caplog):
    """Bad JSON, a wrong version, another run's body: StoreError naming the run; others load."""
    path, good = tmp_path / "runs.db", case.halted
    async with SqliteRunStore(path) as store:
        await store.save(good)
        put_row(path, "broken", "{not json", "r-broken")
        put_row(path, "old", json.dumps({**good.to_dict(), "version": 9, "run_id": "old"}), "r-old")
        put_row(path, "thief", json.dumps(good.to_dict()), "r-x")

        with pytest.raises(StoreError, match=r"'broken'.*not valid JSON"):
            await store.load("r-broken")
        with pytest.raises(StoreError, match=r"'old'.*version"):
            await store.claim("r-old")
        with pytest.raises(StoreError, match=r"'thief'.*another run"):
            await store.load("r-x")
        for _ in range(2):  # a failed claim leaves the row for a human: still there, unclaimed
            with pytest.raises(StoreError, match="'broken'"):
                await store.claim("r-broken")
        with caplog.at_level(logging.WARNING, logger="toolnexus_async.durable"):
            assert [r.id for r in await store.requests()] == case.ids
        assert "'broken'" in caplog.text and "'old'" in caplog.text
        assert await store.claim(case.ids[1]) == good
    assert_no_leaks()


@pytest.mark.parametrize("kind", ["newer schema", "other application", "not a database"])
async def test_a_file_not_ours_or_newer_is_refused_and_not_touched(tmp_path, case, kind):
    """A newer schema, another program's SQLite file, no SQLite at all: StoreError, no write."""
    path = tmp_path / "runs.db"
    if kind == "newer schema":
        async with SqliteRunStore(path) as store:
            await store.save(case.halted)
        raw_sql(path, "PRAGMA user_version = 2")
    elif kind == "other application":
        raw_sql(path, "CREATE TABLE notes (text TEXT)")
    else:
        path.write_bytes(b"definitely not sqlite " * 100)
    before = path.read_bytes()

    message = {"newer schema": r"version 2.*newer", "other application": "another application"}
    with pytest.raises(StoreError, match=message.get(kind, "cannot be opened")):
        async with SqliteRunStore(path):
            pass
    lazy = SqliteRunStore(path)
    with pytest.raises(StoreError):
        await lazy.requests()
    await lazy.aclose()
    assert path.read_bytes() == before
    assert_no_leaks()


async def test_the_file_outlives_its_store_and_aclose_ends_the_thread(tmp_path: Path, case):
    """WAL file; a run saved by one store is claimed by a later one; no thread is left."""
    path = tmp_path / "runs.db"
    before = set(threading.enumerate())
    store = SqliteRunStore(path)
    await store.save(case.halted)
    started = set(threading.enumerate()) - before
    assert started, "the store should have started its connection thread"
    await store.aclose()
    for thread in started:
        thread.join(timeout=5)
        assert not thread.is_alive()
    assert raw_sql(path, "PRAGMA journal_mode") == [("wal",)]

    async with SqliteRunStore(path) as reopened:
        assert await reopened.claim(case.ids[0]) == case.halted
    assert_no_leaks()


async def test_two_stores_on_one_file_claim_a_run_exactly_once(tmp_path: Path, case):
    """Two connections (as two processes would hold) race to claim: one wins."""
    outcomes: list[object] = []
    path = tmp_path / "runs.db"
    async with SqliteRunStore(path) as one, SqliteRunStore(path) as two:
        await one.save(case.halted)

        async def claim(store: SqliteRunStore, request_id: str) -> None:
            try:
                outcomes.append(await store.claim(request_id))
            except AlreadyResumedError as exc:
                outcomes.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(claim, one, case.ids[0])
            tg.start_soon(claim, two, case.ids[1])

    assert sorted(type(o).__name__ for o in outcomes) == ["AlreadyResumedError", "RunResult"]
    assert_no_leaks()


# resume_stored: claim, resume, save what halts again, put back what fails.


def both_answers(case: Case, who: str) -> list[Answer]:
    return [Answer(case.ids[0], True), Answer(case.ids[1], True, data={"who": who})]


async def test_resume_stored_finishes_a_stored_run_and_removes_it(store, case):
    """Halt without wait_for, save, answer both requests from the store: done, store empty."""
    await store.save(case.halted)

    async with LlmClient.in_process(ScriptedModel(final_from_results)) as client:
        result = await resume_stored(client, case.toolkit, store, both_answers(case, "Ann"))

    assert result.status == "done"
    assert result.text == "c1=INV-1: 30 EUR | c2=paid 30 | c3=notified Ann"
    assert (case.ledger.looked_up, case.ledger.paid) == (1, [30])
    assert await store.requests() == []
    with pytest.raises(AlreadyResumedError):
        await store.load(case.ids[0])
    assert_no_leaks()


async def test_a_run_that_halts_again_is_saved_under_its_new_request(store, case):
    """Answering only notify: pay suspends again, and the store holds that new request."""
    await store.save(case.halted)
    answer = Answer(case.ids[1], True, data={"who": "Cy"})

    async with LlmClient.in_process(ScriptedModel()) as client:
        again = await resume_stored(client, case.toolkit, store, answer)

    assert again.status == "pending"
    [new_id] = ids_of(again)
    assert new_id not in case.ids
    assert [r.id for r in await store.requests()] == [new_id]
    assert await store.load(new_id) == again
    with pytest.raises(AlreadyResumedError):
        await store.claim(case.ids[0])
    assert case.ledger.paid == []


async def test_a_resume_refused_before_its_tools_ran_puts_the_run_back(store, case):
    """A foreign extra answer: nothing ran, and the run is back, resumable."""
    await store.save(case.halted)
    answers = both_answers(case, "Di")

    async with LlmClient.in_process(ScriptedModel()) as client:
        with pytest.raises(AnswerMismatchError):
            await resume_stored(client, case.toolkit, store, [answers[0], Answer("x", True)])
    assert await store.load(case.ids[0]) == case.halted
    assert case.ledger.paid == []

    async with LlmClient.in_process(ScriptedModel(final_from_results)) as client:
        assert (await resume_stored(client, case.toolkit, store, answers)).status == "done"
    assert await store.requests() == []


async def test_a_model_failure_after_the_tools_ran_never_runs_them_twice(store, case):
    """The provider fails after the answered calls ran: the run is not put back (that would
    pay again); the error carries the state, and continuing from it does not pay again."""
    await store.save(case.halted)
    answers = both_answers(case, "Di")

    def provider_down(messages: list[Message], tools: list[Any]) -> str:
        raise ProviderError(503, "overloaded", "http://model")

    async with LlmClient.in_process(provider_down, retry=RetryPolicy(retries=0)) as client:
        with pytest.raises(ProviderError) as caught:
            await resume_stored(client, case.toolkit, store, answers)
    paid = list(case.ledger.paid)
    assert paid != []
    assert await store.requests() == []
    state = caught.value.run
    assert state is not None
    assert state.status == "incomplete" and state.limit == "model_error"

    async with LlmClient.in_process(ScriptedModel(final_from_results)) as client:
        result = await client.run(None, case.toolkit, history=state.messages)
    assert result.status == "done"
    assert case.ledger.paid == paid


async def test_two_concurrent_resumes_run_the_tools_once(store, case):
    """Two handlers answer the same request at once: one resumes, one gets AlreadyResumedError."""
    await store.save(case.halted)
    outcomes: list[str] = []

    async def resume() -> None:
        async with LlmClient.in_process(ScriptedModel(final_from_results)) as client:
            try:
                answers = both_answers(case, "Ed")
                outcomes.append((await resume_stored(client, case.toolkit, store, answers)).status)
            except AlreadyResumedError:
                outcomes.append("refused")

    async with anyio.create_task_group() as tg:
        tg.start_soon(resume)
        tg.start_soon(resume)

    assert sorted(outcomes) == ["done", "refused"]
    assert case.ledger.paid == [30]


async def test_resume_stored_needs_a_known_answer(store, case):
    """No answer is a usage error; an unknown id is UnknownRequestError and runs nothing."""
    await store.save(case.halted)
    async with LlmClient.in_process(ScriptedModel()) as client:
        with pytest.raises(UsageError, match="at least one"):
            await resume_stored(client, case.toolkit, store, [])
        with pytest.raises(UnknownRequestError):
            await resume_stored(client, case.toolkit, store, Answer("nobody", True))
    assert await store.load(case.ids[0]) == case.halted
    assert case.ledger.looked_up == 1


async def test_a_resume_cancelled_after_its_tools_ran_is_not_put_back(store, case):
    """A time limit cuts the resume short while the model is asked, after the answered calls
    ran: putting the old state back would run them again, so the request is consumed."""
    await store.save(case.halted)
    with anyio.CancelScope() as scope:

        async def stalls(messages: list[Message], tools: list[Any]) -> str:
            scope.cancel()  # as a deadline firing here would
            await anyio.sleep_forever()
            raise AssertionError("unreachable")

        async with LlmClient.in_process(stalls) as client:
            await resume_stored(client, case.toolkit, store, both_answers(case, "Fa"))

    assert scope.cancelled_caught
    paid = list(case.ledger.paid)
    assert paid != []
    with pytest.raises(AlreadyResumedError):
        await store.claim(case.ids[0])
    assert case.ledger.paid == paid
    assert_no_leaks()


async def test_a_resume_cancelled_before_its_tools_ran_puts_the_run_back(store, case):
    """Cancelled while the answered tool is still waiting to finish: nothing completed, so
    the claimed run goes back and can be resumed again."""
    await store.save(case.halted)
    gate = anyio.Event()
    blocked = ScriptedModel(final_from_results)

    class Hold:
        async def __call__(self, name: str, args: dict[str, Any], ctx: Any) -> None:
            gate.set()
            await anyio.sleep_forever()

    with anyio.CancelScope() as scope:
        async with LlmClient.in_process(blocked, hooks=Hooks(before_tool=Hold())) as client:
            async with anyio.create_task_group() as tg:

                async def go() -> None:
                    await resume_stored(client, case.toolkit, store, both_answers(case, "Ga"))

                tg.start_soon(go)
                await gate.wait()
                scope.cancel()

    assert await store.load(case.ids[0]) == case.halted
    assert case.ledger.paid == []
    assert_no_leaks()
