"""Wire data and results: Request, Answer, ToolResult and pending_of (DESIGN §2)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
import pytest

from toolnexus_async import (
    Answer,
    PayloadError,
    Request,
    RunResult,
    ToolContext,
    ToolnexusError,
    ToolResult,
    UserMessage,
    pending_of,
)

NOW = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)


# --- Request: wire form ---------------------------------------------------------------------


def test_request_to_dict_uses_wire_keys_including_expires_at():
    """Every optional is written under its fixed wire key; expires_at travels as expiresAt."""
    request = Request(
        "r1",
        "authorization",
        "Log in",
        url="https://example.com/login",
        data={"scope": "mail"},
        expires_at="2030-01-01T12:00:00Z",
    )
    assert request.to_dict() == {
        "id": "r1",
        "kind": "authorization",
        "prompt": "Log in",
        "url": "https://example.com/login",
        "data": {"scope": "mail"},
        "expiresAt": "2030-01-01T12:00:00Z",
    }


def test_request_to_dict_omits_absent_optionals():
    """Absent optionals are omitted, not written as null."""
    assert Request("r1", "approval", "Pay?").to_dict() == {
        "id": "r1",
        "kind": "approval",
        "prompt": "Pay?",
    }


def test_request_round_trips_through_the_wire_form():
    """from_dict(to_dict(r)) gives back an equal Request."""
    request = Request(
        "r1", "input", "Name?", data={"a": [1]}, expires_at="2030-01-01T12:00:00+02:00"
    )
    assert Request.from_dict(request.to_dict()) == request


def test_request_from_dict_reads_expires_at_from_the_camel_case_key():
    """The wire key is expiresAt; the Python attribute is expires_at."""
    payload = {"id": "r1", "kind": "input", "prompt": "p", "expiresAt": "2030-01-01T00:00:00Z"}
    assert Request.from_dict(payload).expires_at == "2030-01-01T00:00:00Z"


def test_request_from_dict_accepts_explicit_nulls_for_optionals():
    """A null optional is the same as an absent one."""
    payload = {"id": "r1", "kind": "k", "prompt": "p", "url": None, "data": None}
    assert Request.from_dict(payload) == Request("r1", "k", "p")


@pytest.mark.parametrize("key", ["id", "kind", "prompt"])
def test_request_from_dict_names_a_missing_required_key(key: str):
    """A missing required key is refused with a PayloadError naming it."""
    payload: dict[str, Any] = {"id": "r1", "kind": "k", "prompt": "p"}
    del payload[key]
    with pytest.raises(PayloadError, match=repr(key)):
        Request.from_dict(payload)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("id", 7),
        ("id", None),
        ("kind", ["approval"]),
        ("prompt", b"bytes"),
        ("url", 3),
        ("data", [1, 2]),
        ("data", "text"),
        ("expiresAt", 1700000000),
    ],
)
def test_request_from_dict_names_a_key_of_the_wrong_type(key: str, value: object):
    """A key holding the wrong JSON type is refused with a PayloadError naming the key."""
    payload: dict[str, Any] = {"id": "r1", "kind": "k", "prompt": "p", key: value}
    with pytest.raises(PayloadError, match=repr(key)):
        Request.from_dict(payload)


@pytest.mark.parametrize("payload", [None, "r1", ["id", "r1"], 42])
def test_request_from_dict_refuses_a_non_mapping(payload: Any):
    """A payload that is not a JSON object is refused with a PayloadError, not a TypeError."""
    with pytest.raises(PayloadError, match="JSON object"):
        Request.from_dict(payload)


def test_payload_error_is_a_toolnexus_error_and_a_value_error():
    """PayloadError belongs to the one error tree and is still a ValueError."""
    with pytest.raises(PayloadError) as info:
        Request.from_dict({})
    assert isinstance(info.value, ToolnexusError)
    assert isinstance(info.value, ValueError)


# --- Request: expires_at --------------------------------------------------------------------


@pytest.mark.parametrize(
    "stamp",
    ["2030-01-01T12:00:00Z", "2030-01-01T12:00:00+02:00", "2030-01-01T12:00:00.250-05:30"],
)
def test_request_accepts_rfc3339_timestamps_with_an_offset(stamp: str):
    """An RFC 3339 timestamp with Z or a numeric offset is accepted as is."""
    assert Request("r", "k", "p", expires_at=stamp).expires_at == stamp


def test_request_refuses_a_timestamp_without_offset():
    """A naive time is ambiguous: expires_at without an offset is refused."""
    with pytest.raises(PayloadError, match="offset"):
        Request("r", "k", "p", expires_at="2030-01-01T12:00:00")


def test_request_from_dict_refuses_a_timestamp_without_offset():
    """The wire path applies the same offset rule."""
    payload = {"id": "r", "kind": "k", "prompt": "p", "expiresAt": "2030-01-01T12:00:00"}
    with pytest.raises(PayloadError, match="offset"):
        Request.from_dict(payload)


@pytest.mark.parametrize("stamp", ["tomorrow", "", "2030-13-01T00:00:00Z", "12:00:00Z"])
def test_request_refuses_text_that_is_no_timestamp(stamp: str):
    """expires_at that is not a timestamp at all is refused with a PayloadError."""
    with pytest.raises(PayloadError, match="RFC 3339"):
        Request("r", "k", "p", expires_at=stamp)


@pytest.mark.parametrize(
    "stamp",
    [
        "20300101T120000Z",  # ISO 8601 basic format
        "2030-W01-2T12:00:00Z",  # ISO week date
        "2030-01-01T12:00Z",  # no seconds
        "2030-01-01T12:00:00+0200",  # offset without colon
    ],
)
def test_request_refuses_iso8601_forms_that_are_not_rfc3339(stamp: str):
    """expires_at is RFC 3339, the profile every port parses, not any ISO 8601 spelling."""
    with pytest.raises(PayloadError, match="RFC 3339"):
        Request("r", "k", "p", expires_at=stamp)


def test_request_expired_and_seconds_left_without_expiry():
    """Without expires_at a request never expires and has no seconds left."""
    request = Request("r", "k", "p")
    assert request.expired(NOW) is False
    assert request.seconds_left(NOW) is None


def test_request_expired_compares_with_the_given_now():
    """expired(now) is true once expires_at is at or before now."""
    request = Request("r", "k", "p", expires_at="2030-01-01T12:00:00Z")
    assert request.expired(NOW - timedelta(seconds=1)) is False
    assert request.expired(NOW) is True
    assert request.expired(NOW + timedelta(seconds=1)) is True


def test_request_seconds_left_is_signed_and_honours_offsets():
    """seconds_left counts down to expires_at (offset applied) and goes negative after."""
    request = Request("r", "k", "p", expires_at="2030-01-01T14:00:30+02:00")
    assert request.seconds_left(NOW) == 30.0
    assert request.seconds_left(NOW + timedelta(minutes=1)) == -30.0


def test_request_expired_defaults_to_the_clock():
    """Without now, the current time decides: a past stamp is expired, a far one is not."""
    assert Request("r", "k", "p", expires_at="2000-01-01T00:00:00Z").expired() is True
    future = Request("r", "k", "p", expires_at="2999-01-01T00:00:00Z")
    assert future.expired() is False
    left = future.seconds_left()
    assert left is not None and left > 0


# --- Answer ---------------------------------------------------------------------------------


def test_answer_to_dict_uses_wire_keys_and_omits_absent_optionals():
    """Answer's wire keys are id, ok, data, reason; absent optionals are left out."""
    assert Answer("r1", True).to_dict() == {"id": "r1", "ok": True}
    assert Answer("r1", True, data={"x": 1}).to_dict() == {"id": "r1", "ok": True, "data": {"x": 1}}
    assert Answer("r1", False, reason="declined").to_dict() == {
        "id": "r1",
        "ok": False,
        "reason": "declined",
    }


