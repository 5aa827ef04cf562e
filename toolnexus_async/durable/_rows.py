"""What a stored row means, alike in both stores: values into the JSON and text columns
they keep, and rows back into values.

Rules of this module: both stores keep the same columns (SQLite's ``sqlite/_schema`` and
PostgreSQL's ``postgres/_schema`` name them), so one reading and one writing serve both.
JSON is written as ASCII: a lone surrogate (a model may send one) is escaped, not refused
by the database. A row that cannot be read back raises :class:`StoreError` naming its run;
:func:`listed` leaves such a row out of a listing with a warning, so that one damaged run
does not hide the others.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar, overload

from .._core.errors import PayloadError, StoreError
from .._core.messages import UserMessage
from .._core.results import RunResult, record_from_json
from .._core.types import Answer, Request
from ._store import RunSummary, StoredRequest, StoredRun

__all__ = (
    "ENCODE",
    "answer_of",
    "delivery_of",
    "encode",
    "listed",
    "plain",
    "prompt_of",
    "request_of",
    "run_of",
    "state_text",
    "stored_request",
    "summary_of",
)

log = logging.getLogger("toolnexus_async.durable")

R = TypeVar("R")
V = TypeVar("V")


ENCODE: Callable[[Any], str] = functools.partial(
    json.dumps, separators=(",", ":"), ensure_ascii=True
)


def state_text(state: RunResult) -> str:
    try:
        return ENCODE(state.to_dict())
    except (TypeError, ValueError) as exc:
        if isinstance(exc, PayloadError):
            raise
        raise PayloadError(f"run {state.run_id!r} cannot be stored as JSON: {exc}") from None


def prompt_of(state: RunResult) -> str:
    return next((m.text for m in state.messages if isinstance(m, UserMessage)), "")


def encode(value: object, what: str) -> str:
    """``value`` as the JSON text a store keeps; ``what`` names it in the error."""
    try:
        return ENCODE(value)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, PayloadError):
            raise
        raise PayloadError(f"{what} cannot be stored as JSON: {exc}") from None


_NOT_TEXT = re.compile("[\x00\ud800-\udfff]")


@overload
def plain(text: str) -> str: ...
@overload
def plain(text: None) -> None: ...
def plain(text: str | None) -> str | None:
    """``text`` as a column both stores can hold as text (the run's text, a request's
    prompt and kind, which listings search): U+0000 and lone surrogates, which a model or a
    tool may send, become U+FFFD. The JSON kept beside it has the text exactly."""
    if text is None or _NOT_TEXT.search(text) is None:
        return text
    return _NOT_TEXT.sub("\ufffd", text)


def answer_of(text: object) -> Answer | None:
    return None if text is None else Answer.from_dict(json.loads(str(text)))


def listed(rows: Sequence[R], read: Callable[[R], V]) -> list[V]:
    """Each row read by ``read``, but for those that raise :class:`StoreError`: they are
    left out, each with a warning, so that one damaged run does not hide the others."""
    try:
        return [read(row) for row in rows]
    except StoreError:
        # Read again row by row: damage is rare, and the listings hosts ask for every
        # second (100,000 rows with as many runs parked) keep the comprehension's speed.
        pass
    values: list[V] = []
    for row in rows:
        try:
            values.append(read(row))
        except StoreError as exc:
            log.warning("%s; left out of the listing", exc)
    return values


def stored_request(body: str, run_id: str, call_id: str) -> Request:
    """The request kept for ``call_id`` of ``run_id``; :class:`StoreError` naming the run
    if its JSON is damaged."""
    try:
        return Request.from_dict(json.loads(body))
    except (ValueError, TypeError) as exc:  # PayloadError is both
        raise StoreError(
            f"stored run {run_id!r} cannot be read: the request of call {call_id!r}: {exc}"
        ) from None


def request_of(
    body: str,
    run_id: str,
    call_id: str,
    status: Any,
    answer: str | None = None,
    raised_at: float | None = None,
    answered_at: float | None = None,
) -> StoredRequest:
    request = stored_request(body, run_id, call_id)
    taken = _answer_of(answer, run_id, call_id)
    return StoredRequest(request, run_id, call_id, status, taken, raised_at, answered_at)


def delivery_of(row: Sequence[Any]) -> tuple[str, Answer | None]:
    """The run and the answer to hand to it, from a ``requests`` row (run id, answer)."""
    run_id, text = row
    return run_id, _answer_of(text, run_id, None)


def _answer_of(text: str | None, run_id: str, call_id: str | None) -> Answer | None:
    try:
        return answer_of(text)
    except (ValueError, TypeError) as exc:  # PayloadError is both
        of = "an answer" if call_id is None else f"the answer to call {call_id!r}"
        raise StoreError(f"stored run {run_id!r} cannot be read: {of}: {exc}") from None


def run_of(
    run_id: str,
    row: Sequence[Any],
    results: Iterable[Sequence[Any]],
    requests: Iterable[Sequence[Any]],
) -> StoredRun:
    """A :class:`StoredRun` from its ``runs`` row (status, owner, lease, turn, state), its
    ``results`` rows (call id, record) and its current turn's ``requests`` rows (call id,
    body, status, answer, raised at, answered at)."""
    status, owner, lease, turn, text = row
    where = f"stored run {run_id!r}"
    try:
        state = RunResult.from_dict(text)
        recorded = {
            call_id: record_from_json(json.loads(record), f"{where} result {call_id!r}")
            for call_id, record in results
        }
        asked = {
            call_id: request_of(body, run_id, call_id, q_status, answer, raised, answered)
            for call_id, body, q_status, answer, raised, answered in requests
        }
    except (PayloadError, ValueError) as exc:
        raise StoreError(f"{where} cannot be read: {exc}") from None
    if state.run_id != run_id:
        raise StoreError(f"{where} holds another run: {state.run_id!r}")
    return StoredRun(run_id, status, state, turn, recorded, asked, owner, lease)


def summary_of(
    run_id: str, status: str, prompt: str, final: str | None, error: str | None
) -> RunSummary:
    text: str | None = None
    if final is not None:
        try:
            ended = RunResult.from_dict(final)
        except PayloadError:
            pass
        else:
            text, status = ended.text, ended.status
    return RunSummary(run_id, _shown_status(status), prompt, text, error)


def _shown_status(status: str) -> str:
    """A stored status as a listing says it: a halted run waits for answers."""
    return {"halted": "pending", "failed": "error"}.get(status, status)
