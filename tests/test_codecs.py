"""The wire styles (toolnexus_async/_codecs/), driven with plain dicts: no socket, no loop."""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest

from toolnexus_async import (
    AssistantMessage,
    Message,
    ModelError,
    PayloadError,
    ProtocolError,
    Reasoning,
    SystemMessage,
    ToolCall,
    Toolkit,
    ToolReturn,
    Usage,
    UsageError,
    UserMessage,
    define_tool,
    messages_from_json,
    messages_to_json,
)
from toolnexus_async._core.codecs import STYLES, codec_for
from toolnexus_async._core.codecs.anthropic import AnthropicCodec
from toolnexus_async._core.codecs.gemini import GeminiCodec
from toolnexus_async._core.codecs.openai import OpenAICodec

OPENAI = OpenAICodec()
ANTHROPIC = AnthropicCodec()


@define_tool
async def get_weather(city: str, days: int = 1) -> str:
    """The weather forecast for a city."""
    return f"sunny in {city}"


def weather_toolkit() -> Toolkit:
    return Toolkit.create(builtins=False, extra_tools=[get_weather])


EMPTY = Toolkit.create(builtins=False)

# A conversation with every message kind: two calls in one turn, one result an error.
CONVERSATION: list[Message] = [
    SystemMessage("Be brief."),
    UserMessage("Weather in Oslo and Rome?"),
    AssistantMessage(
        "Checking.",
        (
            ToolCall("call_1", "get_weather", {"city": "Oslo"}),
            ToolCall("call_2", "get_weather", {"city": "Rome", "days": 2}),
        ),
    ),
    ToolReturn("call_1", "get_weather", 'sunny\n12 °C {"raw": true}'),
    ToolReturn("call_2", "get_weather", "tool 'get_weather' raised KeyError: 'Rome'", True),
    AssistantMessage("Oslo is sunny; Rome failed."),
    UserMessage("Thanks."),
]


def openai_body(message: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"choices": [{"message": message, **extra.pop("choice", {})}], **extra}


def raw_call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# --- styles ---------------------------------------------------------------------------------


def test_codec_for_knows_every_style():
    """codec_for returns the codec of each style; STYLES lists openai, anthropic, gemini."""
    assert set(STYLES) == {"openai", "anthropic", "gemini"}
    assert isinstance(codec_for("openai"), OpenAICodec)
    assert isinstance(codec_for("anthropic"), AnthropicCodec)
    assert isinstance(codec_for("gemini"), GeminiCodec)


def test_codec_for_refuses_an_unknown_style_naming_the_choices():
    """An unknown style is a UsageError that lists the known ones."""
    with pytest.raises(UsageError, match=r"'vertex'.*openai, anthropic, gemini"):
        codec_for("vertex")


# --- endpoints ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("base", "url"),
    [
        ("https://api.openai.com/v1", "https://api.openai.com/v1/chat/completions"),
        ("https://api.openai.com/v1/", "https://api.openai.com/v1/chat/completions"),
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080/chat/completions"),
        ("http://127.0.0.1:8080/", "http://127.0.0.1:8080/chat/completions"),
    ],
)
def test_openai_endpoint(base: str, url: str):
    """openai posts to {base_url}/chat/completions; the base carries any /v1."""
    assert OPENAI.endpoint(base) == url


@pytest.mark.parametrize(
    ("base", "url"),
    [
        ("https://api.anthropic.com", "https://api.anthropic.com/v1/messages"),
        ("https://api.anthropic.com/", "https://api.anthropic.com/v1/messages"),
        ("http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1/messages"),
        ("http://127.0.0.1:9/v1/", "http://127.0.0.1:9/v1/messages"),
        ("http://proxy.test/anthropic", "http://proxy.test/anthropic/v1/messages"),
    ],
)
def test_anthropic_endpoint(base: str, url: str):
    """anthropic posts to {base}/v1/messages, or {base}/messages when base ends in /v1."""
    assert ANTHROPIC.endpoint(base) == url


