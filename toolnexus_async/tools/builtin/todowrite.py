"""The ``todowrite`` built-in: the model's own task list, rendered back to it.

Rule of this module: every call replaces the whole list, and the list is checked item by item
before anything is kept, so an invalid call leaves the previous list in place. The tool touches
no file; the latest list lives on the instance (one per toolkit) for the host to show.
"""

from __future__ import annotations

from typing import Any

import attrs

from ..._core.types import ToolContext, ToolResult

__all__ = ("Todo", "TodoWriteTool")

_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "todos": {
            "type": "array",
            "description": "The complete, updated task list (it replaces the previous one).",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "string", "description": "A short unique id, e.g. '1'."},
                    "text": {"type": "string", "description": "What is to be done."},
                    "completed": {"type": "boolean", "description": "Whether it is done."},
                },
                "required": ["id", "text", "completed"],
            },
        }
    },
    "required": ["todos"],
}


@attrs.frozen
class Todo:
    """One task of the list."""

    id: str
    text: str
    completed: bool

    def render(self) -> str:
        return f"[{'x' if self.completed else ' '}] {self.id}. {self.text}"


def _parse(args: object) -> tuple[Todo, ...]:
    if not isinstance(args, dict):
        raise ValueError(f"arguments must be a JSON object, got {type(args).__name__}")
    items = args.get("todos")
    if not isinstance(items, list):
        raise ValueError("'todos' is required and must be a list of {id, text, completed}")
    todos: list[Todo] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ValueError(f"todos[{i}] must be an object with id, text and completed")
        for key in ("id", "text"):
            value = item.get(key)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"todos[{i}].{key} must be a non-empty string")
        if not isinstance(item.get("completed"), bool):
            raise ValueError(f"todos[{i}].completed must be true or false")
        if item["id"] in seen:
            raise ValueError(f"todos[{i}].id {item['id']!r} is used twice; ids must be unique")
        seen.add(item["id"])
        todos.append(Todo(item["id"], item["text"], item["completed"]))
    return tuple(todos)


class TodoWriteTool:
    """Keep a task list for the current work and show it."""

    name = "todowrite"
    description = (
        "Write your task list for the current work: send the complete list each time (it "
        "replaces the previous one), marking items completed as you finish them."
    )
    input_schema = _SCHEMA
    source = "builtin"

    def __init__(self) -> None:
        self.todos: tuple[Todo, ...] = ()

    async def execute(self, args: dict[str, Any], ctx: ToolContext | None = None) -> ToolResult:
        try:
            todos = _parse(args)
        except ValueError as exc:
            return ToolResult.error(f"todowrite: {exc}; the previous list is kept")
        self.todos = todos
        done = sum(todo.completed for todo in todos)
        text = "\n".join(todo.render() for todo in todos) if todos else "(the list is empty)"
        return ToolResult.ok(
            text,
            {"todos": [attrs.asdict(todo) for todo in todos], "done": done, "total": len(todos)},
        )
