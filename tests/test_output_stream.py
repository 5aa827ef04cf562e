"""Streamed previews of a run's typed output when it comes through the output tool (the
``"tool"`` method, Anthropic's default): the tool call's argument pieces become
``StreamOutput`` previews as they arrive, then ``StreamDone`` carries the validated value.

Over recorded traffic where there is some (pydantic-ai's OpenAI stream of a
``final_result`` call, ``tests/recordings/``), and over a loopback Anthropic endpoint
streaming the Messages API's event shapes (no recorded Anthropic stream calls an output
tool)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from toolnexus_async import (
    LlmClient,
    StreamDone,
    StreamEvent,
    StreamOutput,
    StreamText,
    Toolkit,
    define_tool,
)
from toolnexus_async.testing import ScriptedModel, reply, sse_response, tool_call

from .conftest import FakeLLM, FakeProvider
from .replay import load

# The last reply of pydantic-ai's run: a streamed call of final_result, its arguments in
# pieces of a few characters.
COMPLEX_RUN = "pydantic-ai/test_temporal/test_complex_agent_run.yaml"


@dataclasses.dataclass
class Answer:
    label: str
    answer: str


@dataclasses.dataclass
class Response:
    answers: list[Answer]


@dataclasses.dataclass
class Forecast:
    city: str
    days: int


def no_tools() -> Toolkit:
    return Toolkit.create(builtins=False)


async def events_of(client: LlmClient, output_type: object, **options: Any) -> list[StreamEvent]:
    async with no_tools() as toolkit:
        async with client.stream("go", toolkit, output_type=output_type, **options) as events:
            return [event async for event in events]


def previews(events: list[StreamEvent]) -> list[object]:
    return [e.partial for e in events if isinstance(e, StreamOutput)]


async def test_openai_output_tool_stream_previews_then_validates(provider: FakeProvider):
    recorded = load(COMPLEX_RUN)[-1]
    provider.script(recorded.response())
    async with provider.client(model="gpt-4o") as client:
        seen = await events_of(client, Response, output_method="tool")
    shown = previews(seen)
    assert len(shown) > 5
    # The list grows an answer at a time; the first answer's text grows before the second.
    counts = [len(p["answers"]) for p in shown if isinstance(p, dict) and "answers" in p]
    assert counts == sorted(counts) and counts[-1] == 3
    firsts = [
        p["answers"][0].get("answer", "") for p in shown if isinstance(p, dict) and p.get("answers")
    ]
    assert all("The capital of Mexico is Mexico City.".startswith(a) for a in firsts)
    assert len(set(firsts)) > 1
    done = seen[-1]
    assert isinstance(done, StreamDone)
    assert shown[-1] == done.result.output_data
    assert done.result.output == Response(
        [
            Answer("Capital", "The capital of Mexico is Mexico City."),
            Answer("Weather", "The weather in Mexico City is currently sunny."),
            Answer("Product Name", "The product name is Pydantic AI."),
        ]
    )
    assert provider.bodies[0]["tool_choice"] == "required"
    # No text was streamed: the value came as the call's arguments.
    assert not [e for e in seen if isinstance(e, StreamText)]


def anthropic_stream(*pieces: str, text: str = "", name: str = "final_result") -> Any:
    """The Messages API's stream of a reply that calls ``name`` with ``pieces`` as its
    ``input_json_delta``s (the shapes of anthropic-sdk-python's tool_use_response.txt),
    after an optional text block."""
    start = {
        "type": "message_start",
        "message": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-20250514",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 377, "output_tokens": 1},
        },
    }
    events: list[Any] = [("message_start", start)]
    index = 0
    if text:
        block = {"type": "text", "text": ""}
        delta = {"type": "text_delta", "text": text}
        events += [
            (
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": block},
            ),
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ]
        index = 1
    tool = {"type": "tool_use", "id": f"toolu_{index}", "name": name, "input": {}}
    events.append(
        (
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": tool},
        )
    )
    events.append(("ping", {"type": "ping"}))
    for piece in ("", *pieces):
        delta = {"type": "input_json_delta", "partial_json": piece}
        events.append(
            (
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": delta},
            )
        )
    events += [
        ("content_block_stop", {"type": "content_block_stop", "index": index}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                "usage": {"output_tokens": 65},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return sse_response(events)


async def test_anthropic_output_tool_stream_previews_over_a_socket(fake_llm: FakeLLM):
    """Anthropic's default method, over HTTP on 127.0.0.1: the text before the call is
    text, the call's arguments are previews, the value is validated at the end."""
    pieces = ['{"ci', 'ty": "Pa', 'ris", "da', 'ys": 1', "2}"]
    # FakeLLM sends bytes as they are: the stream, whole, as one body.
    fake_llm.handler = lambda body, seen: anthropic_stream(*pieces, text="Let me see.").content
    async with LlmClient(fake_llm.url, "anthropic", "claude", api_key="sk-ant-test") as client:
        seen = await events_of(client, Forecast)
    assert [e.text for e in seen if isinstance(e, StreamText)] == ["Let me see."]
    # Best effort: a number cut short shows as far as it came.
    assert previews(seen) == [
        {"city": "Pa"},
        {"city": "Paris"},
        {"city": "Paris", "days": 1},
        {"city": "Paris", "days": 12},
    ]
    done = seen[-1]
    assert isinstance(done, StreamDone)
    assert done.result.output == Forecast("Paris", 12)
    assert done.result.output_method == "tool"
    body = fake_llm.bodies[0]
    assert body["stream"] is True and body["tool_choice"] == {"type": "any"}


async def test_a_wrapped_output_is_previewed_unwrapped(provider: FakeProvider):
    """A schema whose root is no object travels as {"result": ...}: the preview is the
    value inside, as the output is."""
    provider.script(anthropic_stream('{"result": ["a"', ', "b"', "]}"))
    async with provider.client("anthropic", "claude") as client:
        seen = await events_of(client, list[str])
    assert previews(seen) == [["a"], ["a", "b"]]
    done = seen[-1]
    assert isinstance(done, StreamDone) and done.result.output == ["a", "b"]


async def test_another_tools_arguments_are_no_preview(provider: FakeProvider):
    """Only the output tool's arguments preview the output; a call of another tool of the
    same run streams no StreamOutput."""
    provider.script(
        anthropic_stream('{"city": "Rome"}', name="lookup"),
        anthropic_stream('{"city": "Rome", "days": 2}'),
    )

    @define_tool
    async def lookup(city: str) -> str:
        """Look a city up."""
        return f"{city}: sunny"

    async with (
        provider.client("anthropic", "claude") as client,
        Toolkit.create(builtins=False, extra_tools=[lookup]) as toolkit,
    ):
        async with client.stream("go", toolkit, output_type=Forecast) as events:
            seen = [event async for event in events]
    assert previews(seen) == [{"city": "Rome", "days": 2}]
    done = seen[-1]
    assert isinstance(done, StreamDone) and done.result.output == Forecast("Rome", 2)


async def test_the_output_tool_method_in_process_previews_once():
    """An in-process model hands its call over whole: one preview, then the value."""
    arguments = {"city": "Oslo", "days": 3}
    model = ScriptedModel(reply(tool_call("final_result", arguments)))
    async with LlmClient.in_process(model) as client:
        seen = await events_of(client, Forecast, output_method="tool")
    assert previews(seen) == [arguments]
    done = seen[-1]
    assert isinstance(done, StreamDone) and done.result.output == Forecast("Oslo", 3)
    assert json.loads(json.dumps(done.result.output_data)) == arguments
