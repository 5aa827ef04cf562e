"""Typed output against real providers' structured-output traffic: recorded replies (the
OpenAI SDK's ``parse`` recordings, pydantic-ai's native, prompted and output-tool runs for
OpenAI, Anthropic and Groq; ``tests/recordings/``, see SOURCES.md) replayed through a real
:class:`LlmClient` over the fake provider. Each test checks what was asked (the request
body, against the provider's published request schema where one is kept) and what came
back (the validated, typed ``output``)."""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import Any, Literal

import attrs
import jsonschema
import pydantic
import pytest

from toolnexus_async import (
    LlmClient,
    OutputValidationError,
    StreamDone,
    StreamOutput,
    Toolkit,
    define_tool,
)

from .conftest import FakeLLM, FakeProvider, anthropic_reply, openai_reply
from .replay import load, replay, schema

PARSE = "openai-python/chat_completions/"
PARSE_STREAM = "openai-python/chat_completions_stream/"
NATIVE = "pydantic-ai/test_openai/test_openai_native_output.yaml"
NATIVE_UNION = "pydantic-ai/test_openai/test_openai_native_output_multiple.yaml"
PROMPTED = "pydantic-ai/test_openai/test_openai_prompted_output.yaml"
ANTHROPIC_TOOL = "pydantic-ai/test_anthropic/test_anthropic_tool_output.yaml"
ANTHROPIC_NATIVE = "pydantic-ai/test_anthropic/test_anthropic_native_output_decimal_strict.yaml"
ANTHROPIC_PROMPTED = "pydantic-ai/test_anthropic/test_anthropic_prompted_output.yaml"
GROQ_NATIVE = "pydantic-ai/test_groq/test_groq_native_output.yaml"
GROQ_PROMPTED = "pydantic-ai/test_groq/test_groq_prompted_output.yaml"


class Location(pydantic.BaseModel):
    city: str
    temperature: float
    units: Literal["c", "f"]


@dataclasses.dataclass
class CityLocation:
    city: str
    country: str


@attrs.frozen
class Weather:
    city: str
    temperature: float
    units: Literal["c", "f"] = "c"


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"
    GREEN = "green"


@dataclasses.dataclass
class ColorDetection:
    color: Color
    hex_color_code: str


@define_tool
async def get_user_country() -> str:
    """The user's country."""
    return "Mexico"


def country() -> Toolkit:
    return Toolkit.create(builtins=False, extra_tools=[get_user_country])


def no_tools() -> Toolkit:
    return Toolkit.create(builtins=False)


def openai_request_valid(body: dict[str, Any]) -> None:
    jsonschema.validate(body, schema("openai-chat-completions-request"))


def anthropic_request_valid(body: dict[str, Any]) -> None:
    jsonschema.validate(body, schema("anthropic-messages-request-non-streaming"))


async def test_openai_parse_a_pydantic_model(provider: FakeProvider):
    replay(provider, PARSE + "test_parse_pydantic_model.json")
    async with provider.client(model="gpt-4o-2024-08-06") as client, no_tools() as toolkit:
        result = await client.run("weather in SF?", toolkit, output_type=Location)
    assert result.output == Location(city="San Francisco", temperature=65, units="f")
    assert result.output_method == "native"
    (body,) = provider.bodies
    openai_request_valid(body)
    fmt = body["response_format"]
    assert fmt["type"] == "json_schema"
    assert fmt["json_schema"]["name"] == "Location"
    assert fmt["json_schema"]["schema"] == Location.model_json_schema()
    # A pydantic model allows fields it does not list: not a schema strict mode takes.
    assert fmt["json_schema"]["strict"] is False


async def test_openai_parse_an_attrs_class_with_a_default_is_not_strict(provider: FakeProvider):
    replay(provider, PARSE + "test_parse_pydantic_model_optional_default.json")
    async with provider.client() as client, no_tools() as toolkit:
        result = await client.run("weather in SF?", toolkit, output_type=Weather)
    assert result.output == Weather("San Francisco", 65, "f")
    wire = provider.bodies[0]["response_format"]["json_schema"]
    assert wire["strict"] is False  # "units" may be left out: strict mode would refuse it
    assert wire["schema"]["required"] == ["city", "temperature"]


