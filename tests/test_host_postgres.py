"""Durable hosts as workers on one PostgreSQL database (a real server: tests/pg.py).

An answer taken by any worker wakes the run parked on another at once (LISTEN/NOTIFY, not
the poll: the poll is set to a minute here); of conflicting answers sent to two workers one
is taken and the run follows it; a worker that dies is taken over once its lease ran out,
and its recorded work is not done again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio

from tests.test_host import LIMIT, Pay, host_for, model, take_over_a_dead_host, until
from toolnexus_async import AlreadyAnsweredError, Answer, Inbox, LlmClient, Request, RunResult
from toolnexus_async.durable import DurableHost, PostgresRunStore

MINUTE = 60.0


@asynccontextmanager
async def parked_on_a(
    pg_dsn: str, pay: Pay, done: list[RunResult], **host: Any
) -> AsyncIterator[tuple[DurableHost, DurableHost, Request]]:
    """Workers A and B on one database (each its own store, as two processes); a run of A
    parked on its approval. Yields both and the request; ``done`` gets the run's result."""
    inbox_a = Inbox()
    async with (
        PostgresRunStore(pg_dsn) as store_a,
        PostgresRunStore(pg_dsn) as store_b,
        LlmClient.in_process(model, wait_for=inbox_a) as client_a,
        LlmClient.in_process(model, wait_for=Inbox()) as client_b,
        host_for(client_a, pay, store_a, **host) as a,
        host_for(client_b, pay, store_b, **host) as b,
        anyio.create_task_group() as tg,
    ):

        async def drive() -> None:
            done.append(await a.run("pay"))

        tg.start_soon(drive)
        await until(lambda: len(inbox_a) == 1)
        (request,) = inbox_a.pending()
        yield a, b, request
        await until(lambda: bool(done))


async def test_an_answer_taken_by_one_worker_wakes_the_run_parked_on_another(pg_dsn: str):
    pay = Pay()
    done: list[RunResult] = []
    with anyio.fail_after(LIMIT):
        async with parked_on_a(pg_dsn, pay, done, poll=MINUTE) as (_, b, request):
            assert [r.id for r in await b.requests()] == [request.id]  # b lists a's request
            await b.answer(Answer(request.id, True))  # committed by b; a is told, not polled
    assert done[0].text == "result: paid"
    assert pay.asked == 1 and len(pay.paid) == 1


async def test_conflicting_answers_on_two_workers_take_one_and_the_run_follows_it(pg_dsn: str):
    pay = Pay()
    done: list[RunResult] = []
    taken: list[str] = []

    async def send(host: DurableHost, answer: Answer, name: str) -> None:
        try:
            await host.answer(answer)
        except AlreadyAnsweredError:
            return
        taken.append(name)

    with anyio.fail_after(LIMIT):
        async with (
            parked_on_a(pg_dsn, pay, done) as (a, b, request),
            anyio.create_task_group() as answers,
        ):
            for _ in range(5):
                answers.start_soon(send, a, Answer(request.id, False, reason="declined"), "no")
                answers.start_soon(send, b, Answer(request.id, True), "yes")
    assert len(taken) == 1
    expected = "result: paid" if taken == ["yes"] else "result: declined/expired: pay?"
    assert done[0].text == expected
    assert len(pay.paid) == (1 if taken == ["yes"] else 0)


async def test_a_dead_workers_run_is_taken_over_once_its_lease_runs_out(pg_dsn: str):
    """A worker holds a run parked in memory and stops being heard of (as if SIGKILLed):
    the answer, taken by another worker, waits for the lease; then that worker goes on with
    the run, without asking again, and the tool runs once."""
    async with PostgresRunStore(pg_dsn) as store_a, PostgresRunStore(pg_dsn) as store_b:
        await take_over_a_dead_host(
            store_a, store_b, lease=1.0
        )  # long enough for a loaded machine to renew it in time
