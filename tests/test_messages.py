"""The provider-neutral transcript and its versioned JSON form (toolnexus_async/_messages.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from toolnexus_async import (
    AssistantMessage,
    Message,
    PayloadError,
    SystemMessage,
    ToolCall,
    ToolReturn,
    UserMessage,
    messages_from_json,
    messages_to_json,
)
from toolnexus_async._core.messages import unpaired_calls

EVERY_KIND: list[Message] = [
    SystemMessage("Be brief."),
    UserMessage("What is 2+3, and the weather in Oslo?"),
    AssistantMessage(
        "Let me check.",
        (
            ToolCall("c1", "add", {"a": 2, "b": 3}),
            ToolCall("c2", "weather", {"city": "Oslo", "days": [1, 2], "opts": {"unit": "C"}}),
            ToolCall("c3", "broken", {}, invalid_arguments='{"city": "Os'),
        ),
    ),
    ToolReturn("c1", "add", "5"),
    ToolReturn("c2", "weather", "sunny\n12 C"),
    ToolReturn("c3", "broken", "invalid arguments", is_error=True),
    AssistantMessage(None, (ToolCall("c4", "noargs"),)),
    ToolReturn("c4", "noargs", ""),
    AssistantMessage("It is 5, and sunny."),
    AssistantMessage(None, (), "I can't help with that."),
]


def test_every_message_kind_round_trips_through_json_text():
    """messages_from_json(json.dumps(messages_to_json(m))) == m for every message kind."""
    text = json.dumps(messages_to_json(EVERY_KIND))
    assert messages_from_json(text) == EVERY_KIND


def test_round_trip_from_the_dict_and_from_bytes():
    """The parser accepts the dict form and UTF-8 JSON bytes alike."""
    payload = messages_to_json(EVERY_KIND)
    assert messages_from_json(payload) == EVERY_KIND
    assert messages_from_json(json.dumps(payload).encode()) == EVERY_KIND


def test_json_form_has_the_documented_keys():
    """The versioned form: {"version": 2, "messages": [...]}, one plain object per message."""
    payload = messages_to_json(
        [
            SystemMessage("s"),
            UserMessage("u"),
            AssistantMessage("a", (ToolCall("c1", "t", {"x": 1}),)),
            ToolReturn("c1", "t", "out", is_error=True),
            AssistantMessage(None),
        ]
    )
    assert payload == {
        "version": 2,
        "messages": [
            {"role": "system", "text": "s"},
            {"role": "user", "text": "u"},
            {
                "role": "assistant",
                "text": "a",
                "tool_calls": [{"id": "c1", "name": "t", "arguments": {"x": 1}}],
            },
            {"role": "tool", "call_id": "c1", "name": "t", "output": "out", "is_error": True},
            {"role": "assistant", "text": None},
        ],
    }


def test_invalid_arguments_survive_the_round_trip():
    """A call whose arguments were not a JSON object keeps the raw text through storage."""
    call = ToolCall("c1", "t", {}, invalid_arguments="not json")
    payload = messages_to_json([AssistantMessage(None, (call,))])
    assert payload["messages"][0]["tool_calls"][0]["invalid_arguments"] == "not json"
    (message,) = messages_from_json(json.dumps(payload))
    assert isinstance(message, AssistantMessage)
    assert message.tool_calls == (call,)


def test_json_output_is_plain_json():
    """The JSON form serialises with the standard json module (no custom objects inside)."""
    json.dumps(messages_to_json(EVERY_KIND), allow_nan=False)


def test_empty_transcript_round_trips():
    """An empty transcript is valid."""
    assert messages_from_json(messages_to_json([])) == []


def test_optional_keys_default_when_absent():
    """Absent tool_calls, arguments and is_error take their defaults."""
    payload = {
        "version": 1,
        "messages": [
            {"role": "assistant"},
            {"role": "assistant", "text": "x", "tool_calls": [{"id": "c", "name": "t"}]},
            {"role": "tool", "call_id": "c", "name": "t", "output": "o"},
        ],
    }
    assert messages_from_json(payload) == [
        AssistantMessage(None),
        AssistantMessage("x", (ToolCall("c", "t", {}),)),
        ToolReturn("c", "t", "o", is_error=False),
    ]


def test_a_refusal_is_a_key_of_its_own_and_absent_when_there_is_none():
    """``refusal`` appears in the JSON form only when the model refused."""
    payload = messages_to_json([AssistantMessage("hi"), AssistantMessage(None, (), "no")])
    assert payload["messages"] == [
        {"role": "assistant", "text": "hi"},
        {"role": "assistant", "text": None, "refusal": "no"},
    ]
    with pytest.raises(PayloadError, match="'refusal' must be a string"):
        messages_from_json({"version": 1, "messages": [{"role": "assistant", "refusal": 3}]})


# --- version --------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [3, 0, "1", "2", True, None])
def test_unsupported_version_is_refused(version: object):
    """Versions 1 and 2 are read; any other is a PayloadError naming it."""
    with pytest.raises(PayloadError, match="version"):
        messages_from_json({"version": version, "messages": []})


def test_missing_version_is_refused():
    """A transcript without a version is refused."""
    with pytest.raises(PayloadError, match="version"):
        messages_from_json({"messages": []})


# --- malformed input ------------------------------------------------------------------------


def test_text_that_is_not_json_is_refused():
    """Invalid JSON text is a PayloadError, not a json.JSONDecodeError leaking out."""
    with pytest.raises(PayloadError, match="not valid JSON"):
        messages_from_json('{"version": 1, "messages": [')


@pytest.mark.parametrize("payload", [[], "[]", "3", 3, None])
def test_top_level_that_is_not_an_object_is_refused(payload: Any):
    """The transcript must be a JSON object."""
    with pytest.raises(PayloadError, match="JSON object"):
        messages_from_json(payload)


@pytest.mark.parametrize("messages", [None, {}, "x"])
def test_messages_that_is_not_a_list_is_refused(messages: object):
    """'messages' must be a list."""
    with pytest.raises(PayloadError, match="'messages' must be a list"):
        messages_from_json({"version": 1, "messages": messages})


def _one(item: object) -> dict[str, Any]:
    """A transcript whose second message is ``item`` (the first is valid)."""
    return {"version": 1, "messages": [{"role": "user", "text": "ok"}, item]}


@pytest.mark.parametrize("role", ["robot", None, "System", 1])
def test_unknown_role_is_refused_naming_the_message(role: object):
    """An unknown role is a PayloadError naming the message's index and the role."""
    with pytest.raises(PayloadError, match=r"messages\[1\]: unknown role"):
        messages_from_json(_one({"role": role, "text": "x"}))


