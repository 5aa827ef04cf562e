"""The audit trail of answers: who gave each, what they were shown, and what became of it.

Rules of this module:

- **Who answered is the host's word, never the sender's.** ``answered_by`` is a short
  printable string the host supplies from what it authenticated (``serve`` puts its
  principal there: ``"api"``, ``"session:<id>"``, ...); nothing in an :class:`Answer` sets
  it, so a client cannot claim to be someone else. It names a principal and must never be
  a credential: serve's token and session ids never reach it (a session is named by a
  short handle derived from its id's SHA-256, which reveals nothing of the id).
- **What they saw is the request's own digest.** :func:`shown_digest` is the request's
  ``data["digest"]`` when it carries one (an approval of an acting built-in or of
  ``require_approval``: the SHA-256 over exactly what runs, which every page shows and
  echoes, and which ``wire.claim_refusal`` binds an approval to); a request without one
  (a question, a sign-in link) is named by the SHA-256 of its wire form
  (``Request.to_dict()`` as canonical JSON), which is all any client is shown of it
  (serve's display is a pure function of it).
- Pure values and functions: the stores write an :class:`AnswerRecord` in the transaction
  that takes the answer (``durable``), the inbox keeps one in memory.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

import attrs

from .errors import (
    AlreadyAnsweredError,
    AlreadyResumedError,
    AnswerMismatchError,
    RequestExpiredError,
    UsageError,
)
from .hotjson import canonical, json_string
from .types import Request

__all__ = (
    "AnswerRecord",
    "Outcome",
    "canonical_digest",
    "check_answered_by",
    "refusal_detail",
    "shown_digest",
)

Outcome = Literal["approved", "declined", "refused"]

# Long enough for an e-mail address or a "kind:id" pair, short enough for a log line.
MAX_ANSWERED_BY = 200


@attrs.frozen
class AnswerRecord:
    """One answer given to a request, as the audit trail keeps it (append-only).

    Attributes:
        request_id, run_id, call_id: the request answered, its run and its call (``None``
            where an inbox without a store does not know them).
        outcome: ``"approved"`` (an answer with ``ok`` true was taken: an approval, or a
            question answered), ``"declined"`` (one with ``ok`` false was taken) or
            ``"refused"`` (nothing was taken: see ``detail``).
        detail: for ``declined``, the answer's reason (``"declined"``, ``"cancelled"``,
            ``"expired"``) if it gave one; for ``refused``, why: ``"already_answered"``,
            ``"expired"``, ``"closed"`` (its run went on without it) or ``"mismatch"``
            (it approved another call than the request showed).
        answered_by: who gave it, as the host authenticated them (``None``: not said).
        at: when (seconds since the epoch).
        digest: what the request showed (:func:`shown_digest`).
        worker: the durable worker that took it (``None`` in an inbox).
    """

    request_id: str
    run_id: str | None
    call_id: str | None
    outcome: Outcome
    detail: str | None
    answered_by: str | None
    at: float
    digest: str
    worker: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The record as serve's API shows it."""
        return {
            "request_id": self.request_id,
            "call_id": self.call_id,
            "outcome": self.outcome,
            "detail": self.detail,
            "answered_by": self.answered_by,
            "at": self.at,
            "digest": self.digest,
            "worker": self.worker,
        }


def check_answered_by(value: object) -> str | None:
    """``value`` if it can name who answered (``None``, or a printable string of 1 to
    :data:`MAX_ANSWERED_BY` characters), else :class:`UsageError` saying why."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise UsageError(f"answered_by must be a str or None, got {type(value).__name__}")
    if not value or len(value) > MAX_ANSWERED_BY or not value.isprintable():
        raise UsageError(
            f"answered_by must be 1 to {MAX_ANSWERED_BY} printable characters (a principal"
            f" such as 'user:alice'), got {len(value)} characters"
        )
    return value


def shown_digest(request: Request) -> str:
    """What ``request`` showed whoever answered it (see the module rules)."""
    named = (request.data or {}).get("digest")
    if isinstance(named, str):
        return named
    return canonical_digest(request.to_dict())


def canonical_digest(value: object) -> str:
    """``sha256:`` over ``value`` as canonical JSON (sorted keys, no spaces, text as it is):
    the one form every digest of this package is taken over."""
    # hotjson's encoder calls json's C encoder itself: a require_approval gate digests the
    # arguments of every call it holds, and JSONEncoder.encode's two Python steps cost
    # 23,176 instructions a digest against 18,407 (callgrind, {"tool", "arguments"}).
    if (
        type(value) is dict
        and len(value) == 2
        and type(tool := value.get("tool")) is str
        and "arguments" in value
    ):
        # A gate's {"tool", "arguments"}: the same text, put together around the arguments'
        # own encoding ("arguments" sorts first), without a list of the outer items, a sort
        # and the escaping of two keys (callgrind, 3.11.7, {"a": 2, "b": 3}: 22,931
        # instructions a digest through canonical alone, 21,033 this way).
        # tests/test_json.py holds the two paths to the same digest.
        text = f'{{"arguments":{canonical(value["arguments"])},"tool":{json_string(tool)}}}'
    else:
        text = canonical(value)
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def refusal_detail(refusal: Exception) -> str | None:
    """The ``detail`` of a refused answer, or ``None`` for a refusal that is not recorded
    (an unknown request: there is nothing to attach it to)."""
    if isinstance(refusal, AlreadyAnsweredError):
        return "already_answered"
    if isinstance(refusal, RequestExpiredError):
        return "expired"
    if isinstance(refusal, AlreadyResumedError):
        return "closed"
    if isinstance(refusal, AnswerMismatchError):
        return "mismatch"
    return None


def taken_outcome(ok: bool, reason: str | None) -> tuple[Outcome, str | None]:
    """The ``(outcome, detail)`` of a taken answer."""
    return ("approved", None) if ok else ("declined", reason)
