"""The gemini style against Gemini's own recorded traffic: every Generative Language API
exchange in the shared recordings (pydantic-ai's native, prompted and output-tool runs, the
structured-output streams of a Gemini 3 model with a function tool and with Google Search,
and a tool call answered across providers; ``tests/recordings/``, see SOURCES.md) replayed
through a real :class:`LlmClient`. Each test checks that what we send asks what the recorded
request asked, in substance (the contents, the schema, the tools; not our wording of the
tool descriptions or of the prompt method's instructions), and what came back."""

from __future__ import annotations

import base64
import dataclasses
from typing import Any

from toolnexus_async import (
    LlmClient,
    ModelSettings,
    StreamDone,
    StreamOutput,
    Toolkit,
    define_tool,
    messages_to_json,
)

from .conftest import FakeLLM, FakeProvider
from .replay import load, replay

GOOGLE = "pydantic-ai/test_google/"
NATIVE = GOOGLE + "test_google_native_output.yaml"
PROMPTED = GOOGLE + "test_google_prompted_output.yaml"
TOOL = GOOGLE + "test_google_tool_output.yaml"
STREAM = "pydantic-ai/test_structured_output/"
STREAM_TOOLS = STREAM + "test_native_output_with_function_tools_stream.yaml"
STREAM_SEARCH = STREAM + "test_native_output_with_builtin_tools_stream.yaml"
ACROSS = "pydantic-ai/test_openai/test_multiple_agent_tool_calls.yaml"
ASKED = "What is the largest city in the user country?"


@dataclasses.dataclass
class CityLocation:
    """A city and its country."""

    city: str
    country: str


MEXICO = CityLocation("Mexico City", "Mexico")


@define_tool
async def get_user_country() -> str:
    """The user's country."""
    return "Mexico"


@define_tool
async def get_capital(country: str) -> str:
    """Get the capital of a country.

    Args:
        country: The country name.
    """
    return {"France": "Paris", "England": "London"}[country]


def kit(*tools: Any) -> Toolkit:
    return Toolkit.create(builtins=False, extra_tools=list(tools))


# The recorders' SDKs write some field names in snake_case, which the API also reads.
_CAMEL = {
    "function_declarations": "functionDeclarations",
    "parameters_json_schema": "parametersJsonSchema",
}


def camel(node: Any) -> Any:
    if isinstance(node, dict):
        return {_CAMEL.get(k, k): camel(v) for k, v in node.items()}
    if isinstance(node, list):
        return [camel(v) for v in node]
    return node


def shape(schema: dict[str, Any]) -> tuple[Any, ...]:
    """What a schema asks: its properties' types (OpenAPI's OBJECT is JSON Schema's
    object) and what is required."""
    properties = {k: v["type"].lower() for k, v in schema.get("properties", {}).items()}
    return schema["type"].lower(), properties, sorted(schema.get("required", []))


