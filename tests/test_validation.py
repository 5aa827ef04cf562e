"""Argument validation: messages that name the field and the rule, compiled once per schema."""

from __future__ import annotations

import copy
import urllib.request
from typing import Any

import anyio
import jsonschema_rs
import pytest
from aiohttp import web

from toolnexus_async import UsageError
from toolnexus_async._core.validation import validator_for
from toolnexus_async.tools.builtin.question import QuestionTool
from toolnexus_async.tools.builtin.webfetch import WebFetchTool

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "format": {"type": "string", "enum": ["text", "markdown", "html"]},
        "timeout": {"type": "integer", "minimum": 1, "maximum": 120},
        "note": {"type": ["string", "null"]},
        "questions": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "question": {"type": "string"},
                    "options": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["question"],
                "additionalProperties": False,
            },
        },
        "retries": {"type": "integer", "default": 3},
    },
    "required": ["questions"],
    "additionalProperties": False,
}


def check(args: Any) -> str | None:
    return validator_for(SCHEMA)(args)


def test_valid_arguments_pass() -> None:
    """Arguments that satisfy the schema give None."""
    assert check({"questions": [{"question": "Why?", "options": ["a"]}], "format": "html"}) is None


def test_missing_required_field() -> None:
    """A missing top-level field is named with "is required"."""
    assert check({}) == "questions is required"


def test_wrong_type_names_both_types() -> None:
    """A wrong type says what was wanted and what was given."""
    assert check({"questions": [], "timeout": "30"}) == "timeout must be integer, got string"
    assert check({"questions": [], "timeout": True}) == "timeout must be integer, got boolean"
    assert check({"questions": [], "note": 5}) == "note must be string or null, got integer"


def test_enum_lists_the_choices() -> None:
    """A value outside an enum lists the allowed values as JSON."""
    assert (
        check({"questions": [], "format": "pdf"})
        == 'format must be one of "text", "markdown", "html", got "pdf"'
    )


def test_bounds_name_the_limit_and_the_value() -> None:
    """minimum / maximum say the limit and the value given."""
    assert check({"questions": [], "timeout": 500}) == "timeout must be at most 120, got 500"
    assert check({"questions": [], "timeout": 0}) == "timeout must be at least 1, got 0"


def test_nested_array_items_have_a_json_path() -> None:
    """A problem inside array items is located as questions[i].field."""
    ok = {"question": "fine"}
    assert check({"questions": [ok, {"options": []}]}) == "questions[1].question is required"
    assert check({"questions": [{"question": 7}]}) == (
        "questions[0].question must be string, got integer"
    )
    assert (
        check({"questions": [{"question": "q", "options": ["a", 2]}]})
        == "questions[0].options[1] must be string, got integer"
    )


def test_additional_properties_false() -> None:
    """An unexpected field is named, with the fields that are allowed."""
    assert check({"questions": [], "colour": "red"}) == (
        "colour is not allowed (allowed fields: format, timeout, note, questions, retries)"
    )
    assert check({"questions": [{"question": "q", "x": 1, "y": 2}]}) == (
        "questions[0].x, questions[0].y are not allowed (allowed fields: question, options)"
    )


def test_arguments_that_are_not_an_object() -> None:
    """The whole arguments value is called "arguments"."""
    assert check(["questions"]) == "arguments must be object, got array"


def test_validation_does_not_change_the_arguments() -> None:
    """Schema defaults are not filled in: the tool gets exactly what the model sent."""
    args = {"questions": [{"question": "q"}]}
    before = copy.deepcopy(args)
    assert check(args) is None
    assert args == before


