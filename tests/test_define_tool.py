"""define_tool: a Python function becomes a Tool (toolnexus_async/tools/native.py).

This module deliberately does not use ``from __future__ import annotations``: the hints
below are real objects, as most users write them.
"""

import enum
import json
import threading
import warnings
from collections.abc import Callable
from typing import Annotated, Any, Literal

import pytest

from toolnexus_async import (
    Request,
    Tool,
    ToolContext,
    Toolkit,
    ToolResult,
    UsageError,
    define_tool,
    pending_of,
)

# Most functions here are about schemas, not descriptions; the warning has its own tests.
pytestmark = pytest.mark.filterwarnings("ignore:tool .* has no description:UserWarning")


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Level(enum.Enum):
    LOW = 1
    HIGH = 2


def schema_of(fn: Callable[..., Any]) -> dict[str, Any]:
    return define_tool(fn).input_schema


# --- decoration -----------------------------------------------------------------------------


def test_bare_decorator_uses_the_function_name_and_docstring():
    """@define_tool takes the name from the function and the description from its docstring."""

    @define_tool
    async def send_mail(to: str) -> str:
        """Send a mail."""
        return to

    assert send_mail.name == "send_mail"
    assert send_mail.description == "Send a mail."
    assert send_mail.source == "native"
    assert isinstance(send_mail, Tool)


def test_decorator_with_name_and_description_overrides_both():
    """@define_tool(name=..., description=...) wins over the function's own."""

    @define_tool(name="mail-send", description="Deliver a message.")
    async def send_mail(to: str) -> str:
        """Ignored docstring."""
        return to

    assert send_mail.name == "mail-send"
    assert send_mail.description == "Deliver a message."


def test_decorator_called_with_no_options():
    """@define_tool() with parentheses behaves like the bare form."""

    @define_tool()
    def ping() -> str:
        """Ping."""
        return "pong"

    assert (ping.name, ping.description) == ("ping", "Ping.")


def test_function_without_docstring_has_an_empty_description():
    """No docstring, empty description."""

    @define_tool
    def quiet() -> str:
        return ""

    assert quiet.description == ""


def test_decorated_function_is_still_callable_directly():
    """Calling the tool object calls the function, as if undecorated."""

    @define_tool
    def add(a: int, b: int) -> int:
        return a + b

    assert add(2, 3) == 5


@pytest.mark.parametrize(
    "name", ["has space", "x" * 65, "dots.not.ok", "ünï", "trailing_newline\n", "tab\tname"]
)
def test_invalid_names_are_refused(name: str):
    """A name some provider would reject is a UsageError at definition time."""
    with pytest.raises(UsageError, match="tool name"):

        @define_tool(name=name)
        def fine() -> str:
            return ""


def test_a_lambda_has_no_valid_name():
    """A lambda's name '<lambda>' is not a tool name: refused unless a name is given."""
    with pytest.raises(UsageError, match="tool name"):
        define_tool(lambda: "x")
    assert define_tool(name="const")(lambda: "x").name == "const"


def test_blocking_is_refused_for_async_functions():
    """blocking=True is for plain functions; an async one is refused."""
    with pytest.raises(UsageError, match="blocking"):

        @define_tool(blocking=True)
        async def slow() -> str:
            return ""


def test_positional_only_parameters_are_refused():
    """Tool arguments are named; a positional-only parameter cannot be filled."""
    with pytest.raises(UsageError, match="'a'"):

        @define_tool
        def f(a: int, /) -> str:
            return ""


# --- schema inference -----------------------------------------------------------------------


def test_simple_types_and_required():
    """str/int/float/bool map to JSON types; parameters without defaults are required."""

    def f(s: str, i: int, x: float, b: bool) -> str:
        return ""

    assert schema_of(f) == {
        "type": "object",
        "properties": {
            "s": {"type": "string"},
            "i": {"type": "integer"},
            "x": {"type": "number"},
            "b": {"type": "boolean"},
        },
        "required": ["s", "i", "x", "b"],
        "additionalProperties": False,
    }


