"""The query strings of ``GET /runs`` and ``GET /requests``: checked, and their cursors.

Rules of this module:

- A parameter the list does not take, a ``limit`` outside 1 to :data:`MAX_LIMIT`, a status
  no run can have, a cursor this server did not give: 422 with a message that says what
  is allowed. Nothing is read from the store before the query is known to be good.
- A cursor is opaque to clients: the position of the last item of a page, tagged with the
  list it belongs to, in URL-safe base64. It is a position, not an offset, so the next
  page neither repeats nor skips an item when items arrive meanwhile.
- ``status``/``kind`` may be repeated or comma-separated; ``q`` is matched case-insensitively
  against the prompt.
"""

from __future__ import annotations

import base64
import binascii

from multidict import MultiMapping

from ..durable._listing import RequestQuery, RunQuery
from ._bodies import ApiError, is_text

__all__ = ("DEFAULT_LIMIT", "MAX_LIMIT", "STATUSES", "cursor_of", "request_query", "run_query")

DEFAULT_LIMIT = 100
MAX_LIMIT = 500
MAX_SEARCH = 1_000
STATUSES = ("running", "pending", "done", "incomplete", "error")

_RUNS = ("limit", "cursor", "status", "q")
_REQUESTS = ("limit", "cursor", "kind", "q", "run")


def run_query(params: MultiMapping[str]) -> RunQuery:
    _only(params, _RUNS)
    statuses = _listed(params, "status")
    if unknown := sorted(set(statuses) - set(STATUSES)):
        raise ApiError(
            422, f"unknown status {', '.join(unknown)}; a run is one of {', '.join(STATUSES)}"
        )
    return RunQuery(_limit(params), _cursor(params, "r"), tuple(statuses), _search(params))


def request_query(params: MultiMapping[str]) -> RequestQuery:
    _only(params, _REQUESTS)
    run = params.get("run")
    if run is not None and (not run or not is_text(run)):
        raise ApiError(422, "'run' must be a run id")
    kinds = tuple(_listed(params, "kind"))
    return RequestQuery(_limit(params), _cursor(params, "q"), kinds, _search(params), run)


def cursor_of(list_name: str, seq: int | None) -> str | None:
    """The opaque cursor of the page after the item at ``seq`` of list ``"r"`` or ``"q"``."""
    if seq is None:
        return None
    return base64.urlsafe_b64encode(f"{list_name}{seq}".encode()).decode().rstrip("=")


def _only(params: MultiMapping[str], allowed: tuple[str, ...]) -> None:
    if extra := ", ".join(sorted({repr(k) for k in params if k not in allowed})):
        raise ApiError(422, f"unknown parameter(s) {extra}; allowed: {', '.join(allowed)}")


def _limit(params: MultiMapping[str]) -> int:
    given = params.get("limit")
    if given is None:
        return DEFAULT_LIMIT
    if not (given.isascii() and given.isdigit()) or not 1 <= int(given) <= MAX_LIMIT:
        raise ApiError(422, f"'limit' must be a whole number from 1 to {MAX_LIMIT}, got {given!r}")
    return int(given)


def _cursor(params: MultiMapping[str], list_name: str) -> int | None:
    given = params.get("cursor")
    if given is None or given == "":
        return None
    try:
        text = base64.urlsafe_b64decode(given + "=" * (-len(given) % 4)).decode("ascii")
    except (binascii.Error, ValueError):
        text = ""
    if not text.startswith(list_name) or not text[1:].isdigit():
        raise ApiError(422, "'cursor' is not one this list gave (use the 'next' of a reply)")
    return int(text[1:])


def _listed(params: MultiMapping[str], name: str) -> list[str]:
    return [v.strip() for value in params.getall(name, ()) for v in value.split(",") if v.strip()]


def _search(params: MultiMapping[str]) -> str | None:
    given = params.get("q")
    if given is None or not given.strip():
        return None
    if len(given) > MAX_SEARCH or not is_text(given):
        raise ApiError(422, f"'q' must be text of at most {MAX_SEARCH} characters")
    return given.lower()