def test_message_that_is_not_an_object_is_refused():
    """Each message must be a JSON object; the error names its index."""
    with pytest.raises(PayloadError, match=r"messages\[1\] must be a JSON object"):
        messages_from_json(_one("hello"))


@pytest.mark.parametrize(
    ("item", "key"),
    [
        ({"role": "user", "text": 3}, "text"),
        ({"role": "user"}, "text"),
        ({"role": "system", "text": None}, "text"),
        ({"role": "assistant", "text": 5}, "text"),
        ({"role": "tool", "call_id": 1, "name": "t", "output": "o"}, "call_id"),
        ({"role": "tool", "call_id": "c", "output": "o"}, "name"),
        ({"role": "tool", "call_id": "c", "name": "t", "output": ["o"]}, "output"),
        ({"role": "tool", "call_id": "c", "name": "t", "output": "o", "is_error": 1}, "is_error"),
        ({"role": "assistant", "tool_calls": {"id": "c"}}, "tool_calls"),
    ],
)
def test_wrong_types_are_refused_naming_the_key(item: dict[str, Any], key: str):
    """A field of the wrong type is a PayloadError naming the message and the key."""
    with pytest.raises(PayloadError, match=rf"messages\[1\].*'{key}'"):
        messages_from_json(_one(item))


