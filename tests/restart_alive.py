"""Helpers of the tests that restart PostgreSQL under a live worker: ``tests/``
``test_store_restart_alive_postgres.py`` and ``test_store_restart_unreplied_postgres.py``.

:class:`Pause` stops the store's group commit at a point of one write's transaction, by
the hooks ``tests/test_turn_with_request_crash_postgres.py`` uses; :func:`working` is the
worker (this process's durable host, gated ``pay``); :func:`ended_once` and
:func:`closed_clean` check what must hold once its runs ended and its store closed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest

from tests.conftest import assert_no_leaks
from tests.pg import PgCluster
from tests.test_host import until
from tests.test_pg_faults import observe
from tests.test_turn_with_request import GATE, pay_model, pay_toolkit
from toolnexus_async import (
    Answer,
    Inbox,
    LlmClient,
    Message,
    Request,
    RunResult,
    StoreUnavailableError,
)
from toolnexus_async.durable import DurableHost, PostgresRunStore
from toolnexus_async.durable.postgres import _committer
from toolnexus_async.durable.postgres._asked import Asked
from toolnexus_async.durable.postgres._pool import PgConnections

LIMIT = 60  # seconds a test may take: a cluster stopped and started twice at most
LEASE = 30.0  # far longer than a restart: the run's lease does not lapse meanwhile
MODES = ("fast", "immediate")

# A batch's write, told by its operation (a bound method of the store's statements).
Batch = list[tuple[Any, ...]]


def writes(batch: Batch, op: Callable[..., Any]) -> bool:
    return any(getattr(item[0], "__func__", None) is op for item in batch)


def turn_with_request(batch: Batch) -> bool:
    """A run's turn (not its start, which writes turn 0) written with its request."""
    return any(getattr(o, "__func__", None) is Asked.turn and a[1] > 0 for o, a, *_ in batch)


class Pause:
    """Stops the group commit once, at ``point`` of the first transaction whose batch
    ``matches`` after :meth:`arm`, until :meth:`go`; this process goes on meanwhile."""

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, point: str, matches: Callable[[Batch], bool]
    ) -> None:
        self.matches = matches
        self.armed = False
        self.paused = anyio.Event()
        self.failed: BaseException | None = None
        self.stopped: Batch | None = None
        self._go = anyio.Event()
        apply = _committer._apply
        in_transaction = PgConnections.in_transaction

        async def applied(conn: Any, batch: Batch, *rest: Any) -> Any:
            outcomes = await apply(conn, batch, *rest)
            if point == "commit" and self._take(batch):
                self.stopped = batch
                await self._stop()  # every statement ran in the transaction, not its COMMIT
            return outcomes

        async def committed(pg: PgConnections, op: Any, *args: Any) -> Any:
            try:
                outcome = await in_transaction(pg, op, *args)
            except BaseException as exc:
                if op is applied and args[0] is self.stopped:
                    self.failed = exc  # the transaction stopped at its COMMIT: its fate
                raise
            if point == "after" and op is applied and self._take(args[0]):
                await self._stop()  # committed, and nobody told
            return outcome

        monkeypatch.setattr(_committer, "_apply", applied)
        monkeypatch.setattr(PgConnections, "in_transaction", committed)

    def arm(self) -> None:
        self.armed = True

    def _take(self, batch: Batch) -> bool:
        if not self.armed or not self.matches(batch):
            return False
        self.armed = False
        return True

    async def _stop(self) -> None:
        self.paused.set()
        await self._go.wait()

    def go(self) -> None:
        self._go.set()

    def check(self, point: str) -> None:
        """The restart undid the transaction stopped before its COMMIT (the connection
        gone: a passing fault, retried), and left the one stopped after it committed."""
        if point == "commit":
            assert isinstance(self.failed, StoreUnavailableError), self.failed
        else:
            assert self.failed is None