async def test_openai_parse_a_dataclass_with_an_enum_is_strict(provider: FakeProvider):
    replay(provider, PARSE + "test_parse_pydantic_model_enum.json")
    async with provider.client() as client, no_tools() as toolkit:
        result = await client.run("what color?", toolkit, output_type=ColorDetection)
    assert result.output == ColorDetection(Color.RED, "#FF0000")
    body = provider.bodies[0]
    openai_request_valid(body)
    wire = body["response_format"]["json_schema"]
    assert wire["strict"] is True
    assert wire["schema"]["properties"]["color"] == {"enum": ["red", "blue", "green"]}
    assert wire["schema"]["additionalProperties"] is False


async def test_openai_parse_a_plain_json_schema(provider: FakeProvider):
    replay(provider, PARSE + "test_parse_pydantic_dataclass.json")
    event = {
        "title": "CalendarEvent",
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "date": {"type": "string"},
            "participants": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["name", "date", "participants"],
        "additionalProperties": False,
    }
    async with provider.client() as client, no_tools() as toolkit:
        result = await client.run("the fair?", toolkit, output_type=event)
    assert result.output == {
        "name": "Science Fair",
        "date": "Friday",
        "participants": ["Alice", "Bob"],
    }
    wire = provider.bodies[0]["response_format"]["json_schema"]
    assert (wire["name"], wire["schema"], wire["strict"]) == ("CalendarEvent", event, True)


async def test_openai_refusal_stays_a_refusal(provider: FakeProvider):
    """A refusal is not an invalid reply: no retry, no error, no output."""
    replay(provider, PARSE + "test_parse_pydantic_model_refusal.json")
    async with provider.client() as client, no_tools() as toolkit:
        result = await client.run("something bad", toolkit, output_type=Location)
    assert result.status == "done"
    assert result.refusal == "I'm very sorry, but I can't assist with that."
    assert result.output is None
    assert len(provider.requests) == 1


async def test_openai_streamed_refusal_stays_a_refusal(provider: FakeProvider):
    replay(provider, PARSE_STREAM + "test_parse_pydantic_model_refusal.sse")
    async with provider.client() as client, no_tools() as toolkit:
        async with client.stream("bad", toolkit, output_type=Location) as events:
            done = [e async for e in events if isinstance(e, StreamDone)]
    (last,) = done
    assert last.result.refusal and last.result.output is None
    assert len(provider.requests) == 1


async def test_openai_reply_cut_by_max_tokens_is_incomplete_not_invalid(provider: FakeProvider):
    replay(provider, PARSE + "test_parse_max_tokens_reached.json")
    async with provider.client() as client, no_tools() as toolkit:
        result = await client.run("weather?", toolkit, output_type=Location)
    assert (result.status, result.limit, result.output) == ("incomplete", "max_tokens", None)
    assert len(provider.requests) == 1


async def test_openai_streamed_output_previews_then_validates(provider: FakeProvider):
    replay(provider, PARSE_STREAM + "test_parse_pydantic_model.sse")
    async with provider.client() as client, no_tools() as toolkit:
        async with client.stream("weather in SF?", toolkit, output_type=Location) as events:
            seen = [e async for e in events]
    previews = [e.partial for e in seen if isinstance(e, StreamOutput)]
    assert len(previews) > 3
    # The city grows as its pieces arrive, then the other fields join it.
    cities = [p["city"] for p in previews if isinstance(p, dict) and "city" in p]
    assert all("San Francisco".startswith(c) for c in cities) and len(set(cities)) > 1
    assert previews[-1] == {"city": "San Francisco", "temperature": 61, "units": "f"}
    done = seen[-1]
    assert isinstance(done, StreamDone)
    assert done.result.output == Location(city="San Francisco", temperature=61, units="f")
    assert provider.bodies[0]["response_format"]["json_schema"]["name"] == "Location"


