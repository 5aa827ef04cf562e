"""The todowrite built-in: rendering, replacing the list, and refusing bad lists."""

from __future__ import annotations

from typing import Any

import pytest

from toolnexus_async.tools.builtin.todowrite import Todo, TodoWriteTool


def todo(id: str, text: str, completed: bool = False) -> dict[str, Any]:
    return {"id": id, "text": text, "completed": completed}


async def test_renders_the_list_and_keeps_it() -> None:
    """Done items are '[x]', open ones '[ ]', each with its id; the list stays on the tool."""
    tool = TodoWriteTool()
    result = await tool.execute({"todos": [todo("1", "read the code", True), todo("2", "fix it")]})
    assert not result.is_error
    assert result.output == "[x] 1. read the code\n[ ] 2. fix it"
    assert tool.todos == (Todo("1", "read the code", True), Todo("2", "fix it", False))
    assert result.metadata is not None
    assert result.metadata["done"] == 1 and result.metadata["total"] == 2


async def test_each_call_replaces_the_whole_list() -> None:
    """The latest call wins; an empty list clears it."""
    tool = TodoWriteTool()
    await tool.execute({"todos": [todo("1", "a"), todo("2", "b")]})
    await tool.execute({"todos": [todo("2", "b", True)]})
    assert tool.todos == (Todo("2", "b", True),)
    cleared = await tool.execute({"todos": []})
    assert not cleared.is_error and "empty" in cleared.output
    assert len(tool.todos) == 0


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({}, "'todos' is required"),
        ({"todos": "1. a"}, "must be a list"),
        ({"todos": ["a"]}, "todos[0] must be an object"),
        ({"todos": [{"text": "a", "completed": False}]}, "todos[0].id must be"),
        ({"todos": [todo("1", "a"), {"id": "2", "completed": False}]}, "todos[1].text must be"),
        ({"todos": [todo("1", "  ")]}, "todos[0].text must be a non-empty string"),
        ({"todos": [{"id": "1", "text": "a", "completed": "no"}]}, "todos[0].completed"),
        ({"todos": [{"id": 1, "text": "a", "completed": False}]}, "todos[0].id must be"),
        ({"todos": [todo("1", "a"), todo("1", "b")]}, "used twice"),
        ([], "JSON object"),
    ],
)
async def test_a_bad_list_is_an_error_and_keeps_the_previous_one(args: Any, expected: str) -> None:
    """Each malformed item is named; the list from before the bad call is untouched."""
    tool = TodoWriteTool()
    await tool.execute({"todos": [todo("1", "keep me")]})
    result = await tool.execute(args)
    assert result.is_error
    assert expected in result.output
    assert tool.todos == (Todo("1", "keep me", False),)