# --- headers --------------------------------------------------------------------------------


def test_openai_headers_carry_a_bearer_token():
    """openai authenticates with Authorization: Bearer <key>."""
    assert OPENAI.headers("sk-test") == {"Authorization": "Bearer sk-test"}


@pytest.mark.parametrize("key", [None, ""])
def test_openai_headers_without_a_key_have_no_auth(key: str | None):
    """No key, no Authorization header (local servers need none)."""
    assert OPENAI.headers(key) == {}


def test_anthropic_headers_carry_the_key_and_the_version():
    """anthropic sends x-api-key and anthropic-version: 2023-06-01."""
    assert ANTHROPIC.headers("ak-test") == {
        "x-api-key": "ak-test",
        "anthropic-version": "2023-06-01",
    }


@pytest.mark.parametrize("key", [None, ""])
def test_anthropic_headers_without_a_key_keep_only_the_version(key: str | None):
    """No key: the version header stays, no auth header is sent."""
    assert ANTHROPIC.headers(key) == {"anthropic-version": "2023-06-01"}


# --- encode: openai -------------------------------------------------------------------------


def test_openai_encode_renders_every_message_kind():
    """System, user, assistant (with tool calls) and tool messages in Chat Completions form."""
    body = OPENAI.encode(CONVERSATION, weather_toolkit().tools(), model="gpt-x", max_tokens=None)
    messages = body["messages"]
    assert messages[0] == {"role": "system", "content": "Be brief."}
    assert messages[1] == {"role": "user", "content": "Weather in Oslo and Rome?"}
    assistant = messages[2]
    assert assistant["role"] == "assistant"
    assert assistant["content"] == "Checking."
    assert [
        (c["id"], c["type"], c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in assistant["tool_calls"]
    ] == [
        ("call_1", "function", "get_weather", {"city": "Oslo"}),
        ("call_2", "function", "get_weather", {"city": "Rome", "days": 2}),
    ]
    assert messages[5] == {"role": "assistant", "content": "Oslo is sunny; Rome failed."}
    assert messages[6] == {"role": "user", "content": "Thanks."}
    assert len(messages) == 7


def test_openai_tool_message_carries_the_output_unchanged():
    """A tool result is {"role": "tool", "tool_call_id", "content"} with output verbatim."""
    body = OPENAI.encode(CONVERSATION, weather_toolkit().tools(), model="gpt-x", max_tokens=None)
    assert body["messages"][3] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": 'sunny\n12 °C {"raw": true}',
    }
    # Errors travel as their text too; the message has exactly these three keys.
    assert body["messages"][4] == {
        "role": "tool",
        "tool_call_id": "call_2",
        "content": "tool 'get_weather' raised KeyError: 'Rome'",
    }


def test_openai_encode_sends_the_model_verbatim_and_the_tools():
    """The configured model goes out as given; tools are the toolkit's function tools."""
    toolkit = weather_toolkit()
    body = OPENAI.encode(
        [UserMessage("hi")], toolkit.tools(), model="org/Model:Q4 v2", max_tokens=None
    )
    assert body["model"] == "org/Model:Q4 v2"
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather forecast for a city.",
                "parameters": get_weather.input_schema,
            },
        }
    ]
    assert "max_tokens" not in body


