"""What a durable host does with an answer (``DurableHost.answer``), and with a run halted
elsewhere that an answer should resume (``keep``); the requests that wait for answers.

Rule of this module: **an answer is durable before it is acknowledged.** ``answer``
returns only after the store took it as the one answer of its request; then the run
parked here wakes (handed over by ``_deliveries``), a run held by another live worker is
left to that worker, and a run nobody holds is claimed and resumed here (the host's
``_claim`` and ``_start``: ``_host``).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from .._core.audit import check_answered_by
from .._core.errors import DamagedRunError, StoreError, UsageError
from .._core.results import RunResult
from .._core.types import Answer, Request
from .._engine.tracing import run_extra
from ._store import RunStore, StoredRequest, StoredRun

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from ._deliveries import Deliveries
    from ._tenure import Tenure

__all__ = ("HostAnswers",)

log = logging.getLogger("toolnexus_async.durable")


class HostAnswers:
    """``answer``, ``keep``, ``requests`` and ``outstanding``, for :class:`DurableHost`."""

    if TYPE_CHECKING:  # DurableHost's
        store: RunStore
        worker: str
        _tg: TaskGroup | None
        _closing: bool
        _tenure: Tenure
        _deliveries: Deliveries | None

        async def _claim(self, run_id: str, now: float) -> StoredRun | None: ...

        def _start(self, stored: StoredRun) -> None: ...

    async def keep(self, run: RunResult) -> None:
        """Keep a run that halted elsewhere (a plain ``client.run``), so that :meth:`answer`
        resumes it.

        Raises:
            UsageError: ``run`` is not halted; see :meth:`RunStore.save`.
        """
        await self.store.save(run)

    # -- answering ---------------------------------------------------------------------------

    async def answer(self, answer: Answer, *, answered_by: str | None = None) -> None:
        """Take ``answer`` as the one answer of its request (durably), then wake its run.

        ``answered_by`` names who gave it, as the caller authenticated them (a user id, an
        API client's name; never a credential): the store keeps it, with the digest of
        what the request showed, in the run's append-only audit trail
        (:meth:`RunStore.answers`), committed with the answer before this returns. A
        refused answer is kept there too, as refused.

        Raises:
            UnknownRequestError: no run ever waited for that id.
            AlreadyAnsweredError: the request was answered before, by anyone.
            RequestExpiredError: its ``expires_at`` passed before this answer.
            AlreadyResumedError: the run went on without it (it is closed).
            StoreError: the store failed to take the answer; nothing was taken. (If it
                takes the answer but cannot read the run back, the answer is kept and the
                run goes on once the store can: a later sweep resumes it.)
            UsageError: not an :class:`Answer`, or ``answered_by`` is not a short
                printable string (or None).
        """
        if not isinstance(answer, Answer):
            raise UsageError(f"answer() takes an Answer, got {type(answer).__name__}")
        check_answered_by(answered_by)
        if self._tg is None or self._closing:
            # Checked before anything is taken: an answer the host could not act on must
            # not be acknowledged.
            raise UsageError(
                f"answering request {answer.id!r} needs the host open (inside "
                "`async with host:`, and not shutting down)"
            )
        deliveries = self._deliveries
        if deliveries is None:
            accepted = await self.store.accept(
                answer, time.time(), by=self.worker, answered_by=answered_by
            )
        else:
            accepted = await deliveries.take(answer, answered_by)
            if accepted.owner == self.worker:
                # Handed over here; or, not parked here now, handed over once it parks
                # again, or resumed with the answer by the sweep once its halt commits.
                return
        now = time.time()
        held = accepted.owner is not None and (accepted.lease_until or 0) > now
        if held:
            return  # its worker hands it over
        if accepted.owner is not None and not self._tenure.may_take_over():
            return  # just after an outage: its worker is likely alive (see Upkeep._sweep_once)
        try:
            stored = await self._claim(accepted.run_id, now)
        except DamagedRunError:
            raise  # failed for good now: the answer changes nothing, and its sender is told
        except StoreError as exc:
            # The answer is kept (taken above); the sweep goes on with the run once the
            # store can read it back.
            log.warning(
                "run %s cannot be resumed now: %s",
                accepted.run_id,
                exc,
                extra=run_extra(accepted.run_id),
            )
            return
        if stored is not None:
            self._start(stored)

    async def requests(self) -> list[Request]:
        """Every outstanding request, as the store has them (oldest first)."""
        return await self.store.requests()

    async def outstanding(self) -> list[StoredRequest]:
        """Every outstanding request with its run and call, as the store has them."""
        return await self.store.outstanding()