@pytest.mark.parametrize(
    "answer",
    [
        Answer("r1", True, data={"pick": "a"}),
        Answer("r1", False, reason="expired"),
        Answer("r", False),
    ],
)
def test_answer_round_trips_through_the_wire_form(answer: Answer):
    """from_dict(to_dict(a)) gives back an equal Answer."""
    assert Answer.from_dict(answer.to_dict()) == answer


def test_answer_from_dict_refuses_a_missing_id():
    """An answer without id cannot be matched to its request: refused, naming 'id'."""
    with pytest.raises(PayloadError, match="'id'"):
        Answer.from_dict({"ok": True})


def test_answer_from_dict_refuses_a_missing_ok():
    """ok is required."""
    with pytest.raises(PayloadError, match="'ok'"):
        Answer.from_dict({"id": "r1"})


@pytest.mark.parametrize("value", [1, 0, "true", None, "false"])
def test_answer_from_dict_refuses_ok_that_is_not_a_bool(value: object):
    """ok must be a real JSON boolean: 1, 0 and "true" are refused, naming 'ok'."""
    with pytest.raises(PayloadError, match="'ok'"):
        Answer.from_dict({"id": "r1", "ok": value})


@pytest.mark.parametrize(
    ("key", "value"), [("id", 1), ("id", True), ("data", "x"), ("data", [1]), ("reason", 5)]
)
def test_answer_from_dict_names_a_key_of_the_wrong_type(key: str, value: object):
    """A key holding the wrong JSON type is refused with a PayloadError naming the key."""
    payload: dict[str, Any] = {"id": "r1", "ok": False, key: value}
    with pytest.raises(PayloadError, match=repr(key)):
        Answer.from_dict(payload)