def test_defaults_are_not_required_and_are_recorded():
    """A parameter with a default is optional and its schema carries the default."""

    def f(city: str, days: int = 3, unit: str = "C") -> str:
        return ""

    schema = schema_of(f)
    assert schema["required"] == ["city"]
    assert schema["properties"]["days"] == {"type": "integer", "default": 3}
    assert schema["properties"]["unit"] == {"type": "string", "default": "C"}


def test_no_parameters_gives_an_empty_object_without_required():
    """A function without parameters takes an empty object."""

    def f() -> str:
        return ""

    assert schema_of(f) == {"type": "object", "properties": {}, "additionalProperties": False}


def test_list_and_dict_hints():
    """list[X] is an array of X; dict[str, X] an object whose values are X."""

    def f(tags: list[str], scores: dict[str, int], anything: dict[str, Any], raw: list) -> str:  # type: ignore[type-arg]
        return ""

    props = schema_of(f)["properties"]
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert props["scores"] == {"type": "object", "additionalProperties": {"type": "integer"}}
    assert props["anything"] == {"type": "object"}
    assert props["raw"] == {"type": "array"}


def test_tuple_hints():
    """tuple[X, ...] is an array of X; tuple[A, B] a fixed-length array."""

    def f(many: tuple[int, ...], pair: tuple[str, float]) -> str:
        return ""

    props = schema_of(f)["properties"]
    assert props["many"] == {"type": "array", "items": {"type": "integer"}}
    assert props["pair"] == {
        "type": "array",
        "prefixItems": [{"type": "string"}, {"type": "number"}],
        "minItems": 2,
        "maxItems": 2,
    }


def test_literal_hints():
    """Literal values become an enum, typed when all values share one JSON type."""

    def f(mode: Literal["fast", "safe"], n: Literal[1, 2, 3], mixed: Literal["a", 1]) -> str:
        return ""

    props = schema_of(f)["properties"]
    assert props["mode"] == {"type": "string", "enum": ["fast", "safe"]}
    assert props["n"] == {"type": "integer", "enum": [1, 2, 3]}
    assert props["mixed"] == {"enum": ["a", 1]}


def test_enum_hints_use_the_member_values():
    """An Enum parameter is an enum of its values."""

    def f(color: Color, level: Level) -> str:
        return ""

    props = schema_of(f)["properties"]
    assert props["color"] == {"type": "string", "enum": ["red", "green"]}
    assert props["level"] == {"type": "integer", "enum": [1, 2]}


def test_optional_hints():
    """X | None allows null; with a None default it is not required."""

    def f(note: str | None, limit: int | None = None) -> str:
        return ""

    schema = schema_of(f)
    assert schema["properties"]["note"] == {"anyOf": [{"type": "string"}, {"type": "null"}]}
    assert schema["properties"]["limit"] == {
        "anyOf": [{"type": "integer"}, {"type": "null"}],
        "default": None,
    }
    assert schema["required"] == ["note"]


def test_annotated_description():
    """Annotated[T, "text"] gives T's schema with that description."""

    def f(city: Annotated[str, "The city name"], days: Annotated[int, "How many days"] = 1) -> str:
        return ""

    props = schema_of(f)["properties"]
    assert props["city"] == {"type": "string", "description": "The city name"}
    assert props["days"] == {"type": "integer", "description": "How many days", "default": 1}


def test_unannotated_parameter_accepts_anything():
    """A parameter without a hint has the empty (any) schema."""

    def f(x) -> str:
        return ""

    assert schema_of(f)["properties"]["x"] == {}


class Opaque:
    pass


@pytest.mark.parametrize("hint", [bytes, complex, Opaque, set[bytes]])
def test_unsupported_hints_are_refused(hint: Any):
    """A hint with no JSON Schema equivalent is a UsageError at definition time."""

    def f(x: Any) -> str:
        return ""

    f.__annotations__["x"] = hint
    with pytest.raises(UsageError, match="JSON"):
        define_tool(f)


