"""Inline questions: what an older MCP server asks in the middle of a call, on serve's page.

Rules of this module:

- A server of protocol 2025-11-25 or older asks over its open session, inside the tool
  call that waits for the answer (docs/mcp.md). Such a question cannot be kept in the run
  store or outlive the process: :class:`InlineQuestions` is an :class:`Inbox` in memory,
  given to the toolkit as its ``wait_for``, that parks each question until a person
  answers it through the same ``POST /requests/{id}/answer`` as any request
  (``_state.hand_over`` asks it first, then the durable host).
- Its requests are shown as the store's are (``_runs.shown``), with ``"durable": false``:
  listed first on the first page of ``GET /requests`` (:meth:`InlineQuestions.listed`),
  counted in its ``total`` and ``counts``, and told on this worker's event stream as
  ``pending`` and ``answered`` events without an ``id:`` line (they have no place in the
  store's sequence, so a ``Last-Event-ID`` never names one). A client that reconnects
  learns of those it missed from ``GET /requests``.
- Only this process can answer them. An id of the inline form (``req_inline_...``) that
  this inbox does not hold is another worker's question, or one that ended with its
  process: the 404 says so.
- At shutdown every question still open is answered ``cancel`` to its server
  (:meth:`Inbox.halt_all`, which the MCP client maps so), so that the call ends with what
  the server makes of that, instead of holding the stop for its whole grace.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from .._core.types import Answer, Request
from ..durable._listing import RequestQuery
from ..suspend import Inbox
from ._events import EventBus
from ._runs import shown

__all__ = ("INLINE_PREFIX", "InlineQuestions")

# The id prefix the MCP client gives an inline question (mcp/_questions.py; a test checks
# that the two agree). Kept here too: serve must load without the MCP SDK.
INLINE_PREFIX = "req_inline_"

NOT_HERE = (
    "no run waits for request {id!r} here: it is an MCP server's inline question, which "
    "only the server process that holds its call can answer (another worker, or one that "
    "has stopped: the question ended with it)"
)


class InlineQuestions(Inbox):
    """The in-memory inbox of the questions MCP servers ask inline: give it to the
    toolkit (``Toolkit.create(mcp=..., wait_for=questions)``) and to
    :func:`~toolnexus_async.serve.create_app` (``inline_questions=questions``), which lists
    them, streams them and answers them while the process lives."""

    def __init__(self) -> None:
        # No park_timeout: a question asked inside a call cannot halt into the store.
        super().__init__()
        self.bus: EventBus | None = None  # set by the app while it runs
        self._runs: dict[str, str | None] = {}

    def _park(self, request: Request, run_id: str | None = None) -> asyncio.Future[Answer]:
        waiting = super()._park(request, run_id)
        if self.get(request.id) is not None:
            self._runs[request.id] = run_id
            self._tell("pending", {"run_id": run_id, "request": self.shown(request, run_id)})
        return waiting

    def _left(self, slot: Any, answer: Answer | None) -> None:
        request: Request = slot.request
        run_id = self._runs.pop(request.id, None)
        data: dict[str, Any] = {
            "request_id": request.id,
            "run_id": run_id,
            "ok": answer is not None and answer.ok,
            "at": time.time(),
            "durable": False,
        }
        reason = "cancelled" if answer is None else answer.reason
        if reason is not None:
            data["reason"] = reason
        self._tell("answered", data)

    def halt_all(self) -> int:
        for request_id in list(self._runs):
            self._tell("answered", self._ended(request_id))
        self._runs.clear()
        return super().halt_all()

    def _ended(self, request_id: str) -> dict[str, Any]:
        return {
            "request_id": request_id,
            "run_id": self._runs.get(request_id),
            "ok": False,
            "reason": "cancelled",
            "at": time.time(),
            "durable": False,
        }

    def _tell(self, name: str, data: dict[str, Any]) -> None:
        if self.bus is not None:
            self.bus.publish(name, data)  # no seq: no id line

    @staticmethod
    def shown(request: Request, run_id: str | None) -> dict[str, Any]:
        """An inline question as the API shows it: as the store's requests, plus
        ``"durable": false``."""
        return shown(request, run_id=run_id, durable=False)

    def add_to(self, listing: dict[str, Any], query: RequestQuery) -> None:
        """Put the questions ``query`` selects into ``listing`` (a ``GET /requests`` reply
        from the store): first on the first page (beyond its ``limit``: they are few, one
        per call in flight here), in its ``total`` and, all of them, in its ``counts``."""
        items, matched, counts = self.listed(query)
        if query.after is None:
            listing["requests"] = [*items, *listing["requests"]]
        listing["total"] += matched
        for kind, count in counts.items():
            listing["counts"][kind] = listing["counts"].get(kind, 0) + count

    def listed(self, query: RequestQuery) -> tuple[list[dict[str, Any]], int, dict[str, int]]:
        """The questions ``query`` selects (oldest first), how many, and the count per kind
        of all of them (as the store counts: with no filter)."""
        items: list[dict[str, Any]] = []
        counts: dict[str, int] = {}
        for request in self.pending():
            counts[request.kind] = counts.get(request.kind, 0) + 1
            run_id = self._runs.get(request.id)
            if query.kinds and request.kind not in query.kinds:
                continue
            if query.run_id is not None and run_id != query.run_id:
                continue
            if query.text is not None and query.text not in request.prompt.lower():
                continue
            items.append(self.shown(request, run_id))
        return items, len(items), counts