def declarations(body: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
    """Each declared function's name and parameter schema, in substance."""
    out = {}
    tools = camel(body).get("tools", [])
    # An early recording sent one tool object where the API takes a list (it reads both).
    for tool in [tools] if isinstance(tools, dict) else tools:
        for fn in tool.get("functionDeclarations", []):
            out[fn["name"]] = shape(fn.get("parametersJsonSchema") or fn["parameters"])
    return out


def signature(text: str) -> bytes:
    """A thoughtSignature's bytes: sent as base64 by the API, given back URL-safe by the
    recording SDK; the API reads both."""
    return base64.urlsafe_b64decode(text.replace("+", "-").replace("/", "_"))


def turns(body: dict[str, Any]) -> list[tuple[str, list[tuple[Any, ...]]]]:
    """The contents as the API reads them. A call's id is kept when the API gave it; the
    recorder's own ids (``pyd_ai_...``, for calls the API sent without one) are dropped,
    as we send no id for those. A function response is its one value."""

    def part(p: dict[str, Any]) -> tuple[Any, ...]:
        signed = (signature(p["thoughtSignature"]),) if "thoughtSignature" in p else ()
        if "text" in p:
            return ("text", p["text"], *signed)
        if "functionCall" in p:
            call = p["functionCall"]
            given = call.get("id")
            given = None if given is None or given.startswith("pyd_ai_") else given
            return ("call", call["name"], call.get("args", {}), given, *signed)
        response = p["functionResponse"]
        given = response.get("id")
        given = None if given is None or given.startswith("pyd_ai_") else given
        (value,) = response["response"].values()
        return ("response", response["name"], value, given)

    return [(c["role"], [part(p) for p in c["parts"]]) for c in body["contents"]]


async def test_native_output(provider: FakeProvider):
    (recorded,) = replay(provider, NATIVE)
    async with provider.client("gemini", model="gemini-2.0-flash") as client, kit() as toolkit:
        result = await client.run(
            "What is the largest city in Mexico?", toolkit, output_type=CityLocation
        )
    assert result.output == MEXICO and result.output_method == "native"
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (8, 20)
    assert result.model == "gemini-2.0-flash"
    (seen,) = provider.requests
    assert seen.path == "/v1beta/models/gemini-2.0-flash:generateContent"
    assert seen.headers["x-goog-api-key"] == "sk-test-key"
    asked, sent = recorded.request["generationConfig"], seen.body["generationConfig"]
    assert sent["responseMimeType"] == asked["responseMimeType"] == "application/json"
    assert shape(sent["responseJsonSchema"]) == shape(asked["responseJsonSchema"])
    assert turns(seen.body) == turns(recorded.request)
    assert "tools" not in seen.body and "toolConfig" not in seen.body


async def test_prompted_output(provider: FakeProvider):
    (recorded,) = replay(provider, PROMPTED)
    async with provider.client("gemini", model="gemini-2.0-flash") as client, kit() as toolkit:
        result = await client.run(
            "What is the largest city in Mexico?",
            toolkit,
            output_type=CityLocation,
            output_method="prompt",
        )
    assert result.output == MEXICO and result.output_method == "prompt"
    (body,) = provider.bodies
    assert turns(body) == turns(recorded.request)
    # The schema in the instructions, and JSON mode without a schema, as recorded.
    assert body["generationConfig"] == recorded.request["generationConfig"]
    (told,) = body["systemInstruction"]["parts"]
    assert '"required":["city","country"]' in told["text"]
    assert '"city":{"type":"string"}' in told["text"]


async def test_output_tool_after_a_function_call_without_an_id(provider: FakeProvider):
    """Gemini 2 sends calls without ids: the call gets a local id, its result goes back
    named after it and in its place, with no id, and the output tool ends the run."""
    recorded = replay(provider, TOOL)
    async with (
        provider.client("gemini", model="gemini-2.0-flash") as client,
        kit(get_user_country) as toolkit,
    ):
        result = await client.run(ASKED, toolkit, output_type=CityLocation, output_method="tool")
    assert result.output == MEXICO and result.output_method == "tool"
    (call,) = [record.call for record in result.tool_calls]
    assert call.name == "get_user_country" and call.id.startswith("gcall_")
    assert result.turns == 2
    for body, sent in zip(provider.bodies, recorded, strict=True):
        assert declarations(body) == declarations(sent.request)
        assert body["toolConfig"]["functionCallingConfig"]["mode"] == "ANY"
        assert turns(body) == turns(sent.request)
    last = provider.bodies[1]["contents"][-1]["parts"][0]["functionResponse"]
    assert "id" not in last and last["name"] == "get_user_country"


async def test_streamed_native_output_with_a_function_tool_and_thought_signatures(
    provider: FakeProvider,
):
    """Gemini 3 streams a call with an id and a thoughtSignature: the follow-up sends both
    back (the API refuses a signed call without it), then the JSON arrives in pieces."""
    recorded = replay(provider, STREAM_TOOLS)
    async with (
        provider.client("gemini", model="gemini-3-flash-preview") as client,
        kit(get_user_country) as toolkit,
    ):
        async with client.stream(ASKED, toolkit, output_type=CityLocation) as events:
            seen = [e async for e in events]
    done = seen[-1]
    assert isinstance(done, StreamDone)
    result = done.result
    assert result.output == MEXICO and result.output_method == "native"
    previews = [e.partial for e in seen if isinstance(e, StreamOutput)]
    assert previews[0] == {"city": "Mexico"} and previews[-1] == {
        "city": "Mexico City",
        "country": "Mexico",
    }
    assert [r.call.id for r in result.tool_calls] == ["96c1su3s"]
    # Thoughts are counted among the completion tokens, and apart as reasoning.
    assert (result.usage.reasoning_tokens, result.usage.completion_tokens) == (99, 132)
    assert result.usage.total_tokens == 110 + 179
    for request, sent in zip(provider.requests, recorded, strict=True):
        assert request.path == "/v1beta/models/gemini-3-flash-preview:streamGenerateContent"
        assert request.query == "alt=sse"
        assert turns(request.body) == turns(sent.request)
        assert declarations(request.body) == declarations(sent.request)
        config, asked = request.body["generationConfig"], sent.request["generationConfig"]
        assert shape(config["responseJsonSchema"]) == shape(asked["responseJsonSchema"])


async def test_streamed_output_with_google_search_a_server_tool(provider: FakeProvider):
    """Google Search, asked through extra_body, runs at the provider: its toolCall and
    toolResponse parts are no call of ours; the JSON after them is the output."""
    (recorded,) = replay(provider, STREAM_SEARCH)
    extra = {"tools": [{"googleSearch": {}}], "toolConfig": recorded.request["toolConfig"]}
    async with (
        provider.client(
            "gemini",
            model="gemini-3-flash-preview",
            settings=ModelSettings(extra_body=extra),
        ) as client,
        kit() as toolkit,
    ):
        async with client.stream(
            "What is the largest city in Mexico?", toolkit, output_type=CityLocation
        ) as events:
            seen = [e async for e in events]
    result = seen[-1].result  # type: ignore[union-attr]
    assert result.output == MEXICO
    assert result.tool_calls == ()
    (body,) = provider.bodies
    assert body["tools"] == recorded.request["tools"]
    assert body["toolConfig"] == recorded.request["toolConfig"]
    assert turns(body) == turns(recorded.request)
    # The reply's own parts are kept (and stored), to go back as they came later on.
    kept = messages_to_json(result.messages)["messages"][-1]["provider_content"]
    assert kept["style"] == "gemini"
    assert any("toolCall" in part for part in kept["blocks"])
    assert any("toolResponse" in part for part in kept["blocks"])


async def test_a_conversation_started_on_gemini_goes_on_with_openai(provider: FakeProvider):
    """pydantic-ai's run against Gemini, then its follow-up to OpenAI with that history:
    our requests carry what its did, turn for turn, on both sides."""
    recorded = replay(provider, ACROSS)
    async with (
        provider.client("gemini", model="gemini-2.0-flash-exp") as gemini,
        kit(get_capital) as toolkit,
    ):
        first = await gemini.run("What is the capital of France?", toolkit)
    assert first.text == "The capital of France is Paris.\n"
    for body, sent in zip(provider.bodies, recorded[:2], strict=True):
        assert turns(body) == turns(sent.request)
        assert declarations(body) == declarations(sent.request)
    async with provider.client(model="gpt-4o-mini") as openai, kit(get_capital) as toolkit:
        second = await openai.run(
            "What is the capital of England?", toolkit, history=first.messages
        )
    assert "London" in second.text
    asked = recorded[2].request["messages"]
    sent_messages = provider.bodies[2]["messages"]
    assert [m["role"] for m in sent_messages] == [m["role"] for m in asked]
    # The local id pairs the call with its result on the OpenAI side.
    call = sent_messages[1]["tool_calls"][0]
    assert call["function"] == {"name": "get_capital", "arguments": '{"country": "France"}'}
    assert sent_messages[2] == {"role": "tool", "tool_call_id": call["id"], "content": "Paris"}


async def test_streamed_replay_over_a_real_socket(fake_llm: FakeLLM):
    """The Gemini 3 stream served as recorded from 127.0.0.1, through the default aiohttp
    transport: the stream URL and its query, the key header, the recorded bytes."""
    recorded = load(STREAM_TOOLS)
    fake_llm.handler = lambda body, seen: recorded[len(fake_llm.requests) - 1].response()
    async with (
        LlmClient(
            fake_llm.url, "gemini", "gemini-3-flash-preview", api_key="gm-test-key"
        ) as client,
        kit(get_user_country) as toolkit,
    ):
        async with client.stream(ASKED, toolkit, output_type=CityLocation) as events:
            seen = [e async for e in events]
    assert seen[-1].result.output == MEXICO  # type: ignore[union-attr]
    for request, sent in zip(fake_llm.requests, recorded, strict=True):
        assert request.path == "/v1beta/models/gemini-3-flash-preview:streamGenerateContent"
        assert request.query == "alt=sse"
        assert request.headers["x-goog-api-key"] == "gm-test-key"
        assert turns(request.body) == turns(sent.request)