@pytest.mark.parametrize(
    ("call", "key"),
    [
        ({"name": "t"}, "id"),
        ({"id": 1, "name": "t"}, "id"),
        ({"id": "c"}, "name"),
        ({"id": "c", "name": "t", "arguments": "{}"}, "arguments"),
        ({"id": "c", "name": "t", "arguments": [1]}, "arguments"),
        ({"id": "c", "name": "t", "invalid_arguments": 7}, "invalid_arguments"),
    ],
)
def test_malformed_tool_calls_are_refused_naming_the_call(call: dict[str, Any], key: str):
    """A malformed tool call is a PayloadError naming its position and the key."""
    item = {"role": "assistant", "text": None, "tool_calls": [{"id": "ok", "name": "t"}, call]}
    with pytest.raises(PayloadError, match=rf"messages\[1\]\.tool_calls\[1\].*'{key}'"):
        messages_from_json(_one(item))


def test_tool_call_that_is_not_an_object_is_refused():
    """Each tool call must be a JSON object."""
    item = {"role": "assistant", "tool_calls": ["c1"]}
    with pytest.raises(PayloadError, match=r"messages\[1\]\.tool_calls\[0\] must be a JSON object"):
        messages_from_json(_one(item))


# --- unpaired_calls -------------------------------------------------------------------------


def test_unpaired_calls_empty_for_a_transcript_without_calls():
    """No tool calls, nothing unpaired."""
    assert unpaired_calls([]) == []
    assert unpaired_calls([UserMessage("hi"), AssistantMessage("hello")]) == []


def test_unpaired_calls_lists_every_call_without_a_result():
    """An assistant turn with no results yet has all its calls unpaired, in call order."""
    c1, c2 = ToolCall("c1", "a"), ToolCall("c2", "b")
    assert unpaired_calls([UserMessage("go"), AssistantMessage(None, (c1, c2))]) == [c1, c2]


def test_unpaired_calls_lists_only_the_calls_still_missing_a_result():
    """Calls that already have a ToolReturn are paired; the rest are listed."""
    c1, c2, c3 = ToolCall("c1", "a"), ToolCall("c2", "b"), ToolCall("c3", "c")
    messages: list[Message] = [
        UserMessage("go"),
        AssistantMessage(None, (c1, c2, c3)),
        ToolReturn("c2", "b", "ok"),
    ]
    assert unpaired_calls(messages) == [c1, c3]


def test_unpaired_calls_empty_when_every_call_has_a_result():
    """A fully answered turn is paired, in whatever order the results were stored."""
    c1, c2 = ToolCall("c1", "a"), ToolCall("c2", "b")
    messages: list[Message] = [
        UserMessage("go"),
        AssistantMessage(None, (c1, c2)),
        ToolReturn("c2", "b", "2"),
        ToolReturn("c1", "a", "1"),
    ]
    assert unpaired_calls(messages) == []


def test_unpaired_calls_ignores_results_for_other_ids():
    """A ToolReturn pairs only the call with its exact id."""
    c1 = ToolCall("c1", "a")
    messages: list[Message] = [AssistantMessage(None, (c1,)), ToolReturn("cX", "a", "?")]
    assert unpaired_calls(messages) == [c1]


def test_unpaired_calls_looks_at_the_calls_of_the_latest_assistant_turn():
    """Earlier paired turns do not matter; the latest assistant turn's calls are checked."""
    old, new = ToolCall("c1", "a"), ToolCall("c2", "a")
    messages: list[Message] = [
        UserMessage("go"),
        AssistantMessage(None, (old,)),
        ToolReturn("c1", "a", "1"),
        AssistantMessage(None, (new,)),
    ]
    assert unpaired_calls(messages) == [new]


def test_unpaired_calls_are_not_hidden_by_a_later_user_message():
    """Calls left without a result stay unpaired even if a user message follows them."""
    c1 = ToolCall("c1", "a")
    messages: list[Message] = [
        UserMessage("go"),
        AssistantMessage(None, (c1,)),
        UserMessage("never mind"),
    ]
    assert unpaired_calls(messages) == [c1]
