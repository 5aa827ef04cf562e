"""A durable host rides out its store's faults: nothing lost, nothing run twice.

The store here is a ``MemoryRunStore`` whose every call fails with
``StoreUnavailableError`` while a switch is on: the fault as the host sees it, at the exact
step a test chooses (a tool mid-execution, a parked run, a renewal). The same promises
against a real PostgreSQL stopped and restarted, and SQLite on a full disk or a locked
file, are in ``tests/test_pg_faults.py`` and ``tests/test_sqlite_faults.py``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import TaskGroup

from tests.conftest import assert_no_leaks
from tests.shared import raw_sql
from tests.test_host import LIMIT, Pay, host_for, model, until
from toolnexus_async import (
    Answer,
    DamagedRunError,
    Inbox,
    LlmClient,
    Message,
    Request,
    RunResult,
    StoreUnavailableError,
    Toolkit,
    ToolResult,
    ToolReturn,
    define_tool,
)
from toolnexus_async.durable import DurableHost, LeaseLostError, MemoryRunStore, SqliteRunStore
from toolnexus_async.testing import reply, tool_call

_CALLS = (
    "start turn record suspend halt finish fail release save accept claim renew ready"
    " deliveries delivered requests outstanding find load runs ping"
).split()


class Outage(MemoryRunStore):
    """A memory store that can be cut off: while ``down``, every call fails as a database
    that went away does (``direct`` reaches the store itself, as another worker could).
    With ``lose_in_flight``, so does a call in flight when it went: its reply is lost,
    though what it wrote is kept."""

    def __init__(self, *, lose_in_flight: bool = False) -> None:
        super().__init__()
        self.down = False
        self.refused = 0
        self.lose_in_flight = lose_in_flight

    def cut(self) -> None:
        self.down = True

    def lost(self) -> bool:
        """Whether a call that began while the store was up loses its reply."""
        return self.down and self.lose_in_flight

    def mend(self) -> None:
        self.down = False


def _cut_off(name: str) -> Any:
    async def call(self: Outage, *args: Any, **kwargs: Any) -> Any:
        if self.down:
            self.refused += 1
            raise StoreUnavailableError("postgresql 127.0.0.1:5432/test: failed (test outage)")
        done = await getattr(MemoryRunStore, name)(self, *args, **kwargs)
        if self.lost():
            self.refused += 1
            raise StoreUnavailableError("postgresql 127.0.0.1:5432/test: the reply was lost")
        return done

    call.__name__ = name
    return call


for _name in _CALLS:
    setattr(Outage, _name, _cut_off(_name))


async def direct(store: Outage, name: str, *args: Any) -> Any:
    """A call on the store that is not cut off: what another worker that reaches it does."""
    return await getattr(MemoryRunStore, name)(store, *args)


async def parked_then_cut_off(
    host: DurableHost, store: Outage, tg: TaskGroup, *, lapse: float
) -> tuple[Request, list[BaseException | RunResult]]:
    """Start a run of "pay" on ``host`` (its result, or the ``LeaseLostError`` that stopped
    it, goes into the list returned), wait until it parks, then cut the store off for
    ``lapse`` seconds (the host's lease runs out meanwhile). Returns its request."""
    outcome: list[BaseException | RunResult] = []

    async def run() -> None:
        try:
            outcome.append(await host.run("pay"))
        except LeaseLostError as exc:
            outcome.append(exc)

    tg.start_soon(run)
    inbox = host.inbox
    assert inbox is not None
    await until(lambda: len(inbox) == 1)
    (request,) = inbox.pending()
    store.cut()
    stale = time.time() + lapse
    await until(lambda: time.time() > stale)
    return request, outcome


async def refusals(store: Outage, more: int) -> None:
    """Until the host was refused ``more`` more times: it is retrying, not giving up."""
    target = store.refused + more
    await until(lambda: store.refused >= target)


async def test_a_result_written_during_an_outage_is_kept_once_the_store_is_back(
    caplog: pytest.LogCaptureFixture,
):
    """The store goes away while a tool executes: its result waits in memory, the write is
    retried, the run finishes once the store is back, the tool ran once, and the outage
    is one warning and one line, not a traceback per retry."""
    # A renewal in flight when the store went away must not end the outage early by
    # committing after it (it did, once, in a loaded CI run): as a database's, its reply
    # is lost.
    store = Outage(lose_in_flight=True)
    ran: list[str] = []

    @define_tool
    async def work() -> ToolResult:
        """Does something that must happen once."""
        ran.append("work")
        store.cut()  # the database goes away while the tool executes
        return ToolResult.ok("worked")

    def once(messages: list[Message], tools: list[Any]) -> Any:
        if isinstance(messages[-1], ToolReturn):
            return f"result: {messages[-1].output}"
        return reply(tool_call("work", id="c1"))

    caplog.set_level(logging.INFO, logger="toolnexus_async.durable")
    with anyio.fail_after(LIMIT):
        async with (
            store,
            Toolkit.create(builtins=False, extra_tools=[work]) as toolkit,
            LlmClient.in_process(once) as client,
            DurableHost(client, toolkit, store, lease=0.6, sweep=0.02) as host,
            anyio.create_task_group() as tg,
        ):
            results: list[RunResult] = []

            async def run() -> None:
                results.append(await host.run("go"))

            tg.start_soon(run)
            await until(lambda: ran)
            await refusals(store, 10)  # well past the first failure: still waiting
            assert not results
            (summary,) = await direct(store, "runs")
            assert summary.status == "running"  # not failed: a fault is no verdict
            store.mend()
            await until(lambda: results)
    assert results[0].text == "result: worked" and ran == ["work"]
    lines = [r.getMessage() for r in caplog.records if r.name == "toolnexus_async.durable"]
    assert sum("unavailable" in line for line in lines) == 1, lines
    assert sum("is back after" in line for line in lines) == 1, lines
    assert not any(r.exc_info for r in caplog.records), "no traceback for a passing fault"
    assert_no_leaks()


async def test_a_lapsed_lease_is_proven_again_before_the_next_tool_call():
    """A parked run's worker loses the store for longer than its lease; another worker
    takes the run meanwhile. When the answer reaches the parked run here, the call does
    not execute: the run checks it still holds the run, and stops (the other worker goes
    on with it)."""
    pay = Pay()
    store = Outage()
    with anyio.fail_after(LIMIT):
        async with (
            store,
            LlmClient.in_process(model, wait_for=Inbox()) as client,
            host_for(client, pay, store, lease=0.6) as host,
            anyio.create_task_group() as tg,
        ):
            request, outcome = await parked_then_cut_off(host, store, tg, lapse=0.7)
            (run_id,) = [r.run_id for r in await direct(store, "runs")]
            # Another worker, which reaches the store, takes the run over.
            taken = await direct(store, "claim", run_id, "thief", time.time() + 60, time.time())
            assert taken is not None
            store.mend()
            assert host.inbox is not None
            await host.inbox.answer(Answer(request.id, True))  # it reaches the parked run here
            await until(lambda: outcome)
    assert isinstance(outcome[0], LeaseLostError) and "thief" in str(outcome[0])
    assert pay.paid == []  # the call did not execute here: the thief's run will pay, once


async def test_a_lapsed_lease_nobody_took_goes_on_once_renewed(
    caplog: pytest.LogCaptureFixture,
):
    pay = Pay()
    store = Outage()
    with anyio.fail_after(LIMIT):
        async with (
            store,
            LlmClient.in_process(model, wait_for=Inbox()) as client,
            host_for(client, pay, store, lease=0.6) as host,
            anyio.create_task_group() as tg,
        ):
            request, results = await parked_then_cut_off(host, store, tg, lapse=0.7)
            assert host.inbox is not None
            await host.inbox.answer(Answer(request.id, True))  # while the lease cannot be proven
            await refusals(store, 5)
            assert pay.paid == []  # the call waits for a renewal
            store.mend()
            await until(lambda: results)
    assert isinstance(results[0], RunResult) and results[0].text == "result: paid"
    assert len(pay.paid) == 1
    # Renewals, sweeps and hand-overs all met the outage: not one traceback for it.
    assert not any(r.exc_info for r in caplog.records)


async def test_after_an_outage_a_live_workers_run_is_not_taken_over():
    """Every lease in the store ran out during the outage. The first worker to see the
    store again does not take the other's parked run: it waits until live workers had
    time to renew. The run goes on where it was, and pays once."""
    pay_a, pay_b = Pay(), Pay()
    store = Outage()
    with anyio.fail_after(LIMIT):
        async with (
            store,
            LlmClient.in_process(model, wait_for=Inbox()) as client_a,
            LlmClient.in_process(model, wait_for=Inbox()) as client_b,
            host_for(client_a, pay_a, store, lease=1.2, worker="a") as a,
            host_for(client_b, pay_b, store, lease=1.2, worker="b") as b,
            anyio.create_task_group() as tg,
        ):
            # Past the lease: every lease in the store ran out.
            request, results = await parked_then_cut_off(b, store, tg, lapse=1.4)
            store.mend()
            # Until a's grace is over, and a's sweep looked at the store twice after it.
            await until(lambda: a._tenure.may_take_over())
            looked = store.refused  # unchanged from here: the store is up
            readies = 0
            original = store.ready

            async def counted(now: float, limit: int) -> list[str]:
                nonlocal readies
                readies += 1
                return await original(now, limit)

            store.ready = counted  # type: ignore[method-assign]
            await until(lambda: readies >= 2)
            assert store.refused == looked
            (stored,) = [await direct(store, "load", r.run_id) for r in await store.runs()]
            assert stored.owner == "b"
            await a.answer(Answer(request.id, True))  # taken on a, handed over by b
            await until(lambda: results)
    assert isinstance(results[0], RunResult) and results[0].text == "result: paid"
    assert (len(pay_a.paid), len(pay_b.paid)) == (0, 1)


async def test_a_failure_the_store_cannot_take_now_is_recorded_once_it_is_back():
    """The model fails while the store is down: the run's failure (its own, not the
    store's) is recorded once the store is back; the run never stays held and idle."""
    store = Outage()

    def broken(messages: list[Message], tools: list[Any]) -> Any:
        if isinstance(messages[-1], ToolReturn):
            store.cut()
            raise RuntimeError("model down")
        return reply(tool_call("work", id="c1"))

    @define_tool
    async def work() -> ToolResult:
        """Works."""
        return ToolResult.ok("worked")

    with anyio.fail_after(LIMIT):
        async with (
            store,
            Toolkit.create(builtins=False, extra_tools=[work]) as toolkit,
            LlmClient.in_process(broken) as client,
            DurableHost(client, toolkit, store, lease=0.6, sweep=0.02) as host,
        ):
            recorded: list[str] = []
            original = store.fail

            async def fail(run_id: str, error: str, owner: str) -> None:
                await original(run_id, error, owner)
                recorded.append(error)

            store.fail = fail  # type: ignore[method-assign]
            with pytest.raises(RuntimeError, match="model down"):
                await host.run("go")
            (summary,) = await direct(store, "runs")
            assert summary.status == "running"  # not written yet: the store is down
            store.mend()
            await until(lambda: recorded)  # the background records it at its next look
            (summary,) = await store.runs()
    assert recorded == ["RuntimeError: model down"]
    assert (summary.status, summary.error) == ("error", "RuntimeError: model down")


async def test_an_answer_to_a_damaged_run_is_refused_and_the_run_failed_once(tmp_path: Path):
    """A stored run that does not parse: the answer is refused naming the run
    (DamagedRunError), the run is failed with the reason, and no sweep tries it again."""
    pay = Pay()
    path = tmp_path / "runs.db"
    async with SqliteRunStore(path) as store, LlmClient.in_process(model) as client:
        halted = await client.run("pay", pay.toolkit)
        assert halted.pending is not None and halted.run_id is not None
        await store.save(halted)
        raw_sql(path, "UPDATE runs SET state = '{not json' WHERE run_id = ?", halted.run_id)
        async with host_for(client, pay, store) as host:
            with pytest.raises(DamagedRunError, match=halted.run_id) as caught:
                await host.answer(Answer(halted.pending.id, True))
            assert caught.value.run_id == halted.run_id
            (summary,) = await store.runs()
            assert summary.status == "error" and "cannot be read back" in (summary.error or "")
            assert await store.ready(time.time() + 3600, 10) == []
    assert pay.paid == []
    assert_no_leaks()


async def test_a_run_begun_while_the_store_fails_never_runs_unacknowledged():
    """``begin`` fails (its caller is told: a 503) although the store committed the run,
    its reply lost. That run is not driven, not left held here, and not resumed by anyone:
    the host records it as failed once the store answers."""
    store = Outage()
    pay = Pay()

    async def lost_reply(state: Any, owner: str, lease_until: float, turn: int = 0) -> None:
        await MemoryRunStore.start(store, state, owner, lease_until, turn)
        raise StoreUnavailableError("the connection dropped before the commit was confirmed")

    store.start = lost_reply  # type: ignore[method-assign]
    with anyio.fail_after(LIMIT):
        async with (
            store,
            LlmClient.in_process(model) as client,
            host_for(client, pay, store) as host,
        ):
            with pytest.raises(StoreUnavailableError):
                await host.begin("pay")

            async def failed() -> list[Any]:
                return [r for r in await store.runs() if r.status == "error"]

            recorded: list[Any] = []
            while not recorded:
                recorded = await failed()
                await anyio.lowlevel.checkpoint()
    assert "not started" in (recorded[0].error or "")
    assert pay.asked == 0


async def test_while_the_store_is_down_only_a_few_retried_writes_are_in_flight():
    """Ten runs wait on a locked store at once: each attempt is held up (as by a lock,
    until the store timeout) before it fails. After each run's first attempt, the retries
    queue, a couple at a time, leaving the pool to everyone else."""
    store = Outage()
    attempts: dict[str, int] = {}
    retrying = most = 0
    results: list[RunResult] = []

    @define_tool
    async def work() -> ToolResult:
        """Works."""
        store.cut()
        return ToolResult.ok("worked")

    def once(messages: list[Message], tools: list[Any]) -> Any:
        if isinstance(messages[-1], ToolReturn):
            return f"result: {messages[-1].output}"
        return reply(tool_call("work", id="c1"))

    with anyio.fail_after(LIMIT):
        async with (
            store,
            Toolkit.create(builtins=False, extra_tools=[work]) as toolkit,
            LlmClient.in_process(once) as client,
            DurableHost(client, toolkit, store, lease=0.6, sweep=0.02) as host,
            anyio.create_task_group() as tg,
        ):
            cut_off = store.record

            async def record(run_id: str, *args: Any) -> None:
                nonlocal retrying, most
                if not store.down:
                    return await MemoryRunStore.record(store, run_id, *args)
                attempts[run_id] = attempts.get(run_id, 0) + 1
                retry = attempts[run_id] > 1
                retrying += retry
                most = max(most, retrying)
                try:
                    await anyio.sleep(0.02)  # held up by the lock (the store timeout)
                    return await cut_off(run_id, *args)  # then refused
                finally:
                    retrying -= retry

            store.record = record  # type: ignore[method-assign,assignment]

            async def run() -> None:
                results.append(await host.run("go"))

            for _ in range(10):
                tg.start_soon(run)
            await until(lambda: len(attempts) == 10 and min(attempts.values()) >= 3)
            store.mend()
            await until(lambda: len(results) == 10)
    assert all(r.text == "result: worked" for r in results)
    assert most <= 2, most
