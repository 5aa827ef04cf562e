"""``resume_stored``: answer a stored run and go on with it here, without a host.

Rules of this module:

- The answers are taken by the store first (each the one answer of its request), then the
  run is claimed for a lease, resumed with everything the store has for it, and kept as it
  goes, exactly as a :class:`~toolnexus_async.durable.DurableHost` resumes it.
- Answers that arrive for the run while it is held here are not lost: when the run halts
  again, the store is asked whether any of its requests was answered (or expired)
  meanwhile, and if so the run goes on here with them.
- A run that raises is recorded as failed; a cancelled one is let go (released), so that
  a host on the store goes on with it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any, TypeVar, overload

import anyio

from .._core.audit import check_answered_by
from .._core.errors import AlreadyResumedError, UsageError
from .._core.results import RunResult
from .._core.types import Answer
from .._engine.client import LlmClient
from .._engine.engine import RunSpec
from .._engine.tracing import run_extra
from ..tools._standard import Toolkit
from ._journal import RunJournal, plan_of, worker_name
from ._store import RunStore, StoredRun

__all__ = ("resume_stored",)

T = TypeVar("T")

log = logging.getLogger("toolnexus_async.durable")


@overload
async def resume_stored(
    client: LlmClient,
    toolkit: Toolkit,
    store: RunStore,
    answers: Answer | Iterable[Answer],
    *,
    lease: float = ...,
    answered_by: str | None = ...,
    output_type: type[T],
) -> RunResult[T]: ...


@overload
async def resume_stored(
    client: LlmClient,
    toolkit: Toolkit,
    store: RunStore,
    answers: Answer | Iterable[Answer],
    *,
    lease: float = ...,
    answered_by: str | None = ...,
    output_type: object = ...,
) -> RunResult[Any]: ...


async def resume_stored(
    client: LlmClient,
    toolkit: Toolkit,
    store: RunStore,
    answers: Answer | Iterable[Answer],
    *,
    lease: float = 600.0,
    answered_by: str | None = None,
    output_type: object = None,
) -> RunResult[Any]:
    """Answer a stored run and go on with it here (no host needed).

    Each answer is taken by the store as the one answer of its request; then the run is
    claimed (held by this call until it halts again or ends), resumed with every answer the
    store has for it, and kept as it goes. The run is held for ``lease`` seconds, which
    this call does not renew (a :class:`DurableHost` renews its leases); if the process
    dies, another worker goes on with it once the lease has run out. ``answered_by``
    names who gave the answers (see :meth:`DurableHost.answer`): kept in the run's audit
    trail with each.

    A run started with an ``output_type`` is checked against the schema stored with it;
    its ``output`` is built as ``output_type`` when given here, else it is the JSON value.

    Raises:
        UnknownRequestError: no stored run waits for an answer's id.
        AlreadyAnsweredError, RequestExpiredError: an answer is refused; nothing ran
            (the answers given before it are kept, and the run goes on with them when a
            worker claims it: a :class:`DurableHost` on the store does).
        AlreadyResumedError: another worker holds the run now; the answers taken so far
            are kept, and that worker goes on with them.
        UsageError: no answers, answers of more than one run, ``lease`` not > 0, or
            ``answered_by`` not a short printable string.
        ModelError, ...: the resume failed; the run is recorded as failed, with what ran.
    """
    given = [answers] if isinstance(answers, Answer) else list(answers)
    if not given:
        raise UsageError("resume_stored needs at least one answer")
    if not lease > 0:
        raise UsageError(f"lease must be > 0 seconds, got {lease!r}")
    if len(given) > 1:
        # Checked before any is taken, so that the usual refusals take nothing. (One that
        # races in after this, a concurrent answer, leaves the answers taken before it in
        # the store, where the run goes on with them once a worker claims it.) A single
        # answer needs no check: taking it is all or nothing.
        found = {(await store.find(answer.id)).run_id for answer in given}
        if len(found) > 1:
            raise UsageError(f"the answers belong to more than one run: {sorted(found)}")
    check_answered_by(answered_by)
    run_ids = {
        (await store.accept(answer, time.time(), answered_by=answered_by)).run_id
        for answer in given
    }
    (run_id,) = run_ids
    worker = worker_name()
    stored = await _claim(store, run_id, worker, lease)
    if stored is None:
        raise AlreadyResumedError(
            given[0].id,
            f"run {run_id!r} is held by another worker; it goes on there with this answer",
        )
    while True:
        result = await _go_on(client, toolkit, store, stored, worker, output_type)
        if result.status != "pending" or not await _answered_meanwhile(store, run_id):
            return result
        again = await _claim(store, run_id, worker, lease)
        if again is None:  # another worker took it first: it goes on there
            return result
        stored = again


async def _claim(store: RunStore, run_id: str, worker: str, lease: float) -> StoredRun | None:
    now = time.time()
    return await store.claim(run_id, worker, now + lease, now)


async def _go_on(
    client: LlmClient,
    toolkit: Toolkit,
    store: RunStore,
    stored: StoredRun,
    worker: str,
    output_type: object = None,
) -> RunResult:
    loop, plan = plan_of(stored, max_turns=client.max_turns, output_type=output_type)
    journal = RunJournal(store, stored.run_id, worker, stored.turn)
    try:
        return await client.engine.drive(RunSpec(loop, toolkit, plan, journal))
    except Exception as exc:
        with anyio.CancelScope(shield=True):
            try:
                await store.fail(stored.run_id, f"{type(exc).__name__}: {exc}", worker)
            except Exception:
                log.exception(
                    "run %s failed and its failure could not be recorded",
                    loop.run_id,
                    extra=run_extra(loop.run_id),
                )
        raise
    except BaseException:
        with anyio.CancelScope(shield=True):
            await store.release(stored.run_id, worker)
        raise


async def _answered_meanwhile(store: RunStore, run_id: str) -> bool:
    """Whether the halted run has a request that was answered or expired since it was
    claimed (so that it can go on at once)."""
    stored = await store.load(run_id)
    return any(
        asked.status != "pending" or asked.request.expired()
        for call_id, asked in stored.requests.items()
        if call_id not in stored.results
    )