def test_var_keyword_allows_additional_properties():
    """**kwargs lets the tool accept extra keys (no additionalProperties: false)."""

    @define_tool
    async def f(a: int, **rest: Any) -> str:
        return json.dumps({"a": a, **rest}, sort_keys=True)

    assert "additionalProperties" not in f.input_schema
    assert f.input_schema["properties"] == {"a": {"type": "integer"}}


# --- docstrings -----------------------------------------------------------------------------


def test_description_is_the_first_paragraph_and_args_describe_parameters():
    """The first paragraph is the description; Google-style Args: describe each parameter."""

    @define_tool
    def book(city: str, nights: int = 1, *, guests: int = 2) -> str:
        """Book a hotel room
        in the given city.

        Longer explanation that is not part of the description.

        Args:
            city: Where to stay.
            nights (int): How many nights,
                counted from today.
            guests: Number of people.

        Returns:
            A confirmation code.
        """
        return ""

    assert book.description == "Book a hotel room in the given city."
    props = book.input_schema["properties"]
    assert props["city"] == {"type": "string", "description": "Where to stay."}
    assert props["nights"] == {
        "type": "integer",
        "description": "How many nights, counted from today.",
        "default": 1,
    }
    assert props["guests"]["description"] == "Number of people."


def test_annotated_description_wins_over_the_docstring():
    """When both describe a parameter, the Annotated text is kept."""

    def f(city: Annotated[str, "From the hint"]) -> str:
        """Do it.

        Args:
            city: From the docstring.
        """
        return ""

    assert schema_of(f)["properties"]["city"]["description"] == "From the hint"


def test_summary_stops_at_the_args_section():
    """A docstring that starts its Args right after the summary does not leak into it."""

    def f(x: int) -> str:
        """Summary line.
        Args:
            x: The x.
        """
        return ""

    tool = define_tool(f)
    assert tool.description == "Summary line."
    assert tool.input_schema["properties"]["x"]["description"] == "The x."


# --- ToolContext ----------------------------------------------------------------------------


async def test_tool_context_parameter_is_injected_and_not_in_the_schema():
    """A ToolContext parameter receives the call's ctx and is not a tool argument."""
    seen: list[ToolContext | None] = []

    @define_tool
    async def whoami(name: str, ctx: ToolContext) -> str:
        seen.append(ctx)
        return name

    assert "ctx" not in whoami.input_schema["properties"]
    assert whoami.input_schema["required"] == ["name"]
    context = ToolContext(call_id="c1", run_id="r1", tool_name="whoami")
    assert await whoami.execute({"name": "x"}, context) == ToolResult.ok("x")
    assert seen == [context]


async def test_optional_tool_context_gets_none_when_called_directly():
    """A ToolContext | None parameter receives None when the tool is called without ctx."""
    seen: list[ToolContext | None] = []

    @define_tool
    def f(context: ToolContext | None = None) -> str:
        seen.append(context)
        return "ok"

    assert f.input_schema["properties"] == {}
    assert await f.execute({}) == ToolResult.ok("ok")
    assert seen == [None]


async def test_ctx_cannot_be_smuggled_in_as_an_argument():
    """The context parameter is not an argument the model may pass."""

    @define_tool
    def f(ctx: ToolContext) -> str:
        return "ran"

    result = await f.execute({"ctx": "fake"}, ToolContext())
    assert result.is_error is True
    assert "ctx" in result.output


# --- results --------------------------------------------------------------------------------


async def test_returned_str_is_an_ok_result():
    """A returned str becomes ToolResult.ok(str)."""

    @define_tool
    async def greet(name: str) -> str:
        return f"hello {name}"

    assert await greet.execute({"name": "Ada"}) == ToolResult.ok("hello Ada")


