"""The front-end protocols (``_core/ui``) over serve's runs, whatever the web
framework: the store read, runs started and answers handed over for them.

Rules of this module:

- A protocol's stream reads its run from the store (``RunStore.run_view``) each time the
  store may have changed (``RunStore.watch``, and every :data:`POLL` seconds regardless:
  another worker's writes may not be told), never from a book of this process: so it
  says the same on every worker, after a restart and after a reconnect.
- Runs start through :func:`~._state.start_run` and answers go through
  :func:`~._state.hand_over`, as for the inbox's own routes: the same admission, the same
  refusals. A refusal there ends a stream with the protocol's error, never half an answer:
  the protocol checked every answer of a resume before the first is handed over.
- Each stream sends through a ``send`` the adapter gives (aiohttp or ASGI) and ends when
  its run waits for people, ends, or the server stops.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import anyio

from .._core.errors import StoreError, UnknownRequestError
from .._core.ui import agui, aisdk
from .._core.ui.answers import Refusal
from .._core.ui.runs import Asked, RunSnapshot, Settled
from ..durable import RunStore
from ..durable._listing import RunView
from ._bodies import ApiError, is_text
from ._state import ServeState, hand_over, start_run

__all__ = (
    "MAX_THREAD_ID",
    "POLL",
    "Changes",
    "Follower",
    "Send",
    "follow",
    "read_snapshot",
    "follow_aisdk",
    "reconnect_aisdk",
    "run_agui",
    "run_aisdk",
    "snapshot_of",
)

log = logging.getLogger("toolnexus_async.serve")

# Seconds between two reads of a followed run when the store told nothing.
POLL = 0.25
# The longest thread id (a run id) taken from a client.
MAX_THREAD_ID = 200

Send = Callable[[dict[str, Any]], Awaitable[None]]


def snapshot_of(view: RunView) -> RunSnapshot:
    """The run as the protocols see it."""
    item, state = view.item, view.state
    return RunSnapshot(
        run_id=item.run_id,
        status=item.status,
        prompt=item.prompt,
        turn=view.turn,
        ended=view.ended,
        messages=tuple(state.messages),
        results={
            call_id: Settled(r.result.output, r.result.is_error, r.answered_ok is False)
            for call_id, r in view.results.items()
        },
        declined=frozenset(r.call.id for r in state.tool_calls if r.answered_ok is False),
        asked=tuple(
            Asked(row.request, row.call_id, row.turn, row.status, row.answer)
            for row in view.requests
        ),
        text=item.text,
        error=item.error,
    )


async def read_snapshot(store: RunStore, run_id: str) -> RunSnapshot | None:
    """The run ``run_id`` as the store has it, None if it has none."""
    try:
        return snapshot_of(await store.run_view(run_id))
    except UnknownRequestError:
        return None


class Changes:
    """Wakes a stream when the store may have changed (told by ``watch``, or :data:`POLL`)."""

    def __init__(self, store: RunStore) -> None:
        self._event = anyio.Event()
        self._unwatch = store.watch(self._told)

    def _told(self) -> None:
        self._event.set()

    async def wait(self) -> None:
        with anyio.move_on_after(POLL):
            await self._event.wait()
        self._event = anyio.Event()

    def close(self) -> None:
        self._unwatch()


async def run_agui(
    serve: ServeState, given: agui.RunInput, send: Send, *, answered_by: str
) -> None:
    """One AG-UI run over the thread's run: decide, act, then follow the run until it
    waits for people or ends; its answers are recorded as given by ``answered_by``."""
    stream = agui.Stream(given)
    await send(stream.started())
    if len(given.thread_id) > MAX_THREAD_ID or not is_text(given.thread_id):
        await send(stream.error(f"'threadId' must be text of at most {MAX_THREAD_ID} characters"))
        return
    changes = Changes(serve.store)
    try:
        await _agui(serve, given, stream, changes, send, answered_by)
    except StoreError:
        # Its message may name the store's server: the log has it (the outage watch).
        await send(stream.error("the run store is unavailable: send the same input again", "store"))
    except ConnectionError:
        raise  # the client left: there is nobody to tell
    except Exception:
        # The stream is under way: its error is an event, as no status can be sent now.
        log.exception("unexpected error in an AG-UI stream")
        await send(stream.error("internal server error", "internal"))
    finally:
        changes.close()


async def _agui(
    serve: ServeState,
    given: agui.RunInput,
    stream: agui.Stream,
    changes: Changes,
    send: Send,
    answered_by: str,
) -> None:
    snapshot = await read_snapshot(serve.store, given.thread_id)
    try:
        decision = agui.decide(given, snapshot, check=serve.toolkit.check_arguments)
        # Shielded: a client that leaves now must not cut a resume in half.
        with anyio.CancelScope(shield=True):
            if isinstance(decision, agui.Start):
                await start_run(serve, decision.prompt, run_id=given.thread_id)
            elif isinstance(decision, agui.Resume):
                for answer in decision.answers:
                    await hand_over(serve, answer, answered_by)
    except (Refusal, ApiError) as exc:
        await send(stream.error(str(exc)))
        return
    await follow(serve, given.thread_id, changes, stream, send)


async def run_aisdk(
    serve: ServeState, given: aisdk.ChatInput, send: Send, *, answered_by: str
) -> None:
    """One AI SDK chat request over the chat's run: decide, act, then follow the run until
    it waits for people or ends; its answers are recorded as given by ``answered_by``."""
    stream = aisdk.Stream(given.known, given.texts)
    if len(given.chat_id) > MAX_THREAD_ID or not is_text(given.chat_id):
        await send(stream.error(f"'id' must be text of at most {MAX_THREAD_ID} characters"))
        return
    changes = Changes(serve.store)
    try:
        snapshot = await read_snapshot(serve.store, given.chat_id)
        try:
            decision = aisdk.decide(given, snapshot, check=serve.toolkit.check_arguments)
            with anyio.CancelScope(shield=True):  # as for AG-UI
                if isinstance(decision, aisdk.Start):
                    await start_run(serve, decision.prompt, run_id=given.chat_id)
                else:
                    for answer in decision.answers:
                        await hand_over(serve, answer, answered_by)
        except (Refusal, ApiError) as exc:
            await send(stream.error(str(exc)))
            return
        await send(stream.started(aisdk.reply_id(given.chat_id) if snapshot is None else None))
        await follow(serve, given.chat_id, changes, stream, send)
    except StoreError:
        await send(stream.error("the run store is unavailable: send the same request again"))
    except ConnectionError:
        raise
    except Exception:
        log.exception("unexpected error in an AI SDK stream")
        await send(stream.error("internal server error"))
    finally:
        changes.close()


async def reconnect_aisdk(serve: ServeState, chat_id: str) -> aisdk.Stream | None:
    """The stream a reconnecting client gets (``resumeStream()``): its run's reply message
    replayed whole, then followed until the run waits or ends; None (204) when there is no
    such run."""
    snapshot = await read_snapshot(serve.store, chat_id) if is_text(chat_id) else None
    return None if snapshot is None else aisdk.Stream(replay=True)


async def follow_aisdk(serve: ServeState, chat_id: str, stream: aisdk.Stream, send: Send) -> None:
    """Send a reconnected stream (:func:`reconnect_aisdk`)."""
    changes = Changes(serve.store)
    try:
        await send(stream.started(aisdk.reply_id(chat_id)))
        await follow(serve, chat_id, changes, stream, send)
    except StoreError:
        await send(stream.error("the run store is unavailable: reconnect"))
    finally:
        changes.close()


class Follower(Protocol):
    """A protocol's stream: the events each snapshot adds, and whether it is over."""

    over: bool

    def advance(self, snapshot: RunSnapshot) -> list[dict[str, Any]]: ...

    def error(self, message: str, code: str = ...) -> dict[str, Any]: ...


async def follow(
    serve: ServeState, run_id: str, changes: Changes, stream: Follower, send: Send
) -> None:
    """Send what each new snapshot of the run adds, until ``stream`` is over."""
    while True:
        snapshot = await read_snapshot(serve.store, run_id)
        if snapshot is not None:
            for event in stream.advance(snapshot):
                await send(event)
            if stream.over:
                return
        if serve.closing:
            await send(
                stream.error("the server is shutting down: send the same input again", "closing")
            )
            return
        await changes.wait()
