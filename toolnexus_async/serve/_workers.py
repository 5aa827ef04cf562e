"""What other workers on the store did, on this server's event stream.

Several servers on one shared store (PostgreSQL) form one inbox. ``GET /requests`` reads
the store, so it lists every worker's requests by itself; the event stream needs telling.

Rules of this module:

- Events come from the store (:meth:`RunStore.listen`) and name a request, never its
  data: what a subscriber is shown is read back from the store, so it is what was
  committed.
- A request raised on this server is announced by this server's own runs, in their order;
  only requests raised elsewhere are announced from the store's events. An answer is
  announced once per server, whichever of the two ways reaches it first
  (:meth:`RunBook.answered` keeps the ids it announced).
- Nothing is read back while nobody subscribes to the stream, so a busy worker pays for an
  event it is told only what receiving it costs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from anyio.abc import TaskGroup

from .._errors import StoreError, UnknownRequestError
from ..durable import DurableHost, RunStore, StoreEvent
from ._runs import RunBook

__all__ = ("follow_workers",)

log = logging.getLogger("toolnexus_async.serve")


async def follow_workers(
    store: RunStore, host: DurableHost, book: RunBook, tg: TaskGroup
) -> Callable[[], None]:
    """Publish on ``book``'s bus what other workers on ``store`` asked and were answered;
    returns the function that stops it."""

    async def announce(request_id: str) -> None:
        try:
            stored = await store.find(request_id)
        except (UnknownRequestError, StoreError) as exc:  # gone meanwhile, or unreadable
            log.debug("request %s of another worker not shown: %r", request_id, exc)
            return
        if stored.status == "pending":
            book.bus.publish(
                "pending", {"run_id": stored.run_id, "request": stored.request.to_dict()}
            )

    async def settle(request_id: str) -> None:
        try:
            stored = await store.find(request_id)
        except (UnknownRequestError, StoreError) as exc:
            log.debug("answer to %s from another worker not shown: %r", request_id, exc)
            return
        if stored.answer is not None:
            book.answered(stored.answer)

    def told(event: StoreEvent) -> None:
        if event.owner == host.worker:
            return  # a run held here: its requests and answers are announced here
        if event.kind == "requested":
            if len(book.bus):
                tg.start_soon(announce, event.request_id)
        elif not book.announced(event.request_id) and (
            len(book.bus) or book.run_of(event.request_id) is not None
        ):
            tg.start_soon(settle, event.request_id)

    return await store.listen(told)