def test_openai_encode_without_tools_omits_the_key():
    """An empty toolkit sends no tools key (an empty list is rejected by the API)."""
    body = OPENAI.encode([UserMessage("hi")], EMPTY.tools(), model="m", max_tokens=None)
    assert body == {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_openai_encode_max_tokens_and_extra():
    """max_tokens is sent when given, as max_completion_tokens, and extra keys are merged
    into the body."""
    body = OPENAI.encode(
        [UserMessage("hi")], EMPTY.tools(), model="m", max_tokens=50, extra={"temperature": 0.1}
    )
    assert body["max_completion_tokens"] == 50 and "max_tokens" not in body
    assert body["temperature"] == 0.1


def test_openai_encode_can_send_the_old_max_tokens_name():
    """max_tokens_field="max_tokens" sends the deprecated name, alone."""
    body = OPENAI.encode(
        [UserMessage("hi")], EMPTY.tools(), model="m", max_tokens=50, max_tokens_field="max_tokens"
    )
    assert body["max_tokens"] == 50 and "max_completion_tokens" not in body


def test_openai_encode_sends_invalid_arguments_back_as_they_came():
    """A call whose arguments were not JSON is rendered with the raw text the model sent."""
    call = ToolCall("c1", "get_weather", {}, invalid_arguments='{"city": Oslo')
    body = OPENAI.encode(
        [UserMessage("q"), AssistantMessage(None, (call,))],
        EMPTY.tools(),
        model="m",
        max_tokens=None,
    )
    assert body["messages"][1]["tool_calls"][0]["function"]["arguments"] == '{"city": Oslo'
    assert body["messages"][1]["content"] is None


def test_openai_decoded_arguments_go_back_as_the_model_wrote_them():
    """The next request carries the provider's own argument text, byte for byte."""
    text = '{ "city":"Zürich",  "days": 2 }'
    reply = OPENAI.decode(openai_body({"tool_calls": [raw_call("c1", "get_weather", text)]}))
    call = reply.message.tool_calls[0]
    assert call == ToolCall("c1", "get_weather", {"city": "Zürich", "days": 2})
    body = OPENAI.encode(
        [UserMessage("q"), reply.message], EMPTY.tools(), model="m", max_tokens=None
    )
    assert body["messages"][1]["tool_calls"][0]["function"]["arguments"] == text


def test_openai_changed_arguments_are_encoded_afresh():
    """A call rebuilt with other arguments (a hook's edit) never sends the old text."""
    text = '{"city": "Oslo"}'
    reply = OPENAI.decode(openai_body({"tool_calls": [raw_call("c1", "get_weather", text)]}))
    edited = attrs.evolve(reply.message.tool_calls[0], arguments={"city": "Rome"})
    message = AssistantMessage(None, (edited,))
    body = OPENAI.encode([UserMessage("q"), message], EMPTY.tools(), model="m", max_tokens=None)
    assert json.loads(body["messages"][1]["tool_calls"][0]["function"]["arguments"]) == {
        "city": "Rome"
    }


# --- encode: anthropic ----------------------------------------------------------------------


def test_anthropic_encode_puts_the_system_prompt_top_level():
    """System messages leave the message list and become the top-level system."""
    body = ANTHROPIC.encode(
        CONVERSATION, weather_toolkit().tools(), model="claude-x", max_tokens=None
    )
    assert body["system"] == "Be brief."
    assert all(m["role"] in ("user", "assistant") for m in body["messages"])


def test_anthropic_encode_without_system_has_no_system_key():
    """No system message, no system key."""
    body = ANTHROPIC.encode([UserMessage("hi")], EMPTY.tools(), model="m", max_tokens=None)
    assert "system" not in body


def test_anthropic_encode_default_and_explicit_max_tokens():
    """max_tokens is always sent: 4096 by default, else the configured value."""
    default = ANTHROPIC.encode([UserMessage("hi")], EMPTY.tools(), model="m", max_tokens=None)
    assert default["max_tokens"] == 4096
    explicit = ANTHROPIC.encode([UserMessage("hi")], EMPTY.tools(), model="m", max_tokens=123)
    assert explicit["max_tokens"] == 123


def test_anthropic_encode_renders_the_whole_conversation():
    """Assistant text and tool_use blocks; the turn's results as tool_result blocks in ONE
    user message; is_error only on the error result."""
    body = ANTHROPIC.encode(
        CONVERSATION, weather_toolkit().tools(), model="claude-x", max_tokens=None
    )
    assert body["model"] == "claude-x"
    assert body["messages"] == [
        {"role": "user", "content": "Weather in Oslo and Rome?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking."},
                {
                    "type": "tool_use",
                    "id": "call_1",
                    "name": "get_weather",
                    "input": {"city": "Oslo"},
                },
                {
                    "type": "tool_use",
                    "id": "call_2",
                    "name": "get_weather",
                    "input": {"city": "Rome", "days": 2},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "call_1",
                    "content": 'sunny\n12 °C {"raw": true}',
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "call_2",
                    "content": "tool 'get_weather' raised KeyError: 'Rome'",
                    "is_error": True,
                },
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "Oslo is sunny; Rome failed."}]},
        {"role": "user", "content": "Thanks."},
    ]