async def test_returned_tool_result_passes_through():
    """A returned ToolResult is kept as is, so a function can suspend."""
    request = Request("r1", "approval", "Pay 30 EUR?")

    @define_tool
    async def pay(amount: int, ctx: ToolContext | None = None) -> ToolResult:
        if ctx is None or ctx.answer is None:
            return ToolResult.pending(request)
        return ToolResult.ok(f"paid {amount}")

    result = await pay.execute({"amount": 30})
    assert pending_of(result) is request
    error = ToolResult.error("no funds", {"code": 7})

    @define_tool
    def fail() -> ToolResult:
        return error

    assert await fail.execute({}) is error


@pytest.mark.parametrize(
    ("value", "output"),
    [
        ({"a": 1, "b": [1, 2]}, '{"a": 1, "b": [1, 2]}'),
        ([1, "x"], '[1, "x"]'),
        (3, "3"),
        (2.5, "2.5"),
        (True, "true"),
        (None, ""),
    ],
)
async def test_other_values_are_returned_as_json(value: object, output: str):
    """Non-str values become ok results holding their JSON; None becomes ""."""

    @define_tool
    def f() -> object:
        return value

    assert await f.execute({}) == ToolResult.ok(output)


async def test_raised_exception_becomes_an_error_result():
    """An exception is an error result naming the tool, the exception type and its message."""

    @define_tool
    async def explode(n: int) -> str:
        raise ValueError(f"bad n {n}")

    assert await explode.execute({"n": 4}) == ToolResult.error(
        "tool 'explode' raised ValueError: bad n 4"
    )


async def test_a_value_that_cannot_be_returned_is_an_error_result_too():
    """What the tool returns but cannot be made JSON fails as the function would have:
    the toolkit awaits the tool without a guard of its own (``guards_itself``)."""
    circular: list[object] = []
    circular.append(circular)

    @define_tool
    async def loop() -> object:
        return circular

    expected = ToolResult.error("tool 'loop' raised ValueError: Circular reference detected")
    assert await loop.execute({}) == expected
    toolkit = Toolkit.create(builtins=False, extra_tools=[loop])
    assert await toolkit.execute("loop", {}) == expected


async def test_raised_exception_in_a_sync_function_becomes_an_error_result():
    """A plain function's exception is converted the same way."""

    @define_tool
    def lookup(key: str) -> str:
        return {"a": "1"}[key]

    assert await lookup.execute({"key": "zz"}) == ToolResult.error(
        "tool 'lookup' raised KeyError: 'zz'"
    )


async def test_missing_argument_is_an_error_before_the_function_runs():
    """A missing required argument is an error result and the function is not called."""
    calls: list[object] = []

    @define_tool
    def f(a: int, b: int) -> str:
        calls.append((a, b))
        return ""

    result = await f.execute({"a": 1})
    assert result == ToolResult.error("f: missing required argument(s): b")
    assert calls == []


async def test_unexpected_argument_is_an_error_before_the_function_runs():
    """An argument the function does not take is an error result naming it."""
    calls: list[object] = []

    @define_tool
    def f(a: int) -> str:
        calls.append(a)
        return ""

    result = await f.execute({"a": 1, "zzz": 2})
    assert result.is_error is True
    assert "unexpected argument(s): zzz" in result.output
    assert calls == []


async def test_var_keyword_receives_extra_arguments():
    """With **kwargs extra arguments reach the function instead of being refused."""

    @define_tool
    async def f(a: int, **rest: Any) -> str:
        return json.dumps({"a": a, **rest}, sort_keys=True)

    assert await f.execute({"a": 1, "z": 2}) == ToolResult.ok('{"a": 1, "z": 2}')


async def test_arguments_that_are_not_a_mapping_are_an_error():
    """A direct caller passing a non-object gets an error result, not an exception."""

    @define_tool
    def f() -> str:
        return ""

    result = await f.execute(["x"])  # type: ignore[arg-type]
    assert result.is_error is True
    assert "object" in result.output


