"""The data a tool and its host exchange: requests, answers, results, the tool protocol.

Rule of this module: plain values only. Nothing here awaits, does I/O or knows about a
model; the loop and the client build on these types, never the other way round.

``Request`` and ``Answer`` are *wire data*: ``to_dict``/``from_dict`` use the keys every
toolnexus port shares (``expiresAt`` is the only camel-cased one), so a request parked by
this package can be answered by a host written against another port.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Protocol, runtime_checkable

import attrs

from ._errors import PayloadError, UsageError
from ._fastinit import fast_init

__all__ = (
    "Answer",
    "HaltRun",
    "Request",
    "Tool",
    "ToolContext",
    "ToolResult",
    "pending_of",
)

# The strictest rule among providers (OpenAI function names): a name that passes here is
# accepted by every wire style.
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def check_tool_name(name: object) -> str:
    """``name`` if every provider accepts it as a tool name, else :class:`UsageError`."""
    if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
        raise UsageError(
            f"tool name {name!r} must be 1-64 letters, digits, '_' or '-' "
            "(the rule every provider accepts)"
        )
    return name


def _new_request_id() -> str:
    return "req_" + uuid.uuid4().hex


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


def _wrong_type(owner: str, field: str, expected: str, value: object) -> PayloadError:
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
    return PayloadError(f"{owner}.{field} must be {expected}, got {type(value).__name__} {shown}")


def _check_str(owner: str, field: str, value: object, *, empty: bool = True) -> None:
    if not isinstance(value, str):
        raise _wrong_type(owner, field, "a str", value)
    if not empty and not value:
        raise PayloadError(f"{owner}.{field} must not be empty")


def _check_optional(owner: str, field: str, value: object, kind: type, expected: str) -> None:
    if value is not None and not isinstance(value, kind):
        raise _wrong_type(owner, field, f"{expected} or None", value)


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
        # ToolResult.pending for a generated one.
        _check_str("Request", "id", self.id)
        _check_str("Request", "kind", self.kind, empty=False)
        _check_str("Request", "prompt", self.prompt)
        _check_optional("Request", "url", self.url, str, "a str")
        _check_optional("Request", "data", self.data, dict, "a dict")
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
        _check_str("Answer", "id", self.id, empty=False)
        if self.ok is not True and self.ok is not False:
            raise _wrong_type("Answer", "ok", "True or False", self.ok)
        _check_optional("Answer", "data", self.data, dict, "a dict")
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
class ToolResult:
    """What a tool hands back: text for the model, an error flag, optional metadata.

    A *suspension* is a result too: :meth:`pending` wraps a :class:`Request` in
    ``metadata["pending"]``; the run loop notices it and either awaits ``wait_for`` or halts.

    >>> ToolResult.ok("sent")
    ToolResult(output='sent', is_error=False, metadata=None)
    >>> r = ToolResult.auth_required("https://example.com/login", "Log in first")
    >>> r.output
    'Log in first\\nhttps://example.com/login'
    >>> pending_of(r).kind
    'authorization'
    """

    output: str
    is_error: bool = False
    metadata: dict[str, Any] | None = None

    def __attrs_post_init__(self) -> None:
        # Plain checks, not attrs validators: a result is built on every tool call.
        if not isinstance(self.output, str):
            raise _wrong_type("ToolResult", "output", "a str", self.output)
        if self.is_error is not True and self.is_error is not False:
            raise _wrong_type("ToolResult", "is_error", "True or False", self.is_error)
        if self.metadata is not None and not isinstance(self.metadata, dict):
            raise _wrong_type("ToolResult", "metadata", "a dict or None", self.metadata)

    @classmethod
    def ok(cls, text: str, metadata: dict[str, Any] | None = None) -> ToolResult:
        """A successful result."""
        return cls(text, False, metadata)

    @classmethod
    def error(cls, text: str, metadata: dict[str, Any] | None = None) -> ToolResult:
        """A failed result; the model sees ``text`` and decides what to do."""
        return cls(text, True, metadata)

    @classmethod
    def pending(cls, request: Request) -> ToolResult:
        """A suspension: the tool cannot finish until ``request`` is answered.

        ``is_error`` is true (there is no usable answer yet); ``output`` is the prompt,
        followed by the URL on its own line when there is one. An empty ``request.id`` is
        replaced by a generated unique id.
        """
        if not request.id:
            request = attrs.evolve(request, id=_new_request_id())
        text = request.prompt if request.url is None else f"{request.prompt}\n{request.url}"
        return cls(text, True, {"pending": request})

    @classmethod
    def auth_required(
        cls, url: str, prompt: str = "Sign in to continue, then try again."
    ) -> ToolResult:
        """A suspension of kind ``"authorization"``: someone must log in at ``url``."""
        return cls.pending(Request("", "authorization", prompt, url=url))

    @staticmethod
    def pending_of(x: object) -> Request | None:
        """The :class:`Request` carried by a suspended result or a halted run, else None."""
        return pending_of(x)


def pending_of(x: object) -> Request | None:
    """The :class:`Request` carried by a ``ToolResult`` or a halted ``RunResult``, else None.

    >>> pending_of(ToolResult.ok("fine")) is None
    True
    """
    if isinstance(x, ToolResult):
        return request_in(x)
    # A RunResult (duck-typed so this module does not import the run machinery).
    if getattr(x, "status", None) == "pending":
        found = getattr(x, "pending", None)
        return found if isinstance(found, Request) else None
    return None


def request_in(result: ToolResult) -> Request | None:
    """The suspension in ``result``, if any (the hot-path form of :func:`pending_of`)."""
    meta = result.metadata
    if meta is None:
        return None
    found = meta.get("pending")
    return found if isinstance(found, Request) else None


class HaltRun(Exception):
    """Raised by a ``wait_for`` that will not wait any longer (a signal, not a failure).

    Not a :class:`ToolnexusError`: it is not an error, and ``except ToolnexusError`` around
    a run must not swallow it.

    The suspended call stays suspended and the run halts with ``status == "pending"``, as if
    no ``wait_for`` were set, so the host can store it and resume it later. The
    :class:`~toolnexus_async.Inbox` raises it for runs parked longer than ``park_timeout``.
    """


@fast_init
@attrs.frozen
class ToolContext:
    """What the run loop tells a tool about the call it is executing.

    A tool called directly (outside a run) may receive ``ctx=None`` and must cope.

    Attributes:
        answer: set only on the retry after ``wait_for`` resolved this call's suspension.
        call_id: the model's id for this tool call.
        run_id: the id of the run the call belongs to.
        tool_name: the name the model called.
        request: on that retry, the request ``answer`` answers (what the tool asked, its
            ``data`` included), so a tool can check that what was approved is what it is
            about to do.
        turn: the number of the model request that asked for the call (1 for the first).
        idempotency_key: see the property.
    """

    answer: Answer | None = None
    call_id: str | None = None
    run_id: str | None = None
    tool_name: str | None = None
    request: Request | None = None
    turn: int | None = None

    @property
    def idempotency_key(self) -> str | None:
        """A key for this tool call that is the same every time the call is executed (its
        retry after an answer, a resume in another process, a re-run after a crash) and
        different for any other call: pass it to an API that deduplicates (a payment API's
        ``Idempotency-Key``) so that a call run twice acts once. ``None`` outside a run.

        >>> ToolContext(call_id="c1", run_id="run_1", turn=1).idempotency_key
        'tnx-c67cf1c53949228854d176dfe24d38dc'
        """
        if self.run_id is None or self.call_id is None or self.turn is None:
            return None
        digest = hashlib.sha256(f"{self.run_id}\0{self.turn}\0{self.call_id}".encode())
        return "tnx-" + digest.hexdigest()[:32]

    def __attrs_post_init__(self) -> None:
        # Built for every tool call: the usual shape is checked in one expression, and
        # only a value that fails it is looked at field by field.
        answer, request = self.answer, self.request
        if (
            (answer is None or type(answer) is Answer)
            and (request is None or type(request) is Request)
            and (self.call_id is None or type(self.call_id) is str)
            and (self.run_id is None or type(self.run_id) is str)
            and (self.tool_name is None or type(self.tool_name) is str)
            and (self.turn is None or type(self.turn) is int)
        ):
            return
        if answer is not None and not isinstance(answer, Answer):
            raise _wrong_type("ToolContext", "answer", "an Answer or None", answer)
        if request is not None and not isinstance(request, Request):
            raise _wrong_type("ToolContext", "request", "a Request or None", request)
        for name in ("call_id", "run_id", "tool_name"):
            _check_optional("ToolContext", name, getattr(self, name), str, "a str")
        turn = self.turn
        if turn is not None and (isinstance(turn, bool) or not isinstance(turn, int)):
            raise _wrong_type("ToolContext", "turn", "an int or None", turn)


@runtime_checkable
class Tool(Protocol):
    """Anything with these attributes and an async ``execute`` is a tool; no base class.

    ``input_schema`` is a JSON Schema object describing ``args``. ``source`` says where the
    tool comes from: ``"custom"``, ``"native"``, ``"http"``, ``"builtin"``, ``"mcp"``, ...

    Optional, not part of the protocol's check: ``async def refused(self, args, ctx) ->
    None``, called once (at least once, in a durable run) when the call's own suspension
    ends without an ok answer (declined, cancelled, expired) and the tool will not run
    again for it; ``ctx.answer`` is the refusing answer, ``ctx.request`` its request.
    What it raises is logged and ignored (``Toolkit.refused``).
    """

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def input_schema(self) -> Mapping[str, Any]: ...

    @property
    def source(self) -> str: ...

    async def execute(self, args: dict[str, Any], ctx: ToolContext | None = None) -> ToolResult: ...