async def test_pydantic_ai_openai_native_output_after_a_tool(provider: FakeProvider):
    recorded = replay(provider, NATIVE)
    async with provider.client(model="gpt-4o") as client, country() as toolkit:
        result = await client.run(
            "What is the largest city in the user country?", toolkit, output_type=CityLocation
        )
    assert result.output == CityLocation("Mexico City", "Mexico")
    assert [c.name for c in result.tool_calls] == ["get_user_country"]
    assert result.turns == 2
    for body, sent in zip(provider.bodies, recorded, strict=True):
        openai_request_valid(body)
        # Asked as pydantic-ai asked: the same schema, in the same place, every turn.
        wire = body["response_format"]["json_schema"]
        assert (
            wire["schema"]["properties"]
            == sent.request["response_format"]["json_schema"]["schema"]["properties"]
        )
    assert provider.bodies[1]["messages"][-1]["content"] == "Mexico"


async def test_native_output_over_a_real_socket(fake_llm: FakeLLM):
    """The same recording over HTTP on 127.0.0.1, through the default aiohttp transport."""
    recorded = [r.json() for r in load(NATIVE)]
    fake_llm.handler = lambda body, seen: recorded[len(fake_llm.requests) - 1]
    async with LlmClient(fake_llm.url, model="gpt-4o", api_key="sk-test-key") as client:
        async with country() as toolkit:
            result = await client.run("largest city?", toolkit, output_type=CityLocation)
    assert result.output == CityLocation("Mexico City", "Mexico")
    assert [b["response_format"]["json_schema"]["name"] for b in fake_llm.bodies] == [
        "CityLocation",
        "CityLocation",
    ]


async def test_pydantic_ai_openai_native_output_of_a_union(provider: FakeProvider):
    """A schema whose root is a union travels wrapped as {"result": ...}, as providers
    want an object there; the value comes back unwrapped."""
    recorded = replay(provider, NATIVE_UNION)
    union = recorded[0].request["response_format"]["json_schema"]["schema"]["properties"]["result"]
    async with provider.client(model="gpt-4o") as client, country() as toolkit:
        result = await client.run("largest city?", toolkit, output_type=union)
    assert result.output == {
        "kind": "CityLocation",
        "data": {"city": "Mexico City", "country": "Mexico"},
    }
    sent = provider.bodies[0]["response_format"]["json_schema"]["schema"]
    assert sent == {
        "type": "object",
        "properties": {"result": union},
        "required": ["result"],
        "additionalProperties": False,
    }


async def test_pydantic_ai_openai_prompted_output(provider: FakeProvider):
    """The fallback: the schema in the instructions, no response_format."""
    replay(provider, PROMPTED)
    async with (
        provider.client(model="gpt-4o", system_prompt="Be brief.") as client,
        country() as toolkit,
    ):
        result = await client.run(
            "largest city?", toolkit, output_type=CityLocation, output_method="prompt"
        )
    assert result.output == CityLocation("Mexico City", "Mexico")
    assert result.output_method == "prompt"
    for body in provider.bodies:
        openai_request_valid(body)
        assert "response_format" not in body
        first, told = body["messages"][:2]
        assert first == {"role": "system", "content": "Be brief."}
        assert told["role"] == "system" and '"country"' in told["content"]
    # The instructions are not kept in the transcript: only the run's own system prompt.
    assert [type(m).__name__ for m in result.messages][:2] == ["SystemMessage", "UserMessage"]


async def test_pydantic_ai_anthropic_output_tool(provider: FakeProvider):
    replay(provider, ANTHROPIC_TOOL)
    async with (
        provider.client("anthropic", model="claude-sonnet-4-5") as client,
        country() as toolkit,
    ):
        result = await client.run("largest city?", toolkit, output_type=CityLocation)
    assert result.output == CityLocation("Mexico City", "Mexico")
    assert result.output_method == "tool"
    assert [c.name for c in result.tool_calls] == ["get_user_country"]  # never executed
    for body in provider.bodies:
        anthropic_request_valid(body)
        assert body["tool_choice"] == {"type": "any"}
        assert [t["name"] for t in body["tools"]] == ["get_user_country", "final_result"]
    # The output tool's call is answered in the transcript, which stays paired.
    last = result.messages[-1]
    assert (last.name, last.is_error) == ("final_result", False)  # type: ignore[union-attr]