@pytest.mark.parametrize("payload", [None, [], "ok", 1.5])
def test_answer_from_dict_refuses_a_non_mapping(payload: Any):
    """A payload that is not a JSON object is refused with a PayloadError."""
    with pytest.raises(PayloadError, match="JSON object"):
        Answer.from_dict(payload)


def test_answer_with_ok_true_and_a_reason_is_refused():
    """reason only accompanies ok=False; constructing ok=True with a reason is refused."""
    with pytest.raises(PayloadError, match="reason"):
        Answer("r1", True, reason="declined")


def test_answer_from_dict_with_ok_true_and_a_reason_is_refused():
    """The wire path refuses ok=True with a reason as well."""
    with pytest.raises(PayloadError, match="reason"):
        Answer.from_dict({"id": "r1", "ok": True, "reason": "declined"})


def test_wire_data_is_frozen():
    """Request and Answer are immutable values."""
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        Request("r", "k", "p").id = "x"  # type: ignore[misc]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        Answer("r", True).ok = False  # type: ignore[misc]


# --- ToolResult -----------------------------------------------------------------------------


def test_tool_result_ok_and_error():
    """ok is not an error, error is; both carry the text and optional metadata unchanged."""
    assert ToolResult.ok("done") == ToolResult("done", False, None)
    assert ToolResult.ok("done", {"n": 1}) == ToolResult("done", False, {"n": 1})
    assert ToolResult.error("boom") == ToolResult("boom", True, None)
    assert ToolResult.error("boom", metadata={"code": 2}) == ToolResult("boom", True, {"code": 2})


def test_tool_result_pending_without_url():
    """A suspension: is_error true, output the prompt, metadata["pending"] the request."""
    request = Request("r1", "approval", "Pay 30 EUR?")
    result = ToolResult.pending(request)
    assert result.is_error is True
    assert result.output == "Pay 30 EUR?"
    assert result.metadata == {"pending": request}


def test_tool_result_pending_with_url_appends_it_on_its_own_line():
    """With a url, output is the prompt, a newline, then the url."""
    request = Request("r1", "authorization", "Log in", url="https://example.com/a")
    result = ToolResult.pending(request)
    assert result.output == "Log in\nhttps://example.com/a"
    assert result.metadata is not None and result.metadata["pending"] is request


def test_tool_result_pending_fills_an_empty_id_with_a_unique_one():
    """An empty request id is replaced by a generated id, different every time."""
    first = pending_of(ToolResult.pending(Request("", "approval", "ok?", data={"a": 1})))
    second = pending_of(ToolResult.pending(Request("", "approval", "ok?", data={"a": 1})))
    assert first is not None and second is not None
    assert first.id != ""
    assert second.id != ""
    assert first.id != second.id
    # Only the id changes.
    assert attrs.evolve(first, id="") == Request("", "approval", "ok?", data={"a": 1})


def test_tool_result_pending_keeps_a_given_id():
    """A non-empty request id is kept as it is."""
    request = Request("mine", "approval", "ok?")
    assert pending_of(ToolResult.pending(request)) is request


def test_auth_required_with_positional_prompt():
    """auth_required(url, prompt) suspends with kind "authorization" at url."""
    result = ToolResult.auth_required("https://example.com/login", "Log in first")
    assert result.is_error is True
    assert result.output == "Log in first\nhttps://example.com/login"
    request = pending_of(result)
    assert request is not None
    assert request.kind == "authorization"
    assert request.url == "https://example.com/login"
    assert request.prompt == "Log in first"
    assert request.id != ""


def test_auth_required_with_keyword_prompt():
    """The prompt may be passed by keyword."""
    result = ToolResult.auth_required(url="https://x.test/", prompt="Sign in please")
    request = pending_of(result)
    assert request is not None
    assert request.prompt == "Sign in please"
    assert result.output == "Sign in please\nhttps://x.test/"


