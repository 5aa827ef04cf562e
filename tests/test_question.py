"""The ``question`` built-in: the canonical producer of kind="question" suspensions."""

from __future__ import annotations

import json
from typing import Any

import pytest

from toolnexus_async import Answer, Request, ToolContext, Toolkit, ToolResult, pending_of
from toolnexus_async.tools.builtin import QuestionTool


def question_tool() -> QuestionTool:
    tool = Toolkit.create().get("question")
    assert isinstance(tool, QuestionTool)
    return tool


async def ask(args: dict[str, Any], ctx: ToolContext | None = None) -> ToolResult:
    return await question_tool().execute(args, ctx)


async def suspension(args: dict[str, Any]) -> tuple[ToolResult, Request]:
    result = await ask(args)
    request = pending_of(result)
    assert request is not None, result
    return result, request


def test_question_is_a_builtin_tool_with_a_schema():
    """The question tool is a built-in with an object schema requiring 'questions'."""
    tool = question_tool()
    assert tool.name == "question"
    assert tool.source == "builtin"
    assert tool.description
    assert tool.input_schema["type"] == "object"
    assert tool.input_schema["required"] == ["questions"]


async def test_single_question_without_options():
    """One question without options: the prompt is its text, kind "question"."""
    result, request = await suspension({"questions": [{"question": "What is your name?"}]})
    assert request.kind == "question"
    assert request.prompt == "What is your name?"
    assert result.output == "What is your name?"
    assert result.is_error is True
    assert request.url is None
    assert request.id != ""


async def test_string_options_are_listed_in_the_prompt():
    """String options are appended as " (options: a, b, c)"."""
    _, request = await suspension(
        {"questions": [{"question": "Which size?", "options": ["small", "medium", "large"]}]}
    )
    assert request.prompt == "Which size? (options: small, medium, large)"


async def test_label_options_are_listed_by_label():
    """Options given as {"label", ...} objects are listed by their label."""
    _, request = await suspension(
        {
            "questions": [
                {
                    "question": "Deploy where?",
                    "header": "Target",
                    "options": [
                        {"label": "staging", "description": "safe"},
                        {"label": "production"},
                    ],
                    "multiple": False,
                }
            ]
        }
    )
    assert request.prompt == "Deploy where? (options: staging, production)"


async def test_several_questions_are_joined_by_newlines():
    """Each question is one line of the prompt, in order; options only where given."""
    questions = [
        {"question": "Name?"},
        {"question": "Colour?", "options": ["red", {"label": "blue"}]},
        {"question": "Notes?", "options": []},
    ]
    result, request = await suspension({"questions": questions})
    assert request.prompt == "Name?\nColour? (options: red, blue)\nNotes?"
    assert result.output == request.prompt


async def test_request_data_carries_the_questions():
    """The request's data is {"questions": [...]} as the model sent them."""
    questions = [{"question": "Pick one", "header": "H", "options": ["a", "b"], "multiple": True}]
    _, request = await suspension({"questions": questions})
    assert request.data == {"questions": questions}


async def test_each_suspension_has_a_fresh_request_id():
    """Two askings produce two distinct request ids."""
    args = {"questions": [{"question": "Again?"}]}
    _, first = await suspension(args)
    _, second = await suspension(args)
    assert first.id != second.id


async def test_retry_with_an_answer_returns_the_json_of_its_data():
    """On the retry (ctx.answer set) the result is json.dumps(answer.data)."""
    data = {"answers": [["medium"]], "note": "ünicode ok"}
    answer = Answer("req_1", True, data=data)
    result = await ask(
        {"questions": [{"question": "Which size?", "options": ["small", "medium"]}]},
        ToolContext(answer=answer, call_id="c1"),
    )
    assert result == ToolResult.ok(json.dumps(data))
    assert pending_of(result) is None


async def test_retry_with_an_answer_without_data():
    """An answer without data gives the JSON null."""
    result = await ask(
        {"questions": [{"question": "Continue?"}]}, ToolContext(answer=Answer("r", True))
    )
    assert result == ToolResult.ok("null")


async def test_context_without_an_answer_still_suspends():
    """A ctx whose answer is None is a first call: the tool suspends."""
    result = await ask({"questions": [{"question": "Q?"}]}, ToolContext(call_id="c1"))
    request = pending_of(result)
    assert request is not None
    assert request.prompt == "Q?"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ({}, "'questions'"),
        ({"questions": []}, "'questions'"),
        ({"questions": "What?"}, "'questions'"),
        ({"questions": [{"text": "What?"}]}, "questions[0]"),
        ({"questions": ["What?"]}, "questions[0]"),
        ({"questions": [{"question": 7}]}, "questions[0]"),
        ({"questions": [{"question": "ok"}, {"question": None}]}, "questions[1]"),
        ({"questions": [{"question": "Q", "options": "a,b"}]}, "questions[0].options"),
        ({"questions": [{"question": "Q", "options": ["a", 3]}]}, "questions[0].options[1]"),
        ({"questions": [{"question": "Q", "options": [{"name": "a"}]}]}, "questions[0].options[0]"),
    ],
)
async def test_malformed_input_is_an_error_result(args: dict[str, Any], fragment: str):
    """Malformed input is an error result (not a suspension) naming what is wrong."""
    result = await ask(args)
    assert result.is_error is True
    assert pending_of(result) is None
    assert result.output.startswith("question: ")
    assert fragment in result.output


async def test_question_runs_through_the_toolkit():
    """Executed by name through a default toolkit, question suspends with kind "question"."""
    toolkit = Toolkit.create()
    result = await toolkit.execute("question", {"questions": [{"question": "Ready?"}]})
    request = pending_of(result)
    assert request is not None
    assert (request.kind, request.prompt) == ("question", "Ready?")
