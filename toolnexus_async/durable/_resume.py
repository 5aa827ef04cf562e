"""``resume_stored``: answer a halted run that waits in a store, wherever it halted.

Rule of this module: a stored run is never lost by resuming it, and no tool of it runs
twice. It is claimed (so no other resume can run it too), resumed, and then either
finished, saved again because it halted again, or, when the resume fails before its tools
ran, put back exactly as it was claimed. When the model fails after the tools ran, the
error carries the run's state (``error.run``) instead, since putting the old state back
would run those tools again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import anyio

from .._client import LlmClient
from .._errors import ModelError, StoreError, UsageError
from .._results import RunResult
from .._toolkit import Toolkit
from .._types import Answer
from ._store import RunStore

__all__ = ("resume_claimed", "resume_stored")

log = logging.getLogger("toolnexus_async.durable")


async def resume_stored(
    client: LlmClient,
    store: RunStore,
    answers: Answer | Iterable[Answer],
    toolkit: Toolkit,
) -> RunResult:
    """Claim the run that the (first) answer belongs to, resume it, and store what remains.

    The run is claimed by the first answer's id; every answer must belong to that run
    (see :meth:`LlmClient.resume`). A result that halts again is saved under its new
    request ids, so it can be resumed the same way.

    Raises:
        UnknownRequest: no stored run waits for the first answer's id.
        AlreadyResumed: another resume claimed it first; nothing was executed here.
        StoreError: the stored run cannot be read (it stays in the store), or a failed
            resume could not put it back (the message names the run).
        ModelError: the model failed after the halted turn's tools ran. The run is not put
            back (its answered calls ran, and must not run again); continue from
            ``error.run`` with ``client.run(None, toolkit, history=error.run.messages)``.
        AnswerMismatch, ...: whatever else the resume raised; the claimed run was put back
            first, so it can be resumed again.
    """
    given = [answers] if isinstance(answers, Answer) else list(answers)
    if not given:
        raise UsageError("resume_stored needs at least one answer")
    halted = await store.claim(given[0].id)
    return await resume_claimed(client, store, halted, given, toolkit)


async def resume_claimed(
    client: LlmClient,
    store: RunStore,
    halted: RunResult,
    answers: list[Answer],
    toolkit: Toolkit,
) -> RunResult:
    """Resume a run already claimed from ``store``, with :func:`resume_stored`'s guarantees."""
    try:
        result = await client.resume(halted, answers, toolkit)
    except ModelError as exc:
        if exc.run is None:
            raise
        # The model failed after the halted turn's tools ran: putting the old state back
        # would run them again (a payment twice). The request is consumed; the error's
        # .run holds the state to continue from.
        log.warning("run %s: model failed after its tools ran; not stored again", halted.run_id)
        raise
    except BaseException as exc:
        # Shielded so that a cancelled resume still returns its run to the store.
        with anyio.CancelScope(shield=True):
            try:
                await store.save(halted)
            except Exception as put_back:
                log.error("run %s was claimed but could not be put back", halted.run_id)
                raise StoreError(
                    f"run {halted.run_id!r} could not be put back after its resume failed"
                    f" ({type(exc).__name__}: {exc}): {put_back}"
                ) from exc
        raise
    if result.status == "pending":
        await store.save(result)
    return result