def test_anthropic_encode_tools():
    """Tools are rendered as {name, description, input_schema}."""
    body = ANTHROPIC.encode(
        [UserMessage("hi")], weather_toolkit().tools(), model="m", max_tokens=None
    )
    assert body["tools"] == [
        {
            "name": "get_weather",
            "description": "The weather forecast for a city.",
            "input_schema": get_weather.input_schema,
        }
    ]
    assert "tools" not in ANTHROPIC.encode(
        [UserMessage("hi")], EMPTY.tools(), model="m", max_tokens=None
    )


def test_anthropic_encode_extra_is_merged():
    """extra keys are merged into the body."""
    body = ANTHROPIC.encode(
        [UserMessage("hi")], EMPTY.tools(), model="m", max_tokens=None, extra={"temperature": 0}
    )
    assert body["temperature"] == 0


# --- decode: openai -------------------------------------------------------------------------


def test_openai_decode_text_reply():
    """A text reply becomes an assistant message with that text and no calls."""
    reply = OPENAI.decode(
        openai_body(
            {"role": "assistant", "content": "Hello"},
            model="gpt-x-2024",
            choice={"finish_reason": "stop"},
        )
    )
    assert reply.message == AssistantMessage("Hello")
    assert reply.model == "gpt-x-2024"
    assert reply.stop_reason == "stop"


def test_openai_decode_content_parts_are_joined():
    """Content sent as text parts is joined into one text."""
    reply = OPENAI.decode(
        openai_body({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]})
    )
    assert reply.message.text == "ab"


def test_openai_decode_tool_calls():
    """Tool calls keep id, name and decoded arguments, in order."""
    reply = OPENAI.decode(
        openai_body(
            {
                "content": None,
                "tool_calls": [
                    raw_call("c1", "get_weather", '{"city": "Oslo"}'),
                    raw_call("c2", "add", '{"a": 1, "b": 2}'),
                ],
            }
        )
    )
    assert reply.message == AssistantMessage(
        None,
        (ToolCall("c1", "get_weather", {"city": "Oslo"}), ToolCall("c2", "add", {"a": 1, "b": 2})),
    )


@pytest.mark.parametrize("raw", ['{"city": "Oslo"', "not json", "[1, 2]", '"text"', "null"])
def test_openai_decode_keeps_arguments_that_are_not_a_json_object(raw: str):
    """Arguments that are not a JSON object decode to {} with the raw text kept."""
    reply = OPENAI.decode(openai_body({"tool_calls": [raw_call("c1", "t", raw)]}))
    assert reply.message.tool_calls == (ToolCall("c1", "t", {}, invalid_arguments=raw),)


@pytest.mark.parametrize("raw", ["", "  "])
def test_openai_decode_empty_arguments_are_an_empty_object(raw: str):
    """An empty arguments string means a call without arguments: {} and nothing invalid."""
    reply = OPENAI.decode(openai_body({"tool_calls": [raw_call("c1", "t", raw)]}))
    assert reply.message.tool_calls == (ToolCall("c1", "t", {}, None),)


def test_openai_decode_missing_arguments_are_an_empty_object():
    """A function without an arguments key is a call without arguments."""
    body = openai_body({"tool_calls": [{"id": "c1", "function": {"name": "t"}}]})
    assert OPENAI.decode(body).message.tool_calls == (ToolCall("c1", "t", {}, None),)


