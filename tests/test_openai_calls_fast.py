"""The OpenAI codec decodes a tool call's usual arguments (a JSON object's text) inline;
every other text goes through ``parse_arguments``. Both must give the same call: the same
arguments, the same ``invalid_arguments`` and the same text sent back next turn."""

from __future__ import annotations

import json

import pytest

from toolnexus_async._core.codecs._common import parse_arguments, wire_arguments
from toolnexus_async._core.codecs.openai import OpenAICodec
from toolnexus_async._core.messages import AssistantMessage, ToolCall

TEXTS = [
    '{"city": "Paris"}',
    '{"a": 2, "b": 3}',
    "{}",
    '{"nested": {"x": [1, 2, {"y": null}]}}',
    '{"a": 1} ',  # whitespace after the value
    ' {"a": 1}',  # and before it: not the fast path's shape
    '{"a": 1}{"b": 2}',  # anything after the value
    "{not json",
    "{" * 100_000,  # nested too deeply
    '{"a": 1, "a": 2}',
    "[1, 2]",
    '"text"',
    "",
    "   ",
    "null",
]


def reply(arguments: object) -> dict[str, object]:
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    return {"model": "m", "choices": [{"message": message, "finish_reason": "tool_calls"}]}


@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
def test_arguments_decode_as_parse_arguments_says(text: str) -> None:
    (call,) = OpenAICodec().decode(reply(text)).message.tool_calls
    arguments, invalid = parse_arguments(text)
    general = ToolCall("call_1", "f", arguments, invalid)
    assert (call.arguments, call.invalid_arguments) == (arguments, invalid)
    assert call == general
    # What goes back next turn: the model's own text when it was an object, as before.
    sent = text if invalid is None and text else wire_arguments(general)
    assert wire_arguments(call) == sent
    rendered = OpenAICodec().encode(
        [AssistantMessage(None, (call,))], (), model="m", max_tokens=None
    )
    assert rendered["messages"][0]["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": sent}}
    ]


def test_arguments_already_decoded_are_kept() -> None:
    (call,) = OpenAICodec().decode(reply({"a": 1})).message.tool_calls
    assert (call.arguments, call.invalid_arguments) == ({"a": 1}, None)
    assert wire_arguments(call) == json.dumps({"a": 1})