def test_auth_required_has_a_default_prompt():
    """Without a prompt a non-empty default is used, and the output still ends with the url."""
    result = ToolResult.auth_required("https://x.test/login")
    request = pending_of(result)
    assert request is not None
    assert request.kind == "authorization"
    assert request.prompt.strip() != ""
    assert result.output == f"{request.prompt}\nhttps://x.test/login"


# --- pending_of -----------------------------------------------------------------------------


def test_pending_of_a_suspended_tool_result():
    """pending_of returns the Request carried by a suspended ToolResult."""
    request = Request("r1", "approval", "ok?")
    assert pending_of(ToolResult.pending(request)) is request


def test_pending_of_ordinary_results_is_none():
    """An ok or error result without a suspension carries no Request."""
    assert pending_of(ToolResult.ok("x")) is None
    assert pending_of(ToolResult.error("x")) is None
    assert pending_of(ToolResult.ok("x", {"other": 1})) is None


def test_pending_of_ignores_a_pending_key_that_is_not_a_request():
    """Only a real Request under metadata["pending"] counts as a suspension."""
    assert pending_of(ToolResult.error("x", {"pending": {"id": "r1"}})) is None


def test_pending_of_a_halted_run_result():
    """A RunResult with status "pending" yields its pending Request."""
    request = Request("r1", "approval", "ok?")
    run = RunResult(status="pending", text="", messages=(UserMessage("hi"),), pending=request)
    assert pending_of(run) is request


def test_pending_of_a_finished_run_result_is_none():
    """A done or incomplete RunResult carries no Request."""
    done = RunResult(status="done", text="fine", messages=())
    incomplete = RunResult(status="incomplete", text="", messages=(), limit="max_turns")
    assert pending_of(done) is None
    assert pending_of(incomplete) is None


@pytest.mark.parametrize("thing", [None, "pending", Request("r", "k", "p"), {"pending": 1}, 3])
def test_pending_of_anything_else_is_none(thing: object):
    """Anything that is neither a ToolResult nor a RunResult yields None."""
    assert pending_of(thing) is None


def test_tool_result_pending_of_matches_the_module_function():
    """ToolResult.pending_of is the same lookup as the module-level pending_of."""
    request = Request("r1", "approval", "ok?")
    run = RunResult(status="pending", text="", messages=(), pending=request)
    assert ToolResult.pending_of(ToolResult.pending(request)) is request
    assert ToolResult.pending_of(run) is request
    assert ToolResult.pending_of(ToolResult.ok("x")) is None
    assert ToolResult.pending_of(object()) is None


# -- constructors check their fields as strictly as from_dict (issue 10) ----------------------


@pytest.mark.parametrize("ok", ["no", "false", "true", 1, 0, None, [], "yes"])
def test_answer_refuses_an_ok_that_is_not_a_bool(ok: object):
    """A form posting "false" (or "no") must not count as an approval: it is refused."""
    with pytest.raises(PayloadError, match=r"Answer\.ok must be True or False, got"):
        Answer("r1", ok)  # type: ignore[arg-type]


def test_answer_type_errors_are_also_type_errors():
    """A wrong type can be caught as TypeError too, as Python code expects."""
    with pytest.raises(TypeError):
        Answer("r1", "no")  # type: ignore[arg-type]


@pytest.mark.parametrize("request_id", ["", None, 7])
def test_answer_needs_a_non_empty_string_id(request_id: object):
    """An answer that names no request cannot be applied to any."""
    with pytest.raises(PayloadError, match=r"Answer\.id"):
        Answer(request_id, True)  # type: ignore[arg-type]


@pytest.mark.parametrize("reason", ["decline", "no", "DECLINED", ""])
def test_answer_refuses_an_unknown_reason(reason: str):
    """The reason is advisory but from a closed set: a typo is caught where it is made."""
    with pytest.raises(PayloadError, match="must be one of declined, cancelled, expired"):
        Answer("r1", False, reason=reason)
    with pytest.raises(PayloadError, match="must be one of"):
        Answer.from_dict({"id": "r1", "ok": False, "reason": reason})