def test_openai_decode_usage():
    """prompt/completion/total tokens are read as the provider sent them."""
    body = openai_body(
        {"content": "x"}, usage={"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15}
    )
    assert OPENAI.decode(body).usage == Usage(11, 4, 15)


def test_openai_decode_usage_without_total_adds_the_parts():
    """A missing total is the sum of prompt and completion."""
    body = openai_body({"content": "x"}, usage={"prompt_tokens": 2, "completion_tokens": 3})
    assert OPENAI.decode(body).usage == Usage(2, 3, 5)


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        ({"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 0}, Usage(2, 3, 5)),
        ({"prompt_tokens": True, "completion_tokens": 3, "total_tokens": 9}, Usage(0, 3, 9)),
        ({"prompt_tokens": None, "completion_tokens": 3.5, "total_tokens": "9"}, Usage(0, 0, 0)),
        (
            {
                "prompt_tokens": 10,
                "completion_tokens": 6,
                "total_tokens": 16,
                "prompt_tokens_details": {"cached_tokens": 4},
                "completion_tokens_details": {"reasoning_tokens": 2},
            },
            Usage(10, 6, 16, cache_read_tokens=4, reasoning_tokens=2),
        ),
        (
            {"prompt_tokens": 1, "completion_tokens": 1, "prompt_tokens_details": None},
            Usage(1, 1, 2),
        ),
    ],
)
def test_openai_decode_usage_odd_shapes(usage: dict[str, Any], expected: Usage):
    """Whatever shape the counters come in, the usual one (read in one check) or any
    other: a counter that is not an int (a bool, null, a float, a string) is 0, a total of
    0 is the sum of the parts, and the details are read when present."""
    assert OPENAI.decode(openai_body({"content": "x"}, usage=usage)).usage == expected


def test_openai_decode_arguments_nested_too_deeply_are_kept_as_invalid():
    """An object's text nested past what the JSON parser can read is kept raw, not raised."""
    raw = '{"a": ' * 100_000 + "1" + "}" * 100_000
    reply = OPENAI.decode(openai_body({"tool_calls": [raw_call("c1", "t", raw)]}))
    assert reply.message.tool_calls == (ToolCall("c1", "t", {}, invalid_arguments=raw),)


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ({"reasoning": "r1", "reasoning_content": "r2"}, "r1"),
        ({"reasoning": "", "reasoning_content": "r2"}, "r2"),
        ({"reasoning": {"x": 1}, "reasoning_content": "r2"}, "r2"),
        ({"reasoning_content": ""}, None),
        ({"reasoning": 5}, None),
    ],
)
def test_openai_decode_reasoning_from_either_key(message: dict[str, Any], expected: str | None):
    """``reasoning`` first, else ``reasoning_content``; an empty or non-text one is none."""
    reply = OPENAI.decode(openai_body({"content": "x", **message}))
    texts = [r.text for r in reply.message.reasoning]
    assert texts == ([] if expected is None else [expected])


def test_openai_decode_missing_usage_is_zero():
    """No usage in the reply counts as zeros, not an error."""
    reply = OPENAI.decode(openai_body({"content": "x"}))
    assert reply.usage == Usage(0, 0, 0)
    assert reply.model is None


# --- decode: anthropic ----------------------------------------------------------------------


def test_anthropic_decode_text_and_tool_use():
    """Text blocks are joined; tool_use blocks become calls with their input, in order."""
    reply = ANTHROPIC.decode(
        {
            "model": "claude-x-1",
            "stop_reason": "tool_use",
            "content": [
                {"type": "text", "text": "Let me "},
                {"type": "text", "text": "check."},
                {"type": "tool_use", "id": "tu1", "name": "get_weather", "input": {"city": "Oslo"}},
                {"type": "tool_use", "id": "tu2", "name": "noargs", "input": {}},
            ],
        }
    )
    assert reply.message == AssistantMessage(
        "Let me check.",
        (ToolCall("tu1", "get_weather", {"city": "Oslo"}), ToolCall("tu2", "noargs", {})),
    )
    assert reply.model == "claude-x-1"
    assert reply.stop_reason == "tool_use"


