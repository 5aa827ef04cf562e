"""The durable host: the store is the source of truth; memory is a cache over it.

Rules of this module:

- :class:`DurableHost` owns what a run needs to go on later (the client, the toolkit, the
  store); the :class:`~toolnexus_async.Inbox` only parks, the client only runs.
- **Write before tell.** A run the host drives keeps a journal (``_journal``): it is written
  when it starts, when the model asks for tools (before any call runs; with the request
  when a ``require_approval`` gate asks first), as each call settles, when a request is
  raised (before anyone is told of it), and when it ends or halts.
- **An answer is durable before it is acknowledged.** :meth:`DurableHost.answer` returns
  only after the store took the answer as the one answer of its request. Then the run parked
  here wakes; a run held by another live worker is woken by that worker (told by the store,
  or at its next look: ``_deliveries``); a run nobody holds is claimed and resumed here
  (``_answering``: what the host does with an answer; here, claiming and resuming).
- **Resuming is a lease.** The host holds each run it drives until a deadline it renews in
  the background (``_upkeep``); if the process dies the lease runs out and any host on the
  store (a restart, another worker) finds the run and goes on with what was kept, answers
  included. The same background sweep resumes runs whose requests expired while nobody
  held them.
- A run that raises is recorded as failed and not resumed by itself; a run cancelled while
  the host shuts down is let go, so that the next host goes on with it.
- **The store's faults are waited out, never recorded** (``_tenure``, ``_journal``): a run
  whose write meets ``StoreUnavailableError`` waits and retries with its state intact;
  renewals are retried promptly; after an outage the host takes over no other worker's
  run until the live ones have renewed; no tool call starts on a lease the host cannot
  prove. A run the host must give up (it is closing, or its failure cannot be written
  now) is never left held here and not driven: releasing it, or recording its failure,
  is retried in the background until the store takes it (``_upkeep``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self

import anyio
from anyio.abc import TaskGroup

from .._core.errors import UsageError
from .._core.loop import RunLoop
from .._core.results import RunResult
from .._core.resume import ResumePlan
from .._engine.client import LlmClient
from .._engine.engine import RunSpec
from .._engine.hooks import call_hook
from .._engine.owner import TaskOwner
from .._engine.streaming import Sink
from .._engine.tracing import run_extra
from ..suspend import Inbox
from ..tools._standard import Toolkit
from ._answering import HostAnswers
from ._deliveries import Deliveries
from ._driving import Driving
from ._entries import HostEntries
from ._journal import RunJournal, plan_of, worker_name
from ._store import LeaseLostError, RunStore, StoredRun
from ._tenure import Tenure
from ._upkeep import Upkeep

__all__ = ("DurableHost",)

log = logging.getLogger("toolnexus_async.durable")

OnResult = Callable[[RunResult], Any]


class DurableHost(HostEntries, HostAnswers):
    """A client, a toolkit and a store: every run is kept, and any answer resumes it.

    The client's ``wait_for`` decides how long a run waits in memory: an
    :class:`~toolnexus_async.Inbox` parks it (with ``park_timeout``, only that long), no
    ``wait_for`` halts it at once; either way the store has the run, and its answer, given
    to :meth:`answer` here or on any host on the same store, resumes it::

        async with (
            SqliteRunStore("runs.db") as store,
            LlmClient(..., wait_for=Inbox(park_timeout=300)) as client,
            DurableHost(client, toolkit, store, on_result=tell_the_user) as host,
        ):
            result = await host.run("refund order S-1")
            ...
            await host.answer(Answer(request_id, ok=True))  # parked or stored alike

    Args:
        client: runs the prompts; closed by its owner, not by the host.
        toolkit: the tools of every run; closed by its owner.
        store: the journal of every run; opened and closed by its owner.
        on_result: ``(result) -> None``, sync or async: the result of every run the host
            resumed from the store (whoever called :meth:`run` got its result already).
        on_failure: ``(run_id, error) -> None``, sync or async: a run the host resumed
            raised ``error`` (it is recorded as failed in the store).
        lease: seconds a run is held by this host without a renewal; another host takes
            it over once this long has passed since this one was last heard of.
        sweep: seconds between looks for runs that can go on (a dead worker's, an expired
            request's).
        poll: seconds between looks for answers another worker accepted for runs parked
            here.
        worker: this host's name in the store (default: host name, process id, random).
    """

    def __init__(
        self,
        client: LlmClient,
        toolkit: Toolkit,
        store: RunStore,
        *,
        on_result: OnResult | None = None,
        on_failure: Callable[[str, BaseException], Any] | None = None,
        lease: float = 30.0,
        sweep: float = 1.0,
        poll: float = 0.5,
        worker: str | None = None,
    ) -> None:
        for name, value in (("lease", lease), ("sweep", sweep), ("poll", poll)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise UsageError(f"{name} must be > 0 seconds, got {value!r}")
        self.client = client
        self.toolkit = toolkit
        self.store = store
        self.worker = worker or worker_name()
        self._on_result = on_result
        self._on_failure = on_failure
        self._lease = float(lease)
        self._sweep = float(sweep)
        self._poll = float(poll)
        inbox = client.wait_for
        self.inbox: Inbox | None = inbox if isinstance(inbox, Inbox) else None
        self._tg: TaskGroup | None = None
        self._resumes: TaskOwner | None = None  # the runs resumed here, a task each
        self._background: anyio.CancelScope | None = None
        self._driving = Driving()  # the runs this host drives now
        self._claiming: set[str] = set()  # ids of the runs this host is claiming now
        self._tenure = Tenure(self.worker, self._lease)
        self._deliveries = (
            None
            if self.inbox is None
            else Deliveries(store, self.worker, self.inbox, self._poll, self._tenure.store_down)
        )
        self._unlisten: Callable[[], None] = lambda: None
        self._closing = False
        # Renewing, sweeping, letting go of runs given up here: in the background.
        self._upkeep = Upkeep(
            store,
            self.worker,
            self._tenure,
            lease=self._lease,
            sweep=self._sweep,
            claim=self._claim,
            adopt=self._adopt,
            closing=lambda: self._closing,
            deliveries=self._deliveries,
        )

    @property
    def store_health(self) -> Tenure:
        """Whether the run store is down as this host last saw it (``.down``); report a
        failure or a recovery seen elsewhere with ``.store_down(exc)`` / ``.store_up()``,
        so that an outage is logged once, whoever sees it first."""
        return self._tenure

    def __repr__(self) -> str:
        return f"<DurableHost worker={self.worker!r} runs={len(self._driving)}>"

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._tg is not None:
            raise UsageError("this DurableHost is already open")
        self._closing = False
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._background = anyio.CancelScope()
        self._tg.start_soon(self._upkeep.run, self._background, name=f"durable host {self.worker}")
        try:
            self._resumes = await TaskOwner.open_in(
                self._tg, f"the resumes of durable host {self.worker}"
            )
            if self._deliveries is not None:
                self._unlisten = await self.store.listen(self._deliveries.told, owner=self.worker)
        except BaseException as exc:
            await self.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        """Stops the background work, then waits for the resumes still running."""
        tg = self._tg
        assert tg is not None
        self._closing = True
        self._unlisten()
        if self._background is not None:
            self._background.cancel()
        if self._resumes is not None:
            self._resumes.close()
        try:
            return await tg.__aexit__(exc_type, exc, tb)
        finally:
            self._tg = self._resumes = None

    def shutdown(self) -> int:
        """Start closing: parked runs halt now (the store has them), and a run cancelled
        from now on is let go for the next host. Returns how many parked runs halted."""
        self._closing = True
        return self.inbox.halt_all() if self.inbox is not None else 0

    async def _claim(self, run_id: str, now: float) -> StoredRun | None:
        """Claim ``run_id`` for this host, unless it drives (or claims) it already.

        The store lets a worker claim a run it holds itself, so the sweep and an answer
        racing for the same run (a dead worker's, say) would otherwise both win here and
        drive it twice, running its tools twice. Whoever gets a run back must start it
        before it next awaits: until then it is in neither set.
        """
        if run_id in self._driving or run_id in self._claiming:
            return None  # driven here: an answer for it is handed over, not resumed
        self._claiming.add(run_id)
        try:
            return await self.store.claim(run_id, self.worker, now + self._lease, now)
        finally:
            self._claiming.discard(run_id)

    async def _adopt(self, stored: StoredRun) -> None:
        """Resume a run claimed here, unless the host began closing meanwhile: then let
        the next host have it."""
        if self._closing:
            with anyio.CancelScope(shield=True):
                await self.store.release(stored.run_id, self.worker)
        else:
            self._start(stored)

    # -- running -----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._tg is None or self._closing:
            raise UsageError(
                "this DurableHost is not open (use it inside `async with host:`) or is "
                "shutting down"
            )

    def _journal(self, run_id: str, turn: int = 0, *, lease: float | None = None) -> RunJournal:
        return RunJournal(self.store, run_id, self.worker, turn, lease=lease, tenure=self._tenure)

    async def _drive(
        self,
        loop: RunLoop,
        journal: RunJournal,
        plan: ResumePlan | None = None,
        sink: Sink | None = None,
    ) -> RunResult:
        run_id = journal.run_id
        self._driving.add(run_id)
        try:
            spec = RunSpec(loop, self.toolkit, plan, journal, stream=sink)
            return await self.client.engine.drive(spec)
        except LeaseLostError:
            log.warning(
                "run %s was taken over by another worker; stopped here",
                run_id,
                extra=run_extra(run_id),
            )
            raise
        except Exception as exc:
            with anyio.CancelScope(shield=True):
                await self._upkeep.record_failure(loop, journal, exc)
            raise
        except BaseException:
            # Cancelled: at shutdown, let the next host go on with it; otherwise the caller
            # gave up on it, and it ends here.
            with anyio.CancelScope(shield=True):
                if self._closing:
                    await self._upkeep.release(journal)
                else:
                    await self._upkeep.record_failure(loop, journal, None)
            raise
        finally:
            self._driving.discard(run_id)

    async def settle(self, patience: float) -> None:
        """Wait until no run is driven here, or none ended for ``patience`` seconds (a
        graceful shutdown: runs halted by :meth:`shutdown` end quickly, each kept)."""
        left = await self._driving.settle(patience)
        if left:
            log.warning("shutting down with %d run(s) still busy; they are let go", left)

    # -- resuming (what a sweep or an answer claimed here) -----------------------------------

    def _start(self, stored: StoredRun) -> None:
        resumes = self._resumes
        if resumes is None:
            raise UsageError(
                f"run {stored.run_id!r} must resume inside `async with host:`, which is not "
                "open; it stays in the store"
            )
        resumes.start_soon(self._resume, stored, name=f"resume {stored.run_id}")
        self._driving.add(stored.run_id)

    async def _resume(self, stored: StoredRun) -> None:
        loop, plan = plan_of(stored, max_turns=self.client.max_turns)
        journal = self._journal(stored.run_id, stored.turn)
        try:
            result = await self._drive(loop, journal, plan)
        except Exception as exc:
            log.warning(
                "resumed run %s failed: %r", stored.run_id, exc, extra=run_extra(stored.run_id)
            )
            if self._on_failure is not None:
                try:
                    await call_hook(self._on_failure, stored.run_id, exc)
                except Exception:
                    log.exception(
                        "on_failure raised for run %s",
                        stored.run_id,
                        extra=run_extra(stored.run_id),
                    )
            return
        if self._on_result is not None:
            try:
                await call_hook(self._on_result, result)
            except Exception:
                log.exception(
                    "on_result raised for run %s", result.run_id, extra=run_extra(result.run_id)
                )
