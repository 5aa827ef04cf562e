"""toolnexus_async._core.hotjson: the hot path's JSON gives exactly what the json module gives."""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import pytest

from toolnexus_async._core.audit import canonical_digest
from toolnexus_async._core.hotjson import canonical, compact_encoder, loads


def _outcome(call: Any, data: Any) -> tuple[str, Any]:
    try:
        return "value", call(data)
    except (ValueError, TypeError, UnicodeDecodeError, RecursionError) as exc:
        return type(exc).__name__, str(exc)


TEXTS = [
    '{"a":1}',
    '{"a": [1, 2.5, null, true, false, "é"]}',
    '"just a string"',
    "17",
    "NaN",
    "-Infinity",
    '  {"leading": "whitespace"}',
    '{"trailing": "whitespace"} \t\r\n',
    '{"a":1}\u00a0',  # not JSON whitespace: extra data
    '{"a":1} {"b":2}',
    '{"a":1}x',
    "",
    "   ",
    "[",
    '{"a":}',
    "\ufeff{}",  # a str with a byte-order mark is refused by json.loads
]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("as_bytes", [False, True])
def test_loads_gives_what_json_loads_gives(text: str, as_bytes: bool) -> None:
    data: str | bytes = text.encode() if as_bytes else text
    ours, theirs = _outcome(loads, data), _outcome(json.loads, data)
    if ours[0] == "value" and isinstance(ours[1], float) and math.isnan(ours[1]):
        assert theirs[0] == "value" and math.isnan(theirs[1])
    else:
        assert ours == theirs


@pytest.mark.parametrize(
    "data",
    [
        '{"a":"é"}'.encode("utf-8-sig"),
        '{"a":"é"}'.encode("utf-16"),
        '{"a":"é"}'.encode("utf-32-le"),
        b'{"a":"\xff"}',  # not UTF-8 at all
    ],
)
def test_loads_leaves_other_encodings_to_json_loads(data: bytes) -> None:
    assert _outcome(loads, data) == _outcome(json.loads, data)


@pytest.mark.parametrize("data", [bytearray(b'{"a": [1]}'), bytearray(b"{"), memoryview(b"1")])
def test_loads_takes_what_json_loads_takes(data: Any) -> None:
    assert _outcome(loads, data) == _outcome(json.loads, data)


def test_loads_too_deep_is_a_recursion_error_as_with_json_loads() -> None:
    deep = "[" * 200_000 + "]" * 200_000
    with pytest.raises(RecursionError):
        json.loads(deep)
    with pytest.raises(RecursionError):
        loads(deep)


VALUES: list[Any] = [
    {"model": "m", "messages": [{"role": "user", "content": "héllo \u2028 \ud83d\ude00"}]},
    {"n": [1, -2, 2.5, 1e300, None, True, False], "nested": {"k": {"k": []}}},
    'a top-level string with "quotes" and \\ and \n',
    42,
    [],
    {},
    {"inf": math.inf, "nan": math.nan},
    {1: "int key", 2.5: "float key", None: "null key", False: "bool key"},
]


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("ensure_ascii", [False, True])
def test_compact_encoder_gives_what_json_dumps_gives(value: Any, ensure_ascii: bool) -> None:
    encode = compact_encoder(ensure_ascii=ensure_ascii)
    assert encode(value) == json.dumps(value, separators=(",", ":"), ensure_ascii=ensure_ascii)


@pytest.mark.parametrize("value", [*VALUES[:5], {"b": 1, "a": {"d": object(), "c": None}}])
def test_canonical_gives_what_json_dumps_gives_with_sorted_keys(value: Any) -> None:
    options: dict[str, Any] = {"sort_keys": True, "ensure_ascii": False, "default": repr}
    assert canonical(value) == json.dumps(value, separators=(",", ":"), **options)


def test_compact_encoder_refuses_what_json_dumps_refuses() -> None:
    encode = compact_encoder(ensure_ascii=False)
    circular: list[Any] = []
    circular.append(circular)
    with pytest.raises(ValueError, match="Circular reference"):
        encode(circular)
    with pytest.raises(TypeError, match="not JSON serializable"):
        encode({"a": object()})
    # A failed call leaves nothing behind: the next one encodes as usual.
    assert encode({"a": [1]}) == '{"a":[1]}'


def test_an_encoder_that_raised_is_not_used_again() -> None:
    # The encoder that raised had ``items`` open when it stopped: reused, it would take the
    # list for a circular reference the next time it met it.
    encode = compact_encoder(ensure_ascii=False)
    items: list[Any] = [1, object()]
    with pytest.raises(TypeError):
        encode(items)
    items.pop()
    assert encode(items) == "[1]"
    circular: dict[str, Any] = {}
    circular["self"] = circular
    with pytest.raises(ValueError, match="Circular reference"):
        encode(circular)
    del circular["self"]
    assert encode({"a": circular}) == '{"a":{}}'


def test_an_encoder_used_again_and_within_a_default_gives_what_json_dumps_gives() -> None:
    class Wrapped:
        def __init__(self, value: Any) -> None:
            self.value = value

    # The default encodes with the same function while the outer encoding is under way.
    encode = compact_encoder(ensure_ascii=True, default=lambda o: encode(o.value))
    value = {"b": Wrapped({"x": [1, "é"]}), "a": [None, True]}
    expected = json.dumps(
        value, separators=(",", ":"), default=lambda o: json.dumps(o.value, separators=(",", ":"))
    )
    for _ in range(3):
        assert encode(value) == expected


class _Odd:
    def __repr__(self) -> str:
        return "<odd>"


CALLS: list[Any] = [
    {"tool": "add", "arguments": {"a": 2, "b": 3}},
    {"arguments": {"b": [1, {"z": None, "y": 1.5}], "a": 'é\u2028"q"\\'}, "tool": "pay"},
    {"tool": 'we"ird\nname\udc80', "arguments": {}},
    {"tool": "t", "arguments": {"odd": _Odd(), "n": math.inf}},
    {"tool": "t", "arguments": [1, "two"]},
    {"tool": "t", "arguments": None},
    {"tool": "t", "arguments": "text"},
]
NOT_CALLS: list[Any] = [
    {"tool": 1, "arguments": {}},
    {"tool": "t", "argument": {}},
    {"tool": "t", "arguments": {}, "more": 1},
    {"tool": "t"},
    ["tool", "arguments"],
    "tool",
]


@pytest.mark.parametrize("value", CALLS + NOT_CALLS)
def test_a_digest_is_over_canonical_json_whatever_the_path(value: Any) -> None:
    # A gate's {"tool", "arguments"} (CALLS) is put together around its arguments, anything
    # else is canonical's: both must hash the very bytes canonical gives (stored digests
    # stay valid).
    text = canonical(value)
    expected = "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    assert canonical_digest(value) == expected
