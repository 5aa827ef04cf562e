"""Toolkit: assembly, registration, safe execution, schema adapters, closing."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest

from toolnexus_async import Tool, ToolContext, Toolkit, ToolResult, UsageError, define_tool
from toolnexus_async._core.codecs import render_anthropic, render_gemini, render_openai
from toolnexus_async.tools.builtin import BUILTIN_NAMES

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "opts": {"type": "object", "additionalProperties": False},
    },
    "required": ["city"],
    "additionalProperties": False,
}


class EchoTool:
    """A tool written by hand: no base class, just the shape."""

    description = "Echo the arguments back."
    input_schema = SCHEMA
    source = "custom"

    def __init__(self, name: str = "echo", reply: str | None = None) -> None:
        self.name = name
        self.reply = reply
        self.calls: list[tuple[dict[str, Any], ToolContext | None]] = []

    async def execute(self, args: dict[str, Any], ctx: ToolContext | None = None) -> ToolResult:
        self.calls.append((args, ctx))
        return ToolResult.ok(self.reply if self.reply is not None else repr(sorted(args.items())))


class ClosingTool(EchoTool):
    """A tool holding a resource: it has an aclose."""

    def __init__(self, name: str = "closer") -> None:
        super().__init__(name)
        self.closed = 0

    async def aclose(self) -> None:
        self.closed += 1


class RaisingTool(EchoTool):
    async def execute(self, args: dict[str, Any], ctx: ToolContext | None = None) -> ToolResult:
        raise LookupError("no such city: Atlantis")


class WrongReturnTool(EchoTool):
    async def execute(self, args: dict[str, Any], ctx: ToolContext | None = None) -> Any:
        return {"not": "a ToolResult"}


# --- create ---------------------------------------------------------------------------------


def test_builtins_are_on_by_default_and_include_question():
    """Toolkit.create() holds the built-ins, among them "question"."""
    toolkit = Toolkit.create()
    assert "question" in toolkit
    question = toolkit.get("question")
    assert question is not None
    assert question.source == "builtin"
    assert {t.name for t in toolkit.tools()} <= set(BUILTIN_NAMES)


def test_builtins_false_turns_them_all_off():
    """builtins=False gives a toolkit with only the extra tools."""
    echo = EchoTool()
    toolkit = Toolkit.create(builtins=False, extra_tools=[echo])
    assert toolkit.tools() == [echo]
    assert len(Toolkit.create(builtins=False)) == 0


def test_builtins_mapping_turns_single_ones_off():
    """{"tools": {"question": False}} drops that built-in only."""
    toolkit = Toolkit.create(builtins={"tools": {"question": False}})
    assert "question" not in toolkit
    assert "question" in Toolkit.create(builtins={"tools": {"question": True}})
    assert "question" in Toolkit.create(builtins={"tools": {}})


def test_builtins_mapping_accepts_every_family_name():
    """Every built-in name of the family may be switched, even one not implemented here."""
    Toolkit.create(builtins={"tools": {"bash": False, "webfetch": False}})


@pytest.mark.parametrize(
    ("builtins", "fragment"),
    [
        ({"tools": {"nope": False}}, "nope"),
        ({"tools": {"question": False, "Question": False}}, "Question"),
        ({"tool": {"question": False}}, "tool"),
        ({"tools": ["question"]}, "tools"),
        ("yes", "str"),
        (1, "int"),
    ],
)
def test_unknown_builtins_options_are_refused(builtins: Any, fragment: str):
    """Unknown built-in names, unknown options and odd types are a UsageError naming them."""
    with pytest.raises(UsageError, match=fragment):
        Toolkit.create(builtins=builtins)


def test_extra_tool_with_a_builtins_name_replaces_it():
    """An extra tool named like a built-in takes its place."""
    mine = EchoTool("question")
    toolkit = Toolkit.create(extra_tools=[mine])
    assert toolkit.get("question") is mine
    assert [t.name for t in toolkit.tools()].count("question") == 1


def test_duplicate_extra_tools_first_wins():
    """Among extra tools the first of a name wins."""
    first, second = EchoTool("dup", "first"), EchoTool("dup", "second")
    toolkit = Toolkit.create(builtins=False, extra_tools=[first, second])
    assert toolkit.get("dup") is first
    assert len(toolkit) == 1


def test_create_refuses_an_extra_that_is_not_a_tool():
    """extra_tools are checked like registered ones."""
    with pytest.raises(UsageError, match="not a tool"):
        Toolkit.create(extra_tools=[object()])  # type: ignore[list-item]


# --- register / get / tools -----------------------------------------------------------------


def test_register_refuses_a_taken_name():
    """register refuses a name already in use, naming it."""
    toolkit = Toolkit.create(builtins=False, extra_tools=[EchoTool()])
    with pytest.raises(UsageError, match=r"'echo'.*replace=True"):
        toolkit.register(EchoTool())


def test_register_with_replace_swaps_the_tool():
    """replace=True swaps the tool under that name."""
    old, new = EchoTool(reply="old"), EchoTool(reply="new")
    toolkit = Toolkit.create(builtins=False, extra_tools=[old])
    toolkit.register(new, replace=True)
    assert toolkit.get("echo") is new
    assert len(toolkit) == 1


def test_get_tools_len_contains():
    """get by name (None when absent), tools in registration order, len, in."""
    a, b = EchoTool("a"), EchoTool("b")
    toolkit = Toolkit.create(builtins=False)
    toolkit.register(b)
    toolkit.register(a)
    assert toolkit.get("a") is a
    assert toolkit.get("zzz") is None
    assert toolkit.tools() == [b, a]
    assert len(toolkit) == 2
    assert "a" in toolkit
    assert "zzz" not in toolkit
    assert 3 not in toolkit


def test_tools_returns_a_copy():
    """Mutating the list from tools() does not change the toolkit."""
    toolkit = Toolkit.create(builtins=False, extra_tools=[EchoTool()])
    toolkit.tools().clear()
    assert len(toolkit) == 1


class Partial:
    name = "partial"
    description = "lacks execute and input_schema"
    source = "custom"


def test_objects_missing_attributes_are_refused_naming_them():
    """An object without the Tool shape is a UsageError listing what it lacks."""
    with pytest.raises(UsageError, match="input_schema, execute"):
        Toolkit.create(builtins=False).register(Partial())  # type: ignore[arg-type]


def test_a_tool_with_an_invalid_name_is_refused():
    """The name rule applies to hand-written tools too."""
    with pytest.raises(UsageError, match="tool name"):
        Toolkit.create(builtins=False).register(EchoTool("bad name"))


def test_a_tool_whose_schema_is_not_an_object_is_refused():
    """input_schema must be a mapping (a JSON Schema object)."""
    tool = EchoTool()
    tool.input_schema = "string"  # type: ignore[assignment]
    with pytest.raises(UsageError, match="input_schema"):
        Toolkit.create(builtins=False).register(tool)


async def test_any_object_with_the_tool_shape_works():
    """A plain class with the Tool attributes is a Tool and executes through the toolkit."""
    echo = EchoTool(reply="hi")
    assert isinstance(echo, Tool)
    toolkit = Toolkit.create(builtins=False, extra_tools=[echo])
    ctx = ToolContext(call_id="c1")
    assert await toolkit.execute("echo", {"city": "Oslo"}, ctx) == ToolResult.ok("hi")
    assert echo.calls == [({"city": "Oslo"}, ctx)]


# --- execute --------------------------------------------------------------------------------


async def test_execute_passes_ctx_none_by_default():
    """Called without ctx, the tool gets None."""
    echo = EchoTool()
    toolkit = Toolkit.create(builtins=False, extra_tools=[echo])
    await toolkit.execute("echo", {"city": "Oslo"})
    assert echo.calls == [({"city": "Oslo"}, None)]


async def test_unknown_tool_is_an_error_result_naming_it_and_the_available_ones():
    """An unknown name is an error result naming it and listing the tools that exist."""
    toolkit = Toolkit.create(builtins=False, extra_tools=[EchoTool("a"), EchoTool("b")])
    assert await toolkit.execute("nope", {}) == ToolResult.error(
        "unknown tool 'nope'; available tools: a, b"
    )


async def test_unknown_tool_in_an_empty_toolkit():
    """With no tools at all the error says so."""
    result = await Toolkit.create(builtins=False).execute("nope", {})
    assert result == ToolResult.error("unknown tool 'nope'; available tools: none")


async def test_raising_tool_is_an_error_result_naming_the_exception():
    """A tool's exception becomes an error result naming the tool, the type and the message."""
    toolkit = Toolkit.create(builtins=False, extra_tools=[RaisingTool("geo")])
    assert await toolkit.execute("geo", {"city": "Oslo"}) == ToolResult.error(
        "tool 'geo' raised LookupError: no such city: Atlantis"
    )


