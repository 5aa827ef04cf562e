"""An answer the host took is applied, whatever happens between its commit and its run.

``DurableHost.answer`` commits the answer, then hands it to the run parked here. These
tests put something between the two: the run halting on its ``park_timeout``, the caller
being cancelled, the run having moved to another host. Each time the committed answer
must reach the run (it ends done, the tool ran once), and only the run's holder may wake
it. The store's acknowledgement is held back with events, never with sleeps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import TaskGroup

from tests.conftest import assert_no_leaks
from tests.shared import raw_sql
from tests.test_host import LIMIT, Pay, host_for, model, until
from toolnexus_async import (
    AlreadyAnsweredError,
    Answer,
    Inbox,
    LlmClient,
    Message,
    Request,
    RunResult,
    ToolReturn,
)
from toolnexus_async.durable import Accepted, DurableHost, LeaseLostError, SqliteRunStore
from toolnexus_async.testing import reply, tool_call


class LateAck(SqliteRunStore):
    """A store whose ``accept`` commits at once but tells its caller only when let: a slow
    disk, or a database far away."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.committed = anyio.Event()
        self.tell = anyio.Event()

    async def accept(
        self, answer: Answer, now: float, *, delivered: bool = False, by: str | None = None
    ) -> Accepted:
        taken = await super().accept(answer, now, delivered=delivered, by=by)
        self.committed.set()
        await self.tell.wait()
        return taken


async def start_parked(
    tg: TaskGroup, host: DurableHost, inbox: Inbox, into: list[RunResult]
) -> Request:
    """Start ``host.run("pay")`` in ``tg`` (its result goes to ``into``); the request it
    parks on."""

    async def run() -> None:
        into.append(await host.run("pay"))

    tg.start_soon(run)
    await until(lambda: len(inbox) == 1)
    (request,) = inbox.pending()
    return request


async def test_an_answer_committed_while_its_run_halts_resumes_the_run(tmp_path: Path):
    """The park timeout fires between the answer's commit and its hand-over: the run halts
    without it, and the sweep resumes it with the committed answer."""
    pay = Pay()
    results: list[RunResult] = []
    halted: list[RunResult] = []
    inbox = Inbox(park_timeout=0.05)
    with anyio.fail_after(LIMIT):
        async with (
            LateAck(tmp_path / "runs.db") as store,
            LlmClient.in_process(model, wait_for=inbox) as client,
            host_for(client, pay, store, on_result=results.append) as host,
            anyio.create_task_group() as tg,
        ):
            request = await start_parked(tg, host, inbox, halted)
            tg.start_soon(host.answer, Answer(request.id, True))
            await store.committed.wait()
            await until(lambda: bool(halted))  # halted on the park timeout, unanswered
            store.tell.set()
            await until(lambda: bool(results))
            with pytest.raises(AlreadyAnsweredError):
                await host.answer(Answer(request.id, True))
    assert halted[0].status == "pending"
    assert (results[0].run_id, results[0].status) == (halted[0].run_id, "done")
    assert len(pay.paid) == 1
    assert_no_leaks()


async def test_an_answer_whose_caller_is_cancelled_after_the_commit_still_wakes_the_run(
    tmp_path: Path,
):
    """A web handler whose client hung up is cancelled while the store acknowledges: the
    answer is committed all the same, so the parked run gets it (by the host's next look)."""
    pay = Pay()
    done: list[RunResult] = []
    inbox = Inbox()
    with anyio.fail_after(LIMIT):
        async with (
            LateAck(tmp_path / "runs.db") as store,
            LlmClient.in_process(model, wait_for=inbox) as client,
            host_for(client, pay, store) as host,
            anyio.create_task_group() as tg,
        ):
            request = await start_parked(tg, host, inbox, done)
            cancelled: list[bool] = []

            async def answer() -> None:
                with anyio.CancelScope() as scope:
                    tg.start_soon(cancel_when_committed, scope)
                    await host.answer(Answer(request.id, True))
                cancelled.append(scope.cancelled_caught)

            async def cancel_when_committed(scope: anyio.CancelScope) -> None:
                await store.committed.wait()
                scope.cancel()

            tg.start_soon(answer)
            await until(lambda: bool(done))
            store.tell.set()
            with pytest.raises(AlreadyAnsweredError):
                await host.answer(Answer(request.id, True))
    assert cancelled == [True]
    assert done[0].status == "done" and done[0].text == "result: paid"
    assert len(pay.paid) == 1
    assert_no_leaks()