def test_compiled_once_per_schema(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same schema object is compiled once, however often it is validated against."""
    calls = []
    real = jsonschema_rs.validator_for

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(jsonschema_rs, "validator_for", counting)
    schema = copy.deepcopy(SCHEMA)
    first = validator_for(schema)
    for _ in range(100):
        assert validator_for(schema) is first
        first({"questions": []})
    assert len(calls) == 1


def test_cache_is_not_fooled_by_reused_ids() -> None:
    """Short-lived schemas each get their own validator (a freed id is never mistaken)."""
    for i in range(200):
        assert validator_for({"type": "object", "required": [f"f{i}"]})({}) == f"f{i} is required"


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "strng"},
        {"type": "object", "required": "name"},
        {"type": "object", "properties": {"n": {"type": "integer", "minimum": "one"}}},
        {"type": "string", "pattern": "("},
        {"type": "object", "properties": {"n": {"$ref": "#/$defs/missing"}}},
        {"type": "object", "x": object()},
    ],
)
def test_an_invalid_schema_is_a_usage_error(schema: dict[str, Any]) -> None:
    """A broken schema raises UsageError when compiled, and again on the next ask."""
    with pytest.raises(UsageError, match="schema"):
        validator_for(schema)
    with pytest.raises(UsageError, match="schema"):
        validator_for(schema)


def test_a_remote_ref_is_refused_without_fetching(monkeypatch: pytest.MonkeyPatch) -> None:
    """A $ref outside the schema is a UsageError; nothing is fetched."""

    def no_network(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the validator tried to fetch a schema")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    for ref in ("http://127.0.0.1:9/s.json", "file:///etc/passwd", "other.json#/a"):
        with pytest.raises(UsageError, match="points outside the schema"):
            validator_for({"type": "object", "properties": {"a": {"$ref": ref}}})


def test_local_refs_work() -> None:
    """$defs references inside the schema are followed."""
    schema = {
        "type": "object",
        "properties": {"point": {"$ref": "#/$defs/point"}},
        "$defs": {"point": {"type": "object", "required": ["x"]}},
    }
    assert validator_for(schema)({"point": {}}) == "point.x is required"


def test_builtin_schemas_compile_and_check() -> None:
    """The built-ins' schemas are valid, and their rules are enforced with clear messages."""
    webfetch = validator_for(WebFetchTool.input_schema)
    assert webfetch({"url": "https://example.com"}) is None
    assert webfetch({"url": "https://e.com", "timeout": 500}) == (
        "timeout must be at most 120, got 500"
    )
    question = validator_for(QuestionTool.input_schema)
    assert question({"questions": [{"header": "h"}]}) == "questions[0].question is required"
    assert question({"questions": []}) == "questions must have at least 1 items"


# -- the dialect: JSON Schema 2020-12 by default, older drafts by their $schema --------------


@pytest.mark.parametrize(
    ("schema", "good", "bad", "said"),
    [
        (
            {"type": "array", "prefixItems": [{"type": "string"}], "items": False},
            ["a"],
            ["a", 1],
            "[1] is not allowed",
        ),
        (
            {"type": "object", "dependentRequired": {"card": ["expiry"]}},
            {"card": "4111", "expiry": "12/30"},
            {"card": "4111"},
            "expiry",
        ),
        (
            {"type": "array", "contains": {"type": "integer"}, "minContains": 2},
            [1, "x", 2],
            [1, "x"],
            "arguments",
        ),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "string"}},
                "unevaluatedProperties": False,
            },
            {"a": "x"},
            {"a": "x", "b": 1},
            "b is not allowed (allowed fields: a)",
        ),
    ],
)
def test_the_2020_12_keywords_mean_what_the_standard_says(
    schema: dict[str, Any], good: Any, bad: Any, said: str
) -> None:
    check = validator_for(schema)
    assert check(good) is None
    message = check(bad)
    assert message is not None and said in message


def test_an_older_draft_is_read_as_its_schema_says() -> None:
    """Draft-07 tuple ``items`` and ``additionalItems``, named by ``$schema``."""
    check = validator_for(
        {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "array",
            "items": [{"type": "string"}],
            "additionalItems": False,
        }
    )
    one: Any = ["a"]  # arrays, not arguments: the check reads any JSON value
    two: Any = ["a", 1]
    assert check(one) is None
    assert check(two) is not None


def test_every_violation_is_named_not_only_the_first() -> None:
    message = check({"questions": [{"question": 1}], "timeout": 0, "format": "pdf"})
    assert message is not None
    assert "questions[0].question must be string, got integer" in message
    assert "timeout must be at least 1, got 0" in message
    assert 'format must be one of "text", "markdown", "html", got "pdf"' in message


async def test_a_remote_ref_makes_no_request_at_all() -> None:
    """A $ref to a server that is listening: refused, and the server hears nothing."""
    asked: list[str] = []

    async def serve_schema(request: web.Request) -> web.Response:
        asked.append(request.path)
        return web.json_response({"type": "string"})

    app = web.Application()
    app.router.add_get("/s.json", serve_schema)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        with pytest.raises(UsageError, match="points outside the schema"):
            validator_for({"$ref": f"http://127.0.0.1:{port}/s.json"})
    finally:
        await runner.cleanup()
    assert asked == []


async def test_a_hostile_pattern_is_checked_in_bounded_time_and_the_loop_beats() -> None:
    """An MCP server's ``"pattern": "^(a+)+$"`` against a long hostile argument: Python's
    ``re`` backtracks for seconds; the check here takes microseconds, and a heartbeat on
    the loop never waits long (asserted loosely: only a stall fails it)."""
    hostile = validator_for(
        {
            "type": "object",
            "properties": {
                "id": {"type": "string", "pattern": "^(a+)+$"},
                "tag": {"type": "string", "pattern": "^(\\w+\\s?)*(?=x)y$"},
            },
        }
    )
    gaps: list[float] = []

    async def heartbeat() -> None:
        last = anyio.current_time()
        while True:
            await anyio.sleep(0.01)
            now = anyio.current_time()
            gaps.append(now - last)
            last = now

    async with anyio.create_task_group() as tg:
        tg.start_soon(heartbeat)
        # Sizes where a backtracking engine already stalls for seconds (2 ** 26 steps),
        # checked before the large one, which it would never finish.
        for size in (20, 22, 24, 26, 5000):
            await anyio.sleep(0.02)
            message = hostile({"id": "a" * size + "!", "tag": "ab " * size})
            assert message is not None and message.startswith("id must match")
            assert max(gaps, default=0.0) < 0.5, f"the loop stalled at {size} characters"
        tg.cancel_scope.cancel()