async def test_pydantic_ai_anthropic_native_output(provider: FakeProvider):
    """Anthropic's structured outputs (output_config.format), asked for by name."""
    (recorded,) = replay(provider, ANTHROPIC_NATIVE)
    amount = recorded.request["output_config"]["format"]["schema"]
    async with provider.client("anthropic", model="claude-sonnet-4-5") as client, no_tools() as tk:
        result = await client.run("12.34", tk, output_type=amount, output_method="native")
    assert (result.output, result.output_method) == ({"amount": 12.34}, "native")
    (body,) = provider.bodies
    anthropic_request_valid(body)
    assert body["output_config"] == recorded.request["output_config"]
    assert "tool_choice" not in body and "tools" not in body


async def test_pydantic_ai_anthropic_prompted_output(provider: FakeProvider):
    replay(provider, ANTHROPIC_PROMPTED)
    async with provider.client("anthropic") as client, country() as toolkit:
        result = await client.run(
            "largest city?", toolkit, output_type=CityLocation, output_method="prompt"
        )
    assert result.output == CityLocation("Mexico City", "Mexico")
    for body in provider.bodies:
        anthropic_request_valid(body)
        assert "tool_choice" not in body
        assert '"required":["city","country"]' in body["system"]


@pytest.mark.parametrize("recording", [GROQ_NATIVE, GROQ_PROMPTED])
async def test_pydantic_ai_groq_structured_output(provider: FakeProvider, recording: str):
    replay(provider, recording)
    method = "native" if recording == GROQ_NATIVE else "prompt"
    async with (
        provider.client(model="openai/gpt-oss-120b") as client,
        no_tools() as toolkit,
    ):
        result = await client.run(
            "What is the largest city in Mexico?",
            toolkit,
            output_type=CityLocation,
            output_method=method,
        )
    assert result.output == CityLocation("Mexico City", "Mexico")
    body = provider.bodies[0]
    if method == "native":
        wire = body["response_format"]["json_schema"]
        assert (wire["name"], wire["strict"]) == ("CityLocation", True)
    else:
        assert "response_format" not in body


async def test_an_invalid_reply_is_sent_back_with_its_errors_then_the_recorded_one_passes(
    provider: FakeProvider,
):
    recorded = load(GROQ_NATIVE)
    provider.script(openai_reply('{"city": "Mexico City"}'), recorded[0].response())
    async with provider.client() as client, no_tools() as toolkit:
        result = await client.run("largest city?", toolkit, output_type=CityLocation)
    assert result.output == CityLocation("Mexico City", "Mexico")
    assert result.turns == 2
    told = provider.bodies[1]["messages"][-1]
    assert told["role"] == "user"
    assert "country is required" in told["content"]


async def test_an_invalid_output_tool_call_gets_an_error_result_then_the_recorded_one_passes(
    provider: FakeProvider,
):
    recorded = load(ANTHROPIC_TOOL)
    provider.script(
        anthropic_reply(tool_uses=[("toolu_bad", "final_result", {"city": 3})]),
        recorded[1].response(),
    )
    async with provider.client("anthropic") as client, country() as toolkit:
        result = await client.run("largest city?", toolkit, output_type=CityLocation)
    assert result.output == CityLocation("Mexico City", "Mexico")
    anthropic_request_valid(provider.bodies[1])
    (answer,) = provider.bodies[1]["messages"][-1]["content"]
    assert answer["type"] == "tool_result" and answer["is_error"] is True
    assert "city must be string, got integer" in answer["content"]
    assert "country is required" in answer["content"]


async def test_past_the_retries_a_typed_error_carries_the_raw_reply(provider: FakeProvider):
    provider.script(openai_reply("Mexico City, Mexico"), openai_reply('{"city": "Mexico City"}'))
    async with provider.client() as client, no_tools() as toolkit:
        with pytest.raises(OutputValidationError) as caught:
            await client.run("largest city?", toolkit, output_type=CityLocation)
    error = caught.value
    assert error.raw == '{"city": "Mexico City"}'
    assert error.errors == "country is required"
    assert (error.run.status, error.run.limit, error.run.turns) == (
        "incomplete",
        "output_invalid",
        2,
    )
    json.dumps(error.run.to_dict())  # the run as it ended, storable
