"""Typed output: every kind of output type, how it is read, retried and refused, through
real clients over an in-process model (the recorded provider traffic is
``test_replay_output.py``)."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, NotRequired, TypedDict, assert_type

import attrs
import pydantic
import pytest

from toolnexus_async import (
    AssistantMessage,
    LlmClient,
    Message,
    OutputSpec,
    OutputValidationError,
    PayloadError,
    RunResult,
    SystemMessage,
    Tool,
    ToolCall,
    Toolkit,
    UsageError,
    define_tool,
)
from toolnexus_async._core.partial_json import parse_partial


@attrs.frozen
class Point:
    x: int
    y: int


@dataclasses.dataclass
class Box:
    corner: Point
    tags: list[str]
    label: str | None = None


class Order(TypedDict):
    sku: str
    quantity: int
    note: NotRequired[str]


class Line(pydantic.BaseModel):
    sku: str
    amount: int


class Invoice(pydantic.BaseModel):
    number: str
    lines: list[Line] = []


@dataclasses.dataclass
class Node:
    child: Node | None


@dataclasses.dataclass
class Yes:
    approve: Literal[True]


@dataclasses.dataclass
class No:
    approve: Literal[False]
    reason: str


def text_of(message: object) -> str:
    return str(getattr(message, "text", ""))


def replying(*texts: str, seen: list[list[Message]] | None = None) -> Any:
    replies = iter(texts)

    def generate(messages: list[Message], tools: list[Tool]) -> str:
        if seen is not None:
            seen.append(messages)
        return next(replies)

    return generate


async def run_with(output_type: object, *texts: str, **options: Any) -> RunResult:
    async with (
        LlmClient.in_process(replying(*texts)) as client,
        Toolkit.create(builtins=False) as toolkit,
    ):
        return await client.run("go", toolkit, output_type=output_type, **options)


@pytest.mark.parametrize(
    ("output_type", "reply", "expected"),
    [
        (Point, '{"x": 1, "y": 2}', Point(1, 2)),
        (
            Box,
            '{"corner": {"x": 0, "y": 5}, "tags": ["a"]}',
            Box(Point(0, 5), ["a"]),
        ),
        (Order, '{"sku": "A-1", "quantity": 3}', {"sku": "A-1", "quantity": 3}),
        (
            Invoice,
            '{"number": "INV-1", "lines": [{"sku": "A", "amount": 2}]}',
            Invoice(number="INV-1", lines=[Line(sku="A", amount=2)]),
        ),
        (
            {"type": "array", "items": {"type": "integer"}},
            '{"result": [1, 2, 3]}',
            [1, 2, 3],
        ),
        (Yes | No, '{"result": {"approve": false, "reason": "late"}}', No(False, "late")),
        (Yes | No, '{"approve": true}', Yes(True)),  # a bare value where a wrapper was asked
    ],
    ids=["attrs", "dataclass", "typeddict", "pydantic", "json-schema", "union", "union-bare"],
)
async def test_each_kind_of_output_type(output_type: object, reply: str, expected: object):
    result = await run_with(output_type, reply)
    assert (result.status, result.output) == ("done", expected)
    assert result.output_method == "prompt"  # an in-process model has only the prompt
    assert result.text == reply  # the text stays what the model said


def test_the_schemas_of_classes():
    spec = LlmClient.in_process(replying()).output_spec(Box)
    assert spec is not None
    assert spec.schema == {
        "type": "object",
        "title": "Box",
        "properties": {
            "corner": {
                "type": "object",
                "title": "Point",
                "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                "required": ["x", "y"],
                "additionalProperties": False,
            },
            "tags": {"type": "array", "items": {"type": "string"}},
            "label": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        },
        "required": ["corner", "tags"],
        "additionalProperties": False,
    }
    assert not spec.strict and not spec.wrapped
    order = LlmClient.in_process(replying()).output_spec(Order)
    assert order is not None and order.schema["required"] == ["sku", "quantity"]


def test_a_type_that_is_no_json_schema_is_refused_before_the_run():
    client = LlmClient.in_process(replying())
    with pytest.raises(UsageError, match="contains itself"):
        client.output_spec(Node)
    with pytest.raises(UsageError, match="cannot describe"):
        client.output_spec(complex)
    with pytest.raises(UsageError, match="invalid input schema"):
        client.output_spec({"type": "object", "properties": {"a": {"type": 5}}})
    with pytest.raises(UsageError, match="no native structured output"):
        client.output_spec(Point, "native")
    with pytest.raises(UsageError, match="output_retries"):
        client.output_spec(Point, retries=-1)


def test_anthropic_asks_by_the_output_tool_unless_told():
    client = LlmClient(style="anthropic", model="claude", api_key="sk-ant-test-key")
    default, native = client.output_spec(Point), client.output_spec(Point, "native")
    assert default is not None and default.method == "tool"
    assert native is not None and native.method == "native"


async def test_an_invalid_reply_is_corrected_with_the_errors():
    seen: list[list[Message]] = []
    async with (
        LlmClient.in_process(
            replying(
                '{"x": "one"}', 'Sure: ```json\n{"x": 1, "y": 2}```', '{"x": 1, "y": 2}', seen=seen
            )
        ) as client,
        Toolkit.create(builtins=False) as toolkit,
    ):
        result = await client.run("go", toolkit, output_type=Point, output_retries=2)
    assert result.output == Point(1, 2)
    assert result.turns == 3
    first, second = (m[-1] for m in seen[1:])
    assert "x must be integer, got string" in text_of(first)
    assert "y is required" in text_of(first)
    assert "not JSON" in text_of(second)
    # The schema goes first, in the instructions, on every request; not into the transcript.
    assert all(isinstance(m[0], SystemMessage) and "JSON Schema" in m[0].text for m in seen)
    assert not any(isinstance(m, SystemMessage) for m in result.messages)


async def test_a_fenced_reply_is_read():
    result = await run_with(Point, '```json\n{"x": 1, "y": 2}\n```')
    assert result.output == Point(1, 2)


async def test_a_value_the_type_refuses_is_an_invalid_reply():
    class Positive(pydantic.BaseModel):
        n: int

        @pydantic.field_validator("n")
        @classmethod
        def positive(cls, n: int) -> int:
            if n <= 0:
                raise ValueError("must be positive")
            return n

    with pytest.raises(OutputValidationError, match="must be positive") as caught:
        await run_with(Positive, '{"n": -1}', output_retries=0)
    assert caught.value.raw == '{"n": -1}'
    assert caught.value.run.turns == 1


async def test_retries_stay_within_max_turns():
    async with (
        LlmClient.in_process(replying("no", "no"), max_turns=2) as client,
        Toolkit.create(builtins=False) as toolkit,
    ):
        result = await client.run("go", toolkit, output_type=Point, output_retries=5)
    assert (result.status, result.limit, result.output) == ("incomplete", "max_turns", None)


async def test_an_in_process_refusal_is_not_retried():
    async with (
        LlmClient.in_process(
            lambda m, t: AssistantMessage(None, refusal="I can't help with that.")
        ) as client,
        Toolkit.create(builtins=False) as toolkit,
    ):
        result = await client.run("go", toolkit, output_type=Point)
    assert (result.status, result.refusal, result.output, result.turns) == (
        "done",
        "I can't help with that.",
        None,
        1,
    )


async def test_the_output_tool_method_in_process():
    calls = iter(
        [
            AssistantMessage("thinking aloud"),  # text, not the tool: asked again
            AssistantMessage(
                None,
                (ToolCall("c1", "lookup", {}), ToolCall("c2", "final_result", {"x": 3, "y": 4})),
            ),
        ]
    )
    tools_seen: list[list[str]] = []

    def generate(messages: list[Message], tools: list[Tool]) -> AssistantMessage:
        tools_seen.append([t.name for t in tools])
        return next(calls)

    async with LlmClient.in_process(generate) as client, Toolkit.create(builtins=False) as toolkit:
        result = await client.run("go", toolkit, output_type=Point, output_method="tool")
    assert result.output == Point(3, 4)
    assert tools_seen == [["final_result"], ["final_result"]]
    assert result.tool_calls == ()  # neither call was executed
    returns = result.messages[-2:]
    assert [(r.name, r.is_error) for r in returns] == [  # type: ignore[union-attr]
        ("lookup", True),
        ("final_result", False),
    ]
    assert "must call the final_result tool" in text_of(result.messages[2])


async def test_ask_and_start_take_an_output_type():
    async with (
        LlmClient.in_process(replying('{"x": 1, "y": 1}', '{"x": 2, "y": 2}')) as client,
        Toolkit.create(builtins=False) as toolkit,
    ):
        asked = await client.ask("go", toolkit, conversation_id="c", output_type=Point)
        async with client.start("go", toolkit, output_type=Point) as handle:
            started = await handle.result()
    assert (asked.output, started.output) == (Point(1, 1), Point(2, 2))


async def test_the_stored_form_keeps_the_schema_and_the_json_value():
    result = await run_with(Box, '{"corner": {"x": 0, "y": 5}, "tags": []}')
    again = RunResult.from_dict(result.to_dict())
    assert again.output_spec == result.output_spec
    assert again.output == {"corner": {"x": 0, "y": 5}, "tags": []}  # JSON: the type is gone
    assert again.output_spec is not None and again.output_spec.convert is None
    typed = again.output_spec.with_type(Box)
    assert typed.accept(again.output_data)[0] == result.output
    plain = await run_with(None, "hi")
    assert "output_spec" not in plain.to_dict()  # a run without one stores what it did


def test_a_stored_spec_is_checked_when_read():
    spec = OutputSpec("Point", {"type": "object"}, "prompt").to_dict()
    assert OutputSpec.from_dict(spec).schema == {"type": "object"}
    with pytest.raises(PayloadError, match="method"):
        OutputSpec.from_dict({**spec, "method": "telepathy"})
    with pytest.raises(PayloadError, match="not usable"):
        OutputSpec.from_dict({**spec, "schema": {"type": 7}})


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ('{"a": "Oslo', {"a": "Oslo"}),
        ('{"a": 1, "b', {"a": 1}),
        ('{"a": [1, 2', {"a": [1, 2]}),
        ('{"a": {"b": tr', {"a": {}}),
        ('[{"x": 1}, {"y"', [{"x": 1}, {}]),
        ('```json\n{"a": 1', {"a": 1}),
        ("Sure, here", None),
        ("", None),
        ('{"a": 1}}', None),
    ],
)
def test_partial_json(text: str, value: object):
    assert parse_partial(text) == value


async def test_a_tool_named_like_the_output_tool_is_refused():
    @define_tool(name="final_result")
    async def clash() -> str:
        """A tool with the output tool's name."""
        return "x"

    async with (
        LlmClient.in_process(replying("{}")) as client,
        Toolkit.create(builtins=False, extra_tools=[clash]) as toolkit,
    ):
        with pytest.raises(UsageError, match="name of the output tool"):
            await client.run("go", toolkit, output_type=Point, output_method="tool")


async def test_the_output_is_typed_for_mypy():
    """mypy checks this file: run(..., output_type=Point) is a RunResult[Point]."""
    async with (
        LlmClient.in_process(replying('{"x": 1, "y": 2}', "hello")) as client,
        Toolkit.create(builtins=False) as toolkit,
    ):
        result = await client.run("go", toolkit, output_type=Point)
        plain = await client.run("go", toolkit)
    assert_type(result, RunResult[Point])
    assert_type(result.output, Point | None)
    assert_type(plain, RunResult[str])
    assert result.output is not None and result.output.x == 1
    assert (plain.output, plain.text) == ("hello", "hello")


def test_a_spec_is_made_once_per_output_type():
    client = LlmClient.in_process(replying())
    assert client.output_spec(Point) is client.output_spec(Point)
    assert client.output_spec(Yes | No) is client.output_spec(Yes | No)
    assert client.output_spec(Point, retries=3) is not client.output_spec(Point)
    schema = {"type": "object"}
    assert client.output_spec(schema) is client.output_spec(schema)
    assert client.output_spec(schema) is not client.output_spec({"type": "object"})