async def test_non_tool_result_is_an_error_result():
    """A tool returning something other than a ToolResult gives an error result saying so."""
    toolkit = Toolkit.create(builtins=False, extra_tools=[WrongReturnTool("odd")])
    assert await toolkit.execute("odd", {"city": "Oslo"}) == ToolResult.error(
        "tool 'odd' returned dict, not a ToolResult"
    )


async def test_sync_execute_is_an_error_result():
    """A tool whose execute is not async cannot be awaited: an error result, not a crash."""

    class SyncTool(EchoTool):
        def execute(self, args: dict[str, Any], ctx: ToolContext | None = None) -> ToolResult:  # type: ignore[override]
            return ToolResult.ok("sync")

    sync_tool: Any = SyncTool("sync")  # deliberately not a Tool: execute is not async
    toolkit = Toolkit.create(builtins=False, extra_tools=[sync_tool])
    result = await toolkit.execute("sync", {"city": "Oslo"})
    assert result.is_error is True
    assert result.output.startswith("tool 'sync' raised TypeError")


async def test_cancellation_of_a_tool_is_not_swallowed():
    """A cancel scope cancelling a running tool propagates; execute returns no error result."""
    reached: list[str] = []

    with anyio.CancelScope() as scope:

        class Cancelled(EchoTool):
            async def execute(
                self, args: dict[str, Any], ctx: ToolContext | None = None
            ) -> ToolResult:
                scope.cancel()
                await anyio.lowlevel.checkpoint()
                reached.append("tool went on")
                return ToolResult.ok("unreachable")

        toolkit = Toolkit.create(builtins=False, extra_tools=[Cancelled("slow")])
        result = await toolkit.execute("slow", {"city": "Oslo"})
        reached.append(f"execute returned {result!r}")

    assert scope.cancelled_caught is True
    assert reached == []