async def restart(cluster: PgCluster, mode: str) -> None:
    """``pg_ctl stop -m <mode>``, then started again on its port."""
    await anyio.to_thread.run_sync(cluster.stop, mode)
    await anyio.to_thread.run_sync(cluster.start)


async def rows(dsn: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    found = await observe(dsn, sql, *args)
    assert found is not None, "the database is not back"
    return [tuple(row) for row in found]


async def sessions(dsn: str) -> int:
    """The sessions on the test's database, but the one that counts them."""
    ((count,),) = await rows(
        dsn,
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    return int(count)


class Worker:
    """This process's host on the store, what its model was asked and what it paid."""

    def __init__(self, host: DurableHost, inbox: Inbox, asks: list[str], paid: list[str]) -> None:
        self.host = host
        self.inbox = inbox
        self.asks = asks
        self.paid = paid
        self.results: list[RunResult] = []
        self.refused: list[StoreUnavailableError] = []  # answers the store did not take

    async def drive(self, prompt: str = "pay the invoice") -> None:
        begun = await self.host.begin(prompt)
        self.results.append(await begun.run())

    async def answer(self, request: Request) -> None:
        """Approve ``request``; a refusal for the store's fault is kept in ``refused``."""
        try:
            await self.host.answer(Answer(request.id, True))
        except StoreUnavailableError as exc:
            self.refused.append(exc)

    async def parked(self, runs: int = 1) -> list[Request]:
        """The requests the runs wait for, once ``runs`` of them are parked."""
        await until(lambda: len(self.inbox) == runs)
        return self.inbox.pending()


@asynccontextmanager
async def working(
    dsn: str, *, poll: float = 0.05, lease: float = LEASE, command_timeout: float = 5
) -> AsyncIterator[Worker]:
    asks: list[str] = []
    paid: list[str] = []

    def model(messages: list[Message], tools: list[Any]) -> Any:
        asks.append(type(messages[-1]).__name__)
        return pay_model(messages, tools)

    inbox = Inbox()
    async with (
        PostgresRunStore(dsn, command_timeout=command_timeout) as store,
        pay_toolkit(paid) as toolkit,
        LlmClient.in_process(model, wait_for=inbox, hooks=GATE) as client,
        DurableHost(client, toolkit, store, lease=lease, sweep=0.05, poll=poll) as host,
    ):
        yield Worker(host, inbox, asks, paid)


async def ended_once(dsn: str, worker: Worker, runs: int = 1) -> None:
    """Every run ended as without the restart, and the pool serves again."""
    await until(lambda: len(worker.results) == runs)
    for result in worker.results:
        assert result.status == "done" and result.text == "result: paid"
        assert len(result.tool_calls) == 1
    assert worker.paid == ["paid"] * runs  # each run's tool ran once
    # Each turn asked for once: the live worker kept the turn the restart undid.
    assert sorted(worker.asks) == ["ToolReturn"] * runs + ["UserMessage"] * runs
    assert await rows(dsn, "SELECT status FROM toolnexus.runs") == [("done",)] * runs
    # Exactly one request was ever written per run, and it was answered once.
    requests = await rows(dsn, "SELECT status FROM toolnexus.requests")
    assert requests == [("answered",)] * runs
    taken = "SELECT request_id FROM toolnexus.answers WHERE outcome <> 'refused'"
    assert len(await rows(dsn, taken)) == runs
    # The pool serves after the restart with no more sessions than it may hold (and the
    # LISTEN connection).
    assert await sessions(dsn) <= 10 + 1


async def closed_clean(dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    assert await sessions(dsn) == 0  # the store closed every connection it had
    assert_no_leaks()
    # The outage is told in lines, never with a traceback per retry (asyncpg's pool's
    # attempts to reopen its connections included).
    told = caplog.get_records("call")
    assert [(r.name, r.getMessage()) for r in told if r.exc_info] == []
    # A fault is told by its cause (the server ended the connection), not by what the
    # store did next with the connection.
    assert [r.getMessage() for r in told if "released back to the pool" in r.getMessage()] == []
