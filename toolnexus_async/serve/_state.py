"""What one serve app holds while it runs, and the one way an answer reaches its runs.

Rule of this module: it is below the routes (``_app``, ``_oauth``), which all reach the
app's state through :data:`SERVE` and hand answers over through :func:`hand_over`, so an
answer gets the same refusals (503, 404, 409) whichever route brought it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import attrs
from aiohttp import web

from .._core.errors import (
    AlreadyAnsweredError,
    AlreadyResumedError,
    AnswerMismatchError,
    RequestExpiredError,
    UnknownRequestError,
)
from .._core.types import Answer
from .._engine.client import LlmClient
from .._engine.owner import TaskOwner
from .._engine.toolkit import Toolkit
from ..durable import DurableHost, RunStore
from ._bodies import ApiError
from ._events import EventBus
from ._feed import EventFeed
from ._inline import INLINE_PREFIX, NOT_HERE, InlineQuestions
from ._runs import ServeInbox

__all__ = ("SERVE", "MakeClient", "ServeState", "hand_over")

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


async def hand_over(serve: ServeState, answer: Answer) -> None:
    """Give ``answer`` to the durable host, for ``POST /requests/{id}/answer`` and the
    sign-in callback (``_oauth``): durable once this returns. :class:`ApiError` 503 while
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
                await inline.answer(answer)
                return
        # A store error is store_faults' to map: nothing was taken then, and the same
        # answer may be sent again.
        await host.answer(answer)
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