# --- schema adapters ------------------------------------------------------------------------


def test_to_openai_shape():
    """Each tool is {"type": "function", "function": {name, description, parameters}}."""
    toolkit = Toolkit.create(builtins=False, extra_tools=[EchoTool()])
    assert toolkit.to_openai() == [
        {
            "type": "function",
            "function": {
                "name": "echo",
                "description": "Echo the arguments back.",
                "parameters": SCHEMA,
            },
        }
    ]


def test_to_anthropic_shape():
    """Each tool is {name, description, input_schema}."""
    toolkit = Toolkit.create(builtins=False, extra_tools=[EchoTool()])
    assert toolkit.to_anthropic() == [
        {"name": "echo", "description": "Echo the arguments back.", "input_schema": SCHEMA}
    ]


def test_to_gemini_shape_drops_keys_gemini_rejects():
    """Gemini gets the schema without $schema and additionalProperties, at any depth."""
    toolkit = Toolkit.create(builtins=False, extra_tools=[EchoTool()])
    assert toolkit.to_gemini() == [
        {
            "name": "echo",
            "description": "Echo the arguments back.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "opts": {"type": "object"}},
                "required": ["city"],
            },
        }
    ]
    # The tool's own schema is untouched.
    assert SCHEMA["additionalProperties"] is False


def test_adapters_follow_registration_order():
    """Adapters list tools in registration order."""
    toolkit = Toolkit.create(builtins=False, extra_tools=[EchoTool("b"), EchoTool("a")])
    assert [t["function"]["name"] for t in toolkit.to_openai()] == ["b", "a"]
    assert [t["name"] for t in toolkit.to_anthropic()] == ["b", "a"]
    assert [t["name"] for t in toolkit.to_gemini()] == ["b", "a"]


def test_wire_tools_are_rendered_once_until_register():
    """The codecs render the toolkit's tools once and reuse it until a tool is registered."""
    toolkit = Toolkit.create(builtins=False, extra_tools=[EchoTool("a")])
    renderers = (render_openai, render_anthropic, render_gemini)
    cached = [render(toolkit.specs) for render in renderers]
    for render, wire in zip(renderers, cached, strict=True):
        assert render(toolkit.specs) is wire
    toolkit.register(EchoTool("b"))
    for render, wire in zip(renderers, cached, strict=True):
        assert render(toolkit.specs) is not wire
    assert [t["function"]["name"] for t in toolkit.to_openai()] == ["a", "b"]
    assert [t["name"] for t in toolkit.to_anthropic()] == ["a", "b"]
    assert [t["name"] for t in toolkit.to_gemini()] == ["a", "b"]


def test_public_adapters_hand_out_copies():
    """Changing what to_openai/to_anthropic/to_gemini returned does not change later turns."""
    toolkit = Toolkit.create(builtins=False, extra_tools=[EchoTool("a")])
    for adapter in (toolkit.to_openai, toolkit.to_anthropic, toolkit.to_gemini):
        first = adapter()
        first.clear()
        assert len(adapter()) == 1
    toolkit.to_openai()[0]["function"]["name"] = "changed"
    assert render_openai(toolkit.specs)[0]["function"]["name"] == "a"


def test_adapters_of_defined_tools():
    """A define_tool tool's schema appears in the adapters."""

    @define_tool
    async def add(a: int, b: int) -> str:
        """Add two integers."""
        return str(a + b)

    toolkit = Toolkit.create(builtins=False, extra_tools=[add])
    assert toolkit.to_anthropic() == [
        {"name": "add", "description": "Add two integers.", "input_schema": add.input_schema}
    ]


# --- closing --------------------------------------------------------------------------------


async def test_async_with_closes_tools_that_have_aclose_once():
    """Leaving async with closes every tool with an aclose, once; later aclose is a no-op."""
    closer, other = ClosingTool("c1"), ClosingTool("c2")
    async with Toolkit.create(builtins=False, extra_tools=[closer, EchoTool(), other]) as toolkit:
        assert isinstance(toolkit, Toolkit)
        assert closer.closed == 0
    assert (closer.closed, other.closed) == (1, 1)
    await toolkit.aclose()
    assert (closer.closed, other.closed) == (1, 1)


async def test_async_with_closes_tools_when_the_body_raises():
    """Tools are closed even when the block fails, and the error propagates."""
    closer = ClosingTool()
    with pytest.raises(ZeroDivisionError):
        async with Toolkit.create(builtins=False, extra_tools=[closer]):
            _ = 1 / 0
    assert closer.closed == 1
