"""The ``question`` built-in: the canonical producer of ``kind="question"`` suspensions.

First call: the tool suspends with one prompt line per question (``" (options: a, b)"``
appended when the question offers options). Retry after ``wait_for`` answered: the tool
returns the JSON of ``answer.data``, which is what the human chose or typed.
"""

from __future__ import annotations

import json
from typing import Any

from ..._core.types import Request, ToolContext, ToolResult

__all__ = ("QuestionTool",)

_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "questions": {
            "type": "array",
            "minItems": 1,
            "description": "The questions to ask the user.",
            "items": {
                "type": "object",
                "properties": {
                    "question": {"type": "string", "description": "The full question."},
                    "header": {"type": "string", "description": "A short label for it."},
                    "options": {
                        "type": "array",
                        "description": "Choices to offer, if any.",
                        "items": {
                            "anyOf": [
                                {"type": "string"},
                                {
                                    "type": "object",
                                    "properties": {
                                        "label": {"type": "string"},
                                        "description": {"type": "string"},
                                    },
                                    "required": ["label"],
                                },
                            ]
                        },
                    },
                    "multiple": {
                        "type": "boolean",
                        "description": "Whether several options may be chosen.",
                    },
                },
                "required": ["question"],
            },
        }
    },
    "required": ["questions"],
}


def _label(option: object, where: str) -> str:
    if isinstance(option, str):
        return option
    if isinstance(option, dict) and isinstance(option.get("label"), str):
        return str(option["label"])
    raise ValueError(f"{where} must be a string or an object with a string 'label'")


def _parse(args: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    questions = args.get("questions")
    if not isinstance(questions, list) or not questions:
        raise ValueError("'questions' must be a non-empty list of {question, ...} objects")
    lines = []
    for i, item in enumerate(questions):
        if not isinstance(item, dict) or not isinstance(item.get("question"), str):
            raise ValueError(f"questions[{i}] must be an object with a string 'question'")
        options = item.get("options")
        if options is None or options == []:
            lines.append(item["question"])
            continue
        if not isinstance(options, list):
            raise ValueError(f"questions[{i}].options must be a list")
        labels = [_label(o, f"questions[{i}].options[{j}]") for j, o in enumerate(options)]
        lines.append(f"{item['question']} (options: {', '.join(labels)})")
    return questions, "\n".join(lines)


class QuestionTool:
    """Ask the user one or more questions and wait for the answers."""

    name = "question"
    description = (
        "Ask the user one or more questions when you need information or a decision only "
        "they can give. Offer options when the choices are known."
    )
    input_schema = _SCHEMA
    source = "builtin"

    async def execute(self, args: dict[str, Any], ctx: ToolContext | None = None) -> ToolResult:
        try:
            questions, prompt = _parse(args)
        except ValueError as exc:
            return ToolResult.error(f"question: {exc}")
        if ctx is not None and ctx.answer is not None:
            return ToolResult.ok(json.dumps(ctx.answer.data))
        return ToolResult.pending(Request("", "question", prompt, data={"questions": questions}))