def test_anthropic_decode_without_text_has_no_text():
    """Only tool_use blocks: the message text is None."""
    reply = ANTHROPIC.decode(
        {"content": [{"type": "tool_use", "id": "a", "name": "t", "input": {}}]}
    )
    assert reply.message.text is None


def test_anthropic_decode_skips_unknown_block_types():
    """Blocks the loop does not act on (server tools, ...) are ignored; thinking is kept."""
    reply = ANTHROPIC.decode(
        {
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                {"type": "server_tool_use", "id": "s1", "name": "web_search", "input": {}},
                {"type": "text", "text": "hi"},
            ]
        }
    )
    assert reply.message == AssistantMessage("hi", reasoning=(Reasoning("hmm", "sig"),))


def test_anthropic_decode_input_that_is_not_an_object_is_kept_as_invalid():
    """A tool_use input that is not an object gives {} and keeps it in invalid_arguments."""
    reply = ANTHROPIC.decode(
        {"content": [{"type": "tool_use", "id": "a", "name": "t", "input": [1]}]}
    )
    (call,) = reply.message.tool_calls
    assert call.arguments == {}
    assert call.invalid_arguments is not None


def test_anthropic_decode_usage_is_mapped():
    """input_tokens/output_tokens map to prompt/completion; total is their sum."""
    reply = ANTHROPIC.decode({"content": [], "usage": {"input_tokens": 20, "output_tokens": 7}})
    assert reply.usage == Usage(prompt_tokens=20, completion_tokens=7, total_tokens=27)


def test_anthropic_decode_missing_usage_is_zero():
    """No usage in the reply counts as zeros."""
    assert ANTHROPIC.decode({"content": []}).usage == Usage(0, 0, 0)


# --- ProtocolError --------------------------------------------------------------------------


def assert_protocol_error(codec: Any, payload: object, *fragments: str) -> ProtocolError:
    """decode(payload) raises ProtocolError whose message contains every fragment."""
    with pytest.raises(ProtocolError) as info:
        codec.decode(payload)
    error = info.value
    assert not isinstance(error, KeyError | IndexError | TypeError)
    assert isinstance(error, ModelError)
    for fragment in fragments:
        assert fragment in str(error), (fragment, str(error))
    return error


@pytest.mark.parametrize(
    ("payload", "fragments"),
    [
        ({}, ["choices[0]"]),
        ({"choices": []}, ["choices[0]"]),
        ({"choices": None}, ["choices[0]"]),
        ({"choices": "x"}, ["choices[0]"]),
        ({"choices": [1]}, ["choices[0] must be an object"]),
        ({"choices": [{}]}, ["choices[0].message must be an object"]),
        ({"choices": [{"message": "hi"}]}, ["choices[0].message must be an object", "str"]),
        ({"choices": [{"message": None}]}, ["choices[0].message must be an object", "null"]),
        (openai_body({"content": 5}), ["choices[0].message.content"]),
        (openai_body({"tool_calls": {"id": "c1"}}), ["tool_calls must be a list"]),
        (openai_body({"tool_calls": ["c1"]}), ["tool_calls[0] must be an object"]),
        (
            openai_body({"tool_calls": [{"id": 7, "function": {"name": "t"}}]}),
            ["tool_calls[0].id"],
        ),
        (openai_body({"tool_calls": [{"id": "c1"}]}), ["tool_calls[0].function must be an object"]),
        (
            openai_body({"tool_calls": [{"id": "c1", "function": {"arguments": "{}"}}]}),
            ["tool_calls[0].function", "'name'"],
        ),
        (
            openai_body({"tool_calls": [{"id": "c1", "function": {"name": None}}]}),
            ["tool_calls[0].function.name"],
        ),
        (
            openai_body({"tool_calls": [raw_call("c1", "t", "{}"), raw_call("c1", "u", "{}")]}),
            ["tool_calls[1].id", "'c1'", "repeated"],
        ),
        ([], ["the body must be an object"]),
        (None, ["the body must be an object"]),
        ("choices", ["the body must be an object"]),
    ],
)
def test_openai_malformed_replies_raise_protocol_error(payload: object, fragments: list[str]):
    """A 2xx reply missing what the style requires is a ProtocolError naming what is missing."""
    error = assert_protocol_error(OPENAI, payload, *fragments)
    assert str(error).startswith("openai reply")


