"""What one serve app holds while it runs, and the one way a run starts and an answer
reaches its runs.

Rule of this module: it is below the routes (``_routes``, ``_oauth``, ``_ui``), which all
reach the app's state through :data:`SERVE`, start runs through :func:`start_run` and
hand answers over through :func:`hand_over`, so a run is admitted, and an answer gets the
same refusals (503, 404, 409), whichever route or protocol brought it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
from aiohttp import web

from .._core.errors import (
    AlreadyAnsweredError,
    AlreadyResumedError,
    AnswerMismatchError,
    RequestExpiredError,
    UnknownRequestError,
    UsageError,
)
from .._core.types import Answer
from .._engine.client import LlmClient
from .._engine.owner import TaskOwner
from ..durable import BegunRun, DurableHost, RunStore
from ..tools._standard import Toolkit
from ._bodies import ApiError
from ._events import EventBus
from ._feed import EventFeed
from ._inline import INLINE_PREFIX, NOT_HERE, InlineQuestions
from ._runs import ServeInbox, drive

__all__ = ("RETRY_FULL", "SERVE", "MakeClient", "ServeState", "hand_over", "start_run")

# Seconds a client refused for the admission limit is told to wait (Retry-After).
RETRY_FULL = 1

MakeClient = Callable[[ServeInbox], LlmClient]


@attrs.define
class ServeState:
    """The app's live state; the task group and client exist between startup and shutdown."""

    make_client: MakeClient
    toolkit: Toolkit
    store: RunStore
    park_timeout: float
    lease: float
    grace: float
    static: Path
    bus: EventBus
    max_active: int
    active: int = 0  # runs started here, not yet ended or halted
    feed: EventFeed | None = None
    client: LlmClient | None = None
    inbox: ServeInbox | None = None
    host: DurableHost | None = None
    runs: TaskOwner | None = None  # the task of each run started here
    closing: bool = False
    stop_at: float | None = None  # anyio.current_time() at which the grace ends
    freeze_gc: bool = False
    inline: InlineQuestions | None = None  # MCP servers' inline questions (the toolkit's)


SERVE = web.AppKey("toolnexus_serve", ServeState)


async def hand_over(serve: ServeState, answer: Answer, answered_by: str) -> None:
    """Give ``answer``, from the principal ``answered_by`` (``_guard.principal_of``), to the
    durable host, for ``POST /requests/{id}/answer`` and the sign-in callback (``_oauth``):
    durable, with its audit record, once this returns. :class:`ApiError` 503 while
    the server stops, 404 for a request no run waits for, 409 for one answered, resumed or
    expired already, or answered otherwise. An MCP server's inline question (its id
    starts with ``req_inline_``) held by this process (``serve.inline``) is answered
    there; one that is not is 404 saying that only the process holding its call can."""
    inbox, host, inline = serve.inbox, serve.host, serve.inline
    if inbox is None or host is None or serve.closing:
        raise ApiError(503, "the server is shutting down")
    try:
        if inline is not None and answer.id.startswith(INLINE_PREFIX):
            with contextlib.suppress(UnknownRequestError):  # not here: perhaps the store's
                await inline.answer(answer, answered_by=answered_by)
                return
        # A store error is store_faults' to map: nothing was taken then, and the same
        # answer may be sent again.
        await host.answer(answer, answered_by=answered_by)
    except UnknownRequestError as exc:
        if answer.id.startswith(INLINE_PREFIX):
            raise ApiError(404, NOT_HERE.format(id=answer.id)) from None
        raise ApiError(404, str(exc)) from None
    except (
        AlreadyAnsweredError,
        AlreadyResumedError,
        AnswerMismatchError,
        RequestExpiredError,
    ) as exc:
        raise ApiError(409, str(exc)) from None


async def start_run(
    serve: ServeState,
    prompt: str,
    run_id: str | None = None,
    output_schema: dict[str, Any] | None = None,
) -> BegunRun[Any]:
    """Keep a new run in the store, then drive it in the app's task group; its output
    checked against ``output_schema`` when given. :class:`ApiError` 503 while the server
    stops, 429 (with ``Retry-After``) beyond ``max_active_runs``, 400 for a schema that is
    none."""
    runs, host = serve.runs, serve.host
    if serve.closing or runs is None or host is None:
        raise ApiError(503, "the server is shutting down")
    if output_schema is not None:
        try:
            host.client.output_spec(output_schema)  # made once: begin() finds it again
        except UsageError as exc:
            raise ApiError(400, f"'output_schema' is not a usable JSON Schema: {exc}") from None
    if serve.active >= serve.max_active:
        raise ApiError(
            429,
            f"this server runs {serve.max_active} runs already (--max-active-runs); "
            "try again shortly, or another server",
            headers={"Retry-After": str(RETRY_FULL)},
        )
    # Kept before it is acknowledged: a crash after the reply loses nothing.
    begun = await host.begin(prompt, run_id=run_id, output_type=output_schema)
    serve.active += 1
    try:
        runs.start_soon(_drive, serve, begun, name=f"run {begun.run_id}")
    except UsageError:
        serve.active -= 1  # the server stopped meanwhile: the next one goes on with the run
    return begun


async def _drive(serve: ServeState, begun: BegunRun) -> None:
    try:
        await drive(begun)
    finally:
        serve.active -= 1
