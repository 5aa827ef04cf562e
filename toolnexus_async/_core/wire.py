"""Wire data: what a suspended tool asks (:class:`Request`) and what comes back
(:class:`Answer`), with the checks and the shared JSON form of both.

Rule of this module: plain values and their ``to_dict``/``from_dict``; ``to_dict`` uses the
keys every toolnexus port shares (``expiresAt`` is the only camel-cased one), so a request
parked by this package can be answered by a host written against another port.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import attrs

from .errors import AnswerMismatchError, PayloadError
from .fastinit import fast_init

__all__ = ("Answer", "Request")


def new_request_id() -> str:
    # 128 random bits as 32 hex digits, the form uuid4().hex had (122 of them random),
    # without building a UUID in Python for every request a tool raises.
    return "req_" + os.urandom(16).hex()


# RFC 3339 proper: fromisoformat alone also takes ISO 8601 forms (week dates, basic format,
# no seconds) that other toolnexus ports would refuse.
_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})?")


def parse_timestamp(value: str) -> datetime:
    """Parse an RFC 3339 timestamp; an offset is required, since a naive time is ambiguous."""
    if not _RFC3339.fullmatch(value):
        raise PayloadError(
            f"expires_at {value!r} is not an RFC 3339 timestamp (like 2030-01-01T12:00:00Z)"
        )
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise PayloadError(f"expires_at {value!r} is not an RFC 3339 timestamp") from None
    if parsed.tzinfo is None:
        raise PayloadError(f"expires_at {value!r} has no UTC offset (write Z or +00:00)")
    return parsed


def wrong_type(owner: str, field: str, expected: str, value: object) -> PayloadError:
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
    return PayloadError(f"{owner}.{field} must be {expected}, got {type(value).__name__} {shown}")


def _check_str(owner: str, field: str, value: object, *, empty: bool = True) -> None:
    if not isinstance(value, str):
        raise wrong_type(owner, field, "a str", value)
    if not empty and not value:
        raise PayloadError(f"{owner}.{field} must not be empty")


def check_optional(owner: str, field: str, value: object, kind: type, expected: str) -> None:
    if value is not None and not isinstance(value, kind):
        raise wrong_type(owner, field, f"{expected} or None", value)


def _require(payload: Mapping[str, Any], key: str, kind: type, what: str) -> Any:
    if key not in payload:
        raise PayloadError(f"{what} payload is missing {key!r}")
    value = payload[key]
    # bool is an int subclass; an Answer's ok must be a real bool, not 1.
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise PayloadError(f"{what} {key!r} must be {kind.__name__}, got {type(value).__name__}")
    return value


def _optional(payload: Mapping[str, Any], key: str, kind: type, what: str) -> Any:
    value = payload.get(key)
    if value is not None and not isinstance(value, kind):
        raise PayloadError(
            f"{what} {key!r} must be {kind.__name__} or absent, got {type(value).__name__}"
        )
    return value


def _mapping(payload: object, what: str) -> Mapping[str, Any]:
    if not isinstance(payload, Mapping):
        raise PayloadError(f"{what} payload must be a JSON object, got {type(payload).__name__}")
    return payload


@fast_init
@attrs.frozen
class Request:
    """What a suspended tool needs from a human (or any host) before it can finish.

    Args:
        id: unique id; an answer must echo it. ``ToolResult.pending`` fills an empty one.
        kind: open vocabulary: ``"authorization"``, ``"approval"``, ``"input"``,
            ``"question"``, ...
        prompt: the text shown to whoever answers.
        url: a link to open, for ``"authorization"`` (a login page) and the like.
        data: anything structured the answerer needs (a form schema, the arguments).
        expires_at: RFC 3339 timestamp after which the request is answered as expired.

    >>> Request("r1", "approval", "Pay 30 EUR?").to_dict()
    {'id': 'r1', 'kind': 'approval', 'prompt': 'Pay 30 EUR?'}
    """

    id: str
    kind: str
    prompt: str
    url: str | None = None
    data: dict[str, Any] | None = None
    expires_at: str | None = None

    def __attrs_post_init__(self) -> None:
        # As strict as from_dict, except that an empty id is allowed here: it asks
        # ToolResult.pending for a generated one. The usual request (plain str fields, no
        # expiry) is checked in one expression, without a call per field: a gate builds
        # one per call it holds (9,536 instructions a Request against 12,402, callgrind).
        if (
            type(self.id) is str
            and type(self.kind) is str
            and self.kind
            and type(self.prompt) is str
            and (self.url is None or type(self.url) is str)
            and (self.data is None or type(self.data) is dict)
            and self.expires_at is None
        ):
            return
        _check_str("Request", "id", self.id)
        _check_str("Request", "kind", self.kind, empty=False)
        _check_str("Request", "prompt", self.prompt)
        check_optional("Request", "url", self.url, str, "a str")
        check_optional("Request", "data", self.data, dict, "a dict")
        if self.expires_at is not None:
            _check_str("Request", "expires_at", self.expires_at)
            parse_timestamp(self.expires_at)

    def expired(self, now: datetime | None = None) -> bool:
        """True when ``expires_at`` is set and has passed (``now`` defaults to the clock)."""
        if self.expires_at is None:
            return False
        return parse_timestamp(self.expires_at) <= (now or datetime.now(UTC))

    def seconds_left(self, now: datetime | None = None) -> float | None:
        """Seconds until ``expires_at`` (negative once passed), or None without one."""
        if self.expires_at is None:
            return None
        delta = parse_timestamp(self.expires_at) - (now or datetime.now(UTC))
        return delta.total_seconds()

    def to_dict(self) -> dict[str, Any]:
        """The wire form; absent optionals are omitted."""
        out: dict[str, Any] = {"id": self.id, "kind": self.kind, "prompt": self.prompt}
        if self.url is not None:
            out["url"] = self.url
        if self.data is not None:
            out["data"] = self.data
        if self.expires_at is not None:
            out["expiresAt"] = self.expires_at
        return out

    @classmethod
    def from_dict(cls, payload: Mapping[str, Any]) -> Request:
        """Build from the wire form; raises :class:`PayloadError` naming what is wrong."""
        payload = _mapping(payload, "Request")
        request_id = _require(payload, "id", str, "Request")
        if not request_id:
            raise PayloadError("Request 'id' must not be empty")
        return cls(
            id=request_id,
            kind=_require(payload, "kind", str, "Request"),
            prompt=_require(payload, "prompt", str, "Request"),
            url=_optional(payload, "url", str, "Request"),
            data=_optional(payload, "data", dict, "Request"),
            expires_at=_optional(payload, "expiresAt", str, "Request"),
        )


# Advisory, but a closed set: a typo ("decline") would otherwise pass unnoticed.
REASONS: tuple[str, ...] = ("declined", "cancelled", "expired")


@fast_init
@attrs.frozen
class Answer:
    """The host's reply to a :class:`Request`.

    Args:
        id: the id of the request it answers.
        ok: True to let the tool go on; False to refuse.
        data: what the human supplied (form fields, chosen options).
        reason: only when ``ok`` is false, advisory: ``"declined"``, ``"cancelled"`` or
            ``"expired"``.

    Every field is checked on construction, as strictly as :meth:`from_dict` checks the
    wire form: ``ok`` must be a real bool, so ``Answer(id, "no")`` (a form that posts a
    string) raises :class:`PayloadError` instead of counting as an approval.

    >>> Answer.from_dict({"id": "r1", "ok": False, "reason": "declined"})
    Answer(id='r1', ok=False, data=None, reason='declined')
    """

    id: str
    ok: bool
    data: dict[str, Any] | None = None
    reason: str | None = None

    def __attrs_post_init__(self) -> None:
        # The usual answer (an approval or a plain refusal) in one expression; anything
        # else, and every error, through the checks below.
        ok = self.ok
        if (
            type(self.id) is str
            and self.id
            and (ok is True or ok is False)
            and (self.data is None or type(self.data) is dict)
            and self.reason is None
        ):
            return
        _check_str("Answer", "id", self.id, empty=False)
        if self.ok is not True and self.ok is not False:
            raise wrong_type("Answer", "ok", "True or False", self.ok)
        check_optional("Answer", "data", self.data, dict, "a dict")
        if self.reason is not None:
            if self.ok:
                raise PayloadError("an Answer with ok=True carries no reason")
            if self.reason not in REASONS:
                raise PayloadError(
                    f"Answer.reason must be one of {', '.join(REASONS)} or None, "
                    f"got {self.reason!r}"
                )

    def to_dict(self) -> dict[str, Any]:
        """The wire form; absent optionals are omitted."""
        out: dict[str, Any] = {"id": self.id, "ok": self.ok}
        if self.data is not None:
            out["data"] = self.data
        if self.reason is not None:
            out["reason"] = self.reason
        return out

    @classmethod
    def from_dict(cls, payload: Mapping[str, Any]) -> Answer:
        """Build from the wire form; raises :class:`PayloadError` naming what is wrong."""
        payload = _mapping(payload, "Answer")
        return cls(
            id=_require(payload, "id", str, "Answer"),
            ok=_require(payload, "ok", bool, "Answer"),
            data=_optional(payload, "data", dict, "Answer"),
            reason=_optional(payload, "reason", str, "Answer"),
        )


@fast_init
@attrs.frozen
class ApprovalClaim:
    """What an approving answer says about the call it approves: the ``digest`` it names
    (``data["digest"]``), and the ``arguments`` it gives (``data["arguments"]``) when
    ``edits`` (the key is present). Checked against the request by :func:`claim_refusal`,
    wherever an answer is taken (an inbox, a store, a resume)."""

    digest: str | None
    arguments: object = None
    edits: bool = False


def approval_claim(answer: Answer) -> ApprovalClaim | None:
    """The claim an approving answer makes, or ``None`` when it makes none.

    An approval request of the acting built-ins and of ``require_approval`` carries
    ``data["digest"]``, a SHA-256 over exactly what will run; a client that echoes it in its
    answer binds the answer to what it showed. An answer to a ``require_approval(...,
    editable=True)`` request may also carry changed ``data["arguments"]``."""
    data = answer.data
    if not answer.ok or data is None:
        return None
    digest = data.get("digest")
    named = digest if isinstance(digest, str) else None
    if "arguments" in data:
        return ApprovalClaim(named, data["arguments"], edits=True)
    return ApprovalClaim(named) if named is not None else None


def claim_refusal(request: Request, claim: ApprovalClaim | None) -> AnswerMismatchError | None:
    """The refusal of an answer that approves another call than ``request`` shows, or
    ``None`` when it may be taken.

    Refused: a named digest that is not the request's (a stale page, a crossed answer);
    changed arguments for a request that does not take them (only a ``require_approval(...,
    editable=True)`` request does), that are not a JSON object, or that do not name the
    digest of the call they change. Arguments equal to the request's are no change. An
    answer that names nothing is not refused here."""
    if claim is None:
        return None
    data = request.data or {}
    shown = data.get("digest")
    if claim.digest is not None and isinstance(shown, str) and shown != claim.digest:
        return _refused(
            request,
            f"the answer to request {request.id!r} approves {claim.digest!r}, but the request "
            f"is for {shown!r}: what was approved is not what would run",
        )
    if not claim.edits or claim.arguments == data.get("arguments"):
        return None
    if data.get("editable") is not True:
        return _refused(
            request,
            f"the answer to request {request.id!r} changes the arguments, but the request "
            f"does not take changed arguments (only require_approval(..., editable=True) "
            f"does): approve it as shown, without data['arguments'], or decline it",
        )
    if not isinstance(claim.arguments, dict):
        return _refused(
            request,
            f"the answer to request {request.id!r} gives data['arguments'] as "
            f"{type(claim.arguments).__name__}; changed arguments must be a JSON object",
        )
    if claim.digest is None:
        return _refused(
            request,
            f"the answer to request {request.id!r} changes the arguments without naming the "
            f"call it changes: echo the request's data['digest'] with them",
        )
    return None


def _refused(request: Request, why: str) -> AnswerMismatchError:
    return AnswerMismatchError(request.id, f"{why}, so nothing was taken")