def test_openai_error_body_is_a_protocol_error_quoting_it():
    """A 2xx body carrying {"error": {...}} is a ProtocolError that shows the error message."""
    body = {"error": {"message": "The server is overloaded", "type": "server_error"}}
    assert_protocol_error(OPENAI, body, "choices[0]", "The server is overloaded")


@pytest.mark.parametrize(
    ("payload", "fragments"),
    [
        ({}, ["'content'"]),
        ({"content": None}, ["'content'"]),
        ({"content": "hello"}, ["'content'"]),
        ({"content": ["hi"]}, ["content[0] must be an object"]),
        ({"content": [{"type": "text"}]}, ["content[0]", "'text'"]),
        ({"content": [{"type": "text", "text": None}]}, ["content[0].text"]),
        ({"content": [{"type": "tool_use", "name": "t", "input": {}}]}, ["content[0]", "'id'"]),
        ({"content": [{"type": "tool_use", "id": "a", "input": {}}]}, ["content[0]", "'name'"]),
        (
            {
                "content": [
                    {"type": "tool_use", "id": "a", "name": "t", "input": {}},
                    {"type": "tool_use", "id": "a", "name": "u", "input": {}},
                ]
            },
            ["content[1].id", "'a'", "repeated"],
        ),
        ([], ["the body must be an object"]),
        (None, ["the body must be an object"]),
    ],
)
def test_anthropic_malformed_replies_raise_protocol_error(payload: object, fragments: list[str]):
    """A 2xx reply missing what the style requires is a ProtocolError naming what is missing."""
    error = assert_protocol_error(ANTHROPIC, payload, *fragments)
    assert str(error).startswith("anthropic reply")


def test_anthropic_error_body_is_a_protocol_error_quoting_it():
    """A 2xx body carrying {"type": "error", "error": {...}} shows the provider's message."""
    body = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    assert_protocol_error(ANTHROPIC, body, "'content'", "Overloaded")


# --- cross-style ----------------------------------------------------------------------------


def test_a_transcript_decoded_from_openai_renders_for_anthropic():
    """Replies decoded in openai style continue against anthropic, paired and complete."""
    first = OPENAI.decode(
        openai_body(
            {
                "content": "Looking.",
                "tool_calls": [
                    raw_call("call_a", "get_weather", '{"city": "Oslo"}'),
                    raw_call("call_b", "get_weather", ""),
                ],
            }
        )
    )
    second = OPENAI.decode(openai_body({"content": "Sunny."}))
    transcript: list[Message] = [
        SystemMessage("Be brief."),
        UserMessage("Weather?"),
        first.message,
        ToolReturn("call_a", "get_weather", "sunny"),
        ToolReturn("call_b", "get_weather", "get_weather: missing city", True),
        second.message,
        UserMessage("And tomorrow?"),
    ]
    body = ANTHROPIC.encode(
        transcript, weather_toolkit().tools(), model="claude-x", max_tokens=None
    )
    assert body["system"] == "Be brief."
    assert body["messages"] == [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Looking."},
                {
                    "type": "tool_use",
                    "id": "call_a",
                    "name": "get_weather",
                    "input": {"city": "Oslo"},
                },
                {"type": "tool_use", "id": "call_b", "name": "get_weather", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_a", "content": "sunny"},
                {
                    "type": "tool_result",
                    "tool_use_id": "call_b",
                    "content": "get_weather: missing city",
                    "is_error": True,
                },
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "Sunny."}]},
        {"role": "user", "content": "And tomorrow?"},
    ]