async def test_enum_arguments_are_coerced_to_members():
    """An Enum parameter receives the member for the value the model sent."""
    seen: list[object] = []

    @define_tool
    def paint(color: Color, level: Level = Level.LOW) -> str:
        seen.append((color, level))
        return color.name

    assert await paint.execute({"color": "green", "level": 2}) == ToolResult.ok("GREEN")
    assert seen == [(Color.GREEN, Level.HIGH)]


async def test_invalid_enum_value_is_an_error_listing_the_allowed_ones():
    """A value outside the enum is an error result listing the allowed values."""

    @define_tool
    def paint(color: Color) -> str:
        return ""

    assert await paint.execute({"color": "blue"}) == ToolResult.error(
        "paint: 'color' must be one of 'red', 'green'"
    )


async def test_sync_function_runs_inline_on_the_event_loop_thread():
    """A plain function runs in the caller's thread (no worker thread by default)."""
    threads: list[int] = []

    @define_tool
    def where() -> str:
        threads.append(threading.get_ident())
        return "here"

    assert await where.execute({}) == ToolResult.ok("here")
    assert threads == [threading.get_ident()]


async def test_blocking_function_runs_in_a_worker_thread():
    """blocking=True runs a plain function in a worker thread, not on the loop's thread."""
    threads: list[int] = []

    @define_tool(blocking=True)
    def where(x: int) -> str:
        threads.append(threading.get_ident())
        return str(x * 2)

    assert await where.execute({"x": 21}) == ToolResult.ok("42")
    assert len(threads) == 1
    assert threads[0] != threading.get_ident()


async def test_blocking_function_exception_becomes_an_error_result():
    """An exception in a worker thread is converted like any other."""

    @define_tool(blocking=True)
    def broken() -> str:
        raise RuntimeError("disk on fire")

    assert await broken.execute({}) == ToolResult.error(
        "tool 'broken' raised RuntimeError: disk on fire"
    )


async def test_defined_tool_runs_through_a_toolkit():
    """A defined tool is a Tool a Toolkit can execute."""

    @define_tool
    async def add(a: int, b: int) -> str:
        """Add."""
        return str(a + b)

    toolkit = Toolkit.create(builtins=False, extra_tools=[add])
    assert await toolkit.execute("add", {"a": 2, "b": 3}) == ToolResult.ok("5")


def test_a_tool_without_a_description_warns_where_it_is_defined():
    with pytest.warns(UserWarning, match=r"tool 'quiet' has no description: .* docstring") as seen:

        @define_tool
        async def quiet(x: int) -> str:
            return str(x)

    assert seen[0].filename == __file__  # pointed at the decorator line, not the package
    assert quiet.description == ""


def test_a_docstring_or_a_description_is_enough():
    with warnings.catch_warnings():
        warnings.simplefilter("error")

        @define_tool
        async def told(x: int) -> str:
            """Says x."""
            return str(x)

        @define_tool(description="Says x.")
        async def given(x: int) -> str:
            return str(x)

    assert told.description == given.description == "Says x."


async def test_a_method_in_a_class_body_is_refused_and_the_bound_method_works():
    with pytest.raises(UsageError, match=r"tool 'refund': its first parameter is 'self'"):

        class Shop:
            @define_tool
            async def refund(self, order: str) -> str:
                """Refund an order."""
                return order

    class Till:
        def __init__(self) -> None:
            self.refunded: list[str] = []

        async def refund(self, order: str) -> str:
            """Refund an order."""
            self.refunded.append(order)
            return f"refunded {order}"

    till = Till()
    tool = define_tool(till.refund)
    assert tool.input_schema["required"] == ["order"]
    assert "self" not in tool.input_schema["properties"]
    assert (await tool.execute({"order": "o1"})).output == "refunded o1"
    assert till.refunded == ["o1"]
