"""``resume_stored``: answer a halted run that waits in a store, wherever it halted.

Rule of this module: a stored run is never lost by resuming it, and no tool of it runs
twice. It is claimed (so no other resume can run it too), resumed, and then either
finished, saved again because it halted again, or, when the resume fails before its tools
ran, put back exactly as it was claimed. A failure after the tools ran (a model error, a
timeout, a cancellation) is not put back, since the old state would run those tools again;
a model error carries the run's state (``error.run``) to continue from.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import anyio

from .._client import LlmClient
from .._errors import StoreError, UsageError
from .._hooks import call_hook
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
        ModelError, RunTimeout, ...: the resume failed after the halted turn's tools ran
            (the model failed, the run timed out or was cancelled). The run is not put back:
            its answered calls ran and must not run again. A ``ModelError``'s ``.run``
            holds the state to continue from with ``client.run(None, toolkit,
            history=error.run.messages)``.
        AnswerMismatch, ...: the resume failed before any tool ran; the claimed run was
            put back first, so it can be resumed again.
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
    *,
    on_tools_done: Callable[[RunResult], Any] | None = None,
) -> RunResult:
    """Resume a run already claimed from ``store``, with :func:`resume_stored`'s guarantees.

    ``on_tools_done`` is passed on to :meth:`LlmClient.resume`.
    """
    ran: list[RunResult] = []

    async def tools_done(state: RunResult) -> None:
        ran.append(state)
        if on_tools_done is not None:
            await call_hook(on_tools_done, state)

    try:
        result = await client.resume(halted, answers, toolkit, on_tools_done=tools_done)
    except BaseException as exc:
        if ran:
            # The answered calls ran: putting the old state back would run them again (a
            # payment twice). The request is consumed; a ModelError's .run holds the state
            # to continue from.
            log.warning(
                "run %s failed after its tools ran (%s); not stored again",
                halted.run_id,
                type(exc).__name__,
            )
            raise
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