async def test_an_answer_given_to_a_stale_host_reaches_the_host_that_holds_the_run(
    tmp_path: Path,
):
    """Host A stops renewing its lease (a frozen process) with a run parked; host B takes
    the run over and parks the same request. An answer given to A, back again, must not wake
    A's stale copy: B, the run's holder, goes on with it."""
    path = tmp_path / "runs.db"
    pay_a, pay_b = Pay(), Pay()
    inbox_a, inbox_b = Inbox(), Inbox()
    finished: list[RunResult] = []
    with anyio.fail_after(LIMIT):
        async with (
            SqliteRunStore(path) as store_a,
            SqliteRunStore(path) as store_b,
            LlmClient.in_process(model, wait_for=inbox_a) as client_a,
            LlmClient.in_process(model, wait_for=inbox_b) as client_b,
            host_for(client_a, pay_a, store_a, worker="A", lease=0.3) as host_a,
            anyio.create_task_group() as tg,
        ):
            stale: list[Any] = []

            async def run_on_a() -> None:
                try:
                    stale.append(await host_a.run("pay"))
                except LeaseLostError as exc:  # its halt, on shutdown: refused, as it must be
                    stale.append(exc)

            tg.start_soon(run_on_a)
            await until(lambda: len(inbox_a) == 1)
            (request,) = inbox_a.pending()

            async def frozen(owner: str, lease_until: float) -> None:
                pass

            renew = store_a.renew
            store_a.renew = frozen  # type: ignore[method-assign]
            async with host_for(client_b, pay_b, store_b, worker="B", on_result=finished.append):
                await until(lambda: len(inbox_b) == 1)  # A's lease ran out: B took over
                store_a.renew = renew  # type: ignore[method-assign]
                await host_a.answer(Answer(request.id, True))
                await until(lambda: bool(finished))
                assert inbox_a.get(request.id) is not None  # A's stale copy was not woken
                assert pay_a.paid == []
            host_a.shutdown()
    assert finished[0].status == "done" and len(pay_b.paid) == 1
    assert len(stale) == 1 and isinstance(stale[0], LeaseLostError)
    assert_no_leaks()


def both(messages: list[Message], tools: list[Any]) -> Any:
    """Calls pay twice in one turn, then reports."""
    returns = [m.output for m in messages if isinstance(m, ToolReturn)]
    if returns:
        return "results: " + ", ".join(returns)
    return reply(tool_call("pay", id="c1"), tool_call("pay", id="c2"))


async def test_an_answer_handed_over_here_is_marked_delivered_at_the_next_look(tmp_path: Path):
    """The store keeps an answer undelivered until the run has it; once it has, the host
    marks it (in one write, at its next look), even while the run waits on another call of
    the same turn: a halt there must not resume the run for an answer it used already."""
    path = tmp_path / "runs.db"
    pay = Pay()
    inbox = Inbox()
    done: list[RunResult] = []
    with anyio.fail_after(LIMIT):
        async with (
            SqliteRunStore(path) as store,
            LlmClient.in_process(both, wait_for=inbox) as client,
            host_for(client, pay, store) as host,
            anyio.create_task_group() as tg,
        ):

            async def run() -> None:
                done.append(await host.run("pay twice"))

            tg.start_soon(run)
            await until(lambda: len(inbox) == 2)
            first, second = inbox.pending()
            await host.answer(Answer(first.id, True))
            await until(lambda: len(pay.paid) == 1)
            delivered = "SELECT delivered FROM requests WHERE request_id = ?"
            await until(lambda: raw_sql(path, delivered, first.id) == [(1,)])
            assert raw_sql(path, delivered, second.id) == [(None,)]  # still pending
            assert inbox.pending() == [second]
            await host.answer(Answer(second.id, True))
            await until(lambda: bool(done))
    assert done[0].text == "results: paid, paid" and len(pay.paid) == 2
    assert_no_leaks()