def test_answer_refuses_data_that_is_not_a_dict():
    """data is what a person filled in: a JSON object or nothing."""
    with pytest.raises(PayloadError, match=r"Answer\.data must be a dict or None, got list"):
        Answer("r1", True, data=["x"])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"id": 1}, r"Request\.id must be a str"),
        ({"kind": ""}, r"Request\.kind must not be empty"),
        ({"kind": None}, r"Request\.kind must be a str"),
        ({"prompt": b"bytes"}, r"Request\.prompt must be a str"),
        ({"url": 3}, r"Request\.url must be a str or None"),
        ({"data": "x"}, r"Request\.data must be a dict or None"),
        ({"expires_at": 5}, r"Request\.expires_at must be a str"),
    ],
)
def test_request_checks_its_fields_on_construction(fields: dict[str, Any], message: str):
    """Each field of a Request is checked when it is built, naming the field."""
    values: dict[str, Any] = {"id": "r1", "kind": "approval", "prompt": "Pay?", **fields}
    with pytest.raises(PayloadError, match=message):
        Request(**values)


def test_request_from_dict_refuses_an_empty_id():
    """On the wire a request must carry its id; only the constructor may leave it empty."""
    assert Request("", "approval", "Pay?").id == ""
    with pytest.raises(PayloadError, match="'id' must not be empty"):
        Request.from_dict({"id": "", "kind": "approval", "prompt": "Pay?"})


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((None,), r"ToolResult\.output must be a str"),
        (("x", "yes"), r"ToolResult\.is_error must be True or False"),
        (("x", False, ["m"]), r"ToolResult\.metadata must be a dict or None"),
    ],
)
def test_tool_result_checks_its_fields(args: tuple[Any, ...], message: str):
    """A result with a non-text output or a non-bool error flag is refused where it is built."""
    with pytest.raises(PayloadError, match=message):
        ToolResult(*args)


def test_tool_context_checks_its_fields():
    """The context's answer must be an Answer: a bare True is not an approval."""
    with pytest.raises(PayloadError, match=r"ToolContext\.answer must be an Answer or None"):
        ToolContext(answer=True)  # type: ignore[arg-type]
    with pytest.raises(PayloadError, match=r"ToolContext\.request must be a Request or None"):
        ToolContext(request={"id": "r1"})  # type: ignore[arg-type]
    with pytest.raises(PayloadError, match=r"ToolContext\.call_id must be a str or None"):
        ToolContext(call_id=3)  # type: ignore[arg-type]


def test_tool_result_takes_subclasses_past_its_one_expression_check():
    """The usual result is checked in one expression of exact types; a str or dict
    subclass, or 1 for True, goes on to the field-by-field checks, which take or refuse
    what they always did."""

    class Text(str):
        pass

    class Meta(dict[str, Any]):
        pass

    result = ToolResult(Text("x"), True, Meta(a=1))
    assert result == ToolResult("x", True, {"a": 1})
    with pytest.raises(PayloadError, match=r"ToolResult\.is_error must be True or False"):
        ToolResult("x", 1)  # type: ignore[arg-type]


def test_tool_result_pending_builds_what_its_constructor_builds():
    """pending() builds ToolResult by its builder; a subclass's pending() builds the
    subclass, through its constructor. Both equal what the constructor gives."""
    request = Request("r1", "approval", "Pay?", url="https://pay.example/r1")
    expected = ToolResult("Pay?\nhttps://pay.example/r1", True, {"pending": request})
    built = ToolResult.pending(request)
    assert type(built) is ToolResult and built == expected and repr(built) == repr(expected)

    class Sub(ToolResult):
        __slots__ = ()

    sub = Sub.pending(request)
    assert type(sub) is Sub
    assert (sub.output, sub.is_error, sub.metadata) == (
        expected.output,
        expected.is_error,
        expected.metadata,
    )


@pytest.mark.parametrize("make, is_error", [(ToolResult.ok, False), (ToolResult.error, True)])
def test_tool_result_ok_and_error_build_what_the_constructor_builds(make, is_error):
    """ok() and error() build ToolResult by its builder, a subclass through its own
    constructor; the checks hold on both ways."""
    for metadata in (None, {"k": 1}):
        built = make("text", metadata)
        expected = ToolResult("text", is_error, metadata)
        assert type(built) is ToolResult and built == expected and repr(built) == repr(expected)
    with pytest.raises(TypeError, match="output"):
        make(1)
    with pytest.raises(TypeError, match="metadata"):
        make("text", [])

    class Sub(ToolResult):
        __slots__ = ()

    sub = getattr(Sub, make.__name__)("text")
    assert type(sub) is Sub and (sub.output, sub.is_error, sub.metadata) == ("text", is_error, None)