def test_a_transcript_decoded_from_anthropic_renders_for_openai():
    """Replies decoded in anthropic style continue against openai, paired and complete."""
    first = ANTHROPIC.decode(
        {
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Rome"},
                }
            ]
        }
    )
    second = ANTHROPIC.decode({"content": [{"type": "text", "text": "Warm."}]})
    transcript: list[Message] = [
        SystemMessage("Be brief."),
        UserMessage("Weather?"),
        first.message,
        ToolReturn("toolu_1", "get_weather", "warm\n25 C"),
        second.message,
    ]
    body = OPENAI.encode(transcript, weather_toolkit().tools(), model="gpt-x", max_tokens=None)
    messages = body["messages"]
    assert messages[0] == {"role": "system", "content": "Be brief."}
    assert messages[1] == {"role": "user", "content": "Weather?"}
    assert messages[2]["role"] == "assistant"
    assert messages[2]["content"] is None
    (call,) = messages[2]["tool_calls"]
    assert call["id"] == "toolu_1"
    assert call["type"] == "function"
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Rome"}
    assert messages[3] == {"role": "tool", "tool_call_id": "toolu_1", "content": "warm\n25 C"}
    assert messages[4] == {"role": "assistant", "content": "Warm."}
    assert len(messages) == 5


def test_a_refusal_goes_back_as_refusal_in_openai_and_as_text_in_anthropic():
    """The Messages API has no refusal field: the refusal is sent as the assistant's text."""
    history: list[Message] = [
        UserMessage("q"),
        AssistantMessage(None, (), "I can't."),
        UserMessage("why?"),
    ]
    openai = OPENAI.encode(history, EMPTY.tools(), model="m", max_tokens=None)
    assert openai["messages"][1] == {"role": "assistant", "content": None, "refusal": "I can't."}
    anthropic = ANTHROPIC.encode(history, EMPTY.tools(), model="m", max_tokens=None)
    assert anthropic["messages"][1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "I can't."}],
    }


def test_anthropic_server_tool_blocks_go_back_verbatim_with_the_client_call():
    """A reply with server tool blocks before a client tool call is sent back as it came,
    in its order (the neutral fields cannot say them); a changed message is rendered from
    its fields again."""
    content = [
        {"type": "server_tool_use", "id": "srv_1", "name": "web_search", "input": {"q": "x"}},
        {"type": "web_search_tool_result", "tool_use_id": "srv_1", "content": []},
        {"type": "text", "text": "Found nothing; asking the tool."},
        {"type": "tool_use", "id": "tu_1", "name": "get_weather", "input": {"city": "Oslo"}},
    ]
    reply = ANTHROPIC.decode({"content": content, "stop_reason": "tool_use"})
    history: list[Message] = [
        UserMessage("q"),
        reply.message,
        ToolReturn("tu_1", "get_weather", "sunny"),
    ]
    body = ANTHROPIC.encode(history, EMPTY.tools(), model="m", max_tokens=None)
    assert body["messages"][1] == {"role": "assistant", "content": content}
    changed = attrs.evolve(reply.message, text="Other words.")
    again = ANTHROPIC.encode([UserMessage("q"), changed], EMPTY.tools(), model="m", max_tokens=None)
    assert [b["type"] for b in again["messages"][1]["content"]] == ["text", "tool_use"]
    # Stored and read back (a run halted on the client call, resumed in another process):
    # the blocks survive the transcript's JSON form.
    stored = json.loads(json.dumps(messages_to_json(history)))
    resumed = ANTHROPIC.encode(
        messages_from_json(stored), EMPTY.tools(), model="m", max_tokens=None
    )
    assert resumed["messages"][1] == {"role": "assistant", "content": content}
    with pytest.raises(PayloadError, match="provider_content"):
        messages_from_json(
            {"version": 2, "messages": [{"role": "assistant", "provider_content": {"style": 1}}]}
        )
