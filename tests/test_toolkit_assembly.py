"""Toolkit.create with the built-ins: the full set, workdir/confine, approve, validation,
closing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.shared import loopback
from toolnexus_async import BuiltinTools, ToolContext, Toolkit, ToolResult, UsageError, pending_of
from toolnexus_async.tools.builtin import ACTING_NAMES, BUILTIN_NAMES

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"count": {"type": "integer", "minimum": 1}},
    "required": ["count"],
    "additionalProperties": False,
}


class Counter:
    """A custom tool that records whether it ran."""

    name = "counter"
    description = "Count."
    input_schema = SCHEMA
    source = "custom"

    def __init__(self) -> None:
        self.ran: list[dict[str, Any]] = []

    async def execute(self, args: dict[str, Any], ctx: ToolContext | None = None) -> ToolResult:
        self.ran.append(args)
        return ToolResult.ok(str(args["count"]))


def test_every_builtin_is_there_in_family_order():
    """builtins=True gives the ten built-ins of the toolnexus family, all source 'builtin'."""
    toolkit = Toolkit.create()

    assert [t.name for t in toolkit.tools()] == list(BUILTIN_NAMES)
    assert len(BUILTIN_NAMES) == 10
    assert {t.source for t in toolkit.tools()} == {"builtin"}


def test_single_builtins_can_be_turned_off():
    """{"tools": {"bash": False}} drops bash and keeps the other nine."""
    toolkit = Toolkit.create(builtins={"tools": {"bash": False, "webfetch": False}})

    assert [t.name for t in toolkit.tools()] == [
        n for n in BUILTIN_NAMES if n not in ("bash", "webfetch")
    ]


async def test_workdir_is_where_file_tools_and_bash_work(tmp_path: Path):
    """write/read and bash's default working directory are the given workdir."""
    async with Toolkit.create(workdir=tmp_path, approve="allow-all") as toolkit:
        wrote = await toolkit.execute("write", {"path": "notes/a.txt", "content": "hello\n"})
        assert not wrote.is_error, wrote.output
        read = await toolkit.execute("read", {"path": "notes/a.txt"})
        pwd = await toolkit.execute("bash", {"command": "pwd"})

    assert (tmp_path / "notes" / "a.txt").read_text() == "hello\n"
    assert "hello" in read.output
    assert pwd.output.strip() == str(tmp_path.resolve())


async def test_confine_refuses_escapes_through_the_toolkit(tmp_path: Path):
    """confine=True: '..', an absolute path outside and bash's workdir outside are refused."""
    inside = tmp_path / "root"
    inside.mkdir()
    (tmp_path / "secret.txt").write_text("top secret")
    async with Toolkit.create(workdir=inside, confine=True) as toolkit:
        climbing = await toolkit.execute("read", {"path": "../secret.txt"})
        absolute = await toolkit.execute("read", {"path": str(tmp_path / "secret.txt")})
        writing = await toolkit.execute("write", {"path": "../x.txt", "content": "x"})
        bash = await toolkit.execute("bash", {"command": "pwd", "workdir": str(tmp_path)})

    for result in (climbing, absolute, writing, bash):
        assert result.is_error
        assert "top secret" not in result.output
    assert "climbs out of" in climbing.output
    assert not (tmp_path / "x.txt").exists()


async def test_without_confine_the_same_paths_work(tmp_path: Path):
    """confine=False: a path outside the workdir is readable."""
    inside = tmp_path / "root"
    inside.mkdir()
    (tmp_path / "open.txt").write_text("shared")
    async with Toolkit.create(workdir=inside, confine=False) as toolkit:
        result = await toolkit.execute("read", {"path": "../open.txt"})

    assert not result.is_error
    assert "shared" in result.output


async def test_confined_by_default(tmp_path: Path):
    """Toolkit.create() confines: the file tools and bash's workdir stay under workdir."""
    inside = tmp_path / "root"
    inside.mkdir()
    (tmp_path / "secret.txt").write_text("top secret")
    async with Toolkit.create(workdir=inside, approve="allow-all") as toolkit:
        results = [
            await toolkit.execute("read", {"path": "../secret.txt"}),
            await toolkit.execute("grep", {"pattern": "secret", "path": ".."}),
            await toolkit.execute("glob", {"pattern": "*", "path": str(tmp_path)}),
            await toolkit.execute("write", {"path": "../x.txt", "content": "x"}),
            await toolkit.execute(
                "edit", {"path": "../secret.txt", "oldString": "top", "newString": "no"}
            ),
            await toolkit.execute("bash", {"command": "touch ran", "workdir": ".."}),
        ]

    for result in results:
        assert result.is_error, result.output
        assert "workspace root" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["root", "secret.txt"]
    assert (tmp_path / "secret.txt").read_text() == "top secret"


async def test_approve_reaches_the_acting_builtins(tmp_path: Path):
    """approve= is the policy of bash, write, edit and apply_patch; the others never ask."""
    asking = Toolkit.create(workdir=tmp_path)
    free = Toolkit.create(workdir=tmp_path, approve="allow-all")
    (tmp_path / "a.txt").write_text("a\n")
    calls: dict[str, dict[str, Any]] = {
        "bash": {"command": "true"},
        "write": {"path": "b.txt", "content": "b"},
        "edit": {"path": "a.txt", "oldString": "a", "newString": "z"},
        "apply_patch": {"patchText": "*** Begin Patch\n*** Delete File: a.txt\n*** End Patch"},
        "read": {"path": "a.txt"},
        "grep": {"pattern": "a"},
        "glob": {"pattern": "*"},
        "todowrite": {"todos": []},
    }
    for name, args in calls.items():
        result = await asking.execute(name, args)
        asked = pending_of(result)
        assert (asked is not None) is (name in ACTING_NAMES), name
        if asked is not None:
            assert asked.kind == "approval" and asked.data is not None
            assert asked.data["tool"] == name and asked.data["arguments"] == args
    assert (tmp_path / "a.txt").read_text() == "a\n" and not (tmp_path / "b.txt").exists()
    for name in ACTING_NAMES:
        result = await free.execute(name, calls[name])
        assert not result.is_error and pending_of(result) is None, (name, result.output)
    assert not (tmp_path / "a.txt").exists() and (tmp_path / "b.txt").read_text() == "b"


@pytest.mark.parametrize("approve", ["never", "allow", True, None, 1])
def test_a_bad_approve_policy_is_refused(approve: Any):
    """Anything but "ask", "allow-all" or a callable is a UsageError, built-ins or not."""
    with pytest.raises(UsageError, match="approve must be 'ask', 'allow-all' or a callable"):
        Toolkit.create(approve=approve)
    with pytest.raises(UsageError, match="approve must be"):
        Toolkit.create(builtins=False, approve=approve)


async def test_arguments_are_validated_before_the_tool_runs():
    """A call that breaks the input schema is an error result naming field and rule."""
    counter = Counter()
    toolkit = Toolkit.create(builtins=False, extra_tools=[counter])

    missing = await toolkit.execute("counter", {})
    wrong = await toolkit.execute("counter", {"count": "three"})
    small = await toolkit.execute("counter", {"count": 0})
    extra = await toolkit.execute("counter", {"count": 1, "colour": "red"})
    fine = await toolkit.execute("counter", {"count": 2})

    assert missing == ToolResult.error(
        "invalid arguments for tool 'counter': count is required; the tool did not run"
    )
    assert wrong.is_error and "count must be integer" in wrong.output
    assert small.is_error and "count" in small.output
    assert extra.is_error and "colour" in extra.output
    assert fine == ToolResult.ok("2")
    assert counter.ran == [{"count": 2}]


async def test_builtin_arguments_are_validated_too():
    """The built-ins' schemas are enforced: a question without 'questions' never suspends."""
    toolkit = Toolkit.create()

    result = await toolkit.execute("question", {"ask": "what?"})

    assert result.is_error
    assert result.metadata is None
    assert "questions is required" in result.output


async def test_validation_can_be_turned_off():
    """validate=False hands any arguments to the tool, which then copes on its own."""
    counter = Counter()
    toolkit = Toolkit.create(builtins=False, extra_tools=[counter], validate=False)

    result = await toolkit.execute("counter", {"count": "three"})

    assert result == ToolResult.ok("three")


async def test_an_invalid_schema_is_an_error_result_not_a_crash():
    """A tool whose schema cannot compile gets an error result; other tools still run."""

    class Broken(Counter):
        name = "broken"
        input_schema = {  # noqa: RUF012 - a class attribute, as the Tool shape allows
            "type": "object",
            "properties": {"n": {"type": "no-such-type"}},
        }

    counter = Counter()
    toolkit = Toolkit.create(builtins=False, extra_tools=[Broken(), counter])

    broken = await toolkit.execute("broken", {"n": 1})
    fine = await toolkit.execute("counter", {"count": 1})

    assert broken.is_error
    assert "input schema is invalid" in broken.output
    assert fine == ToolResult.ok("1")


async def test_re_registering_a_tool_uses_its_new_schema():
    """replace=True drops the compiled check of the old tool."""
    toolkit = Toolkit.create(builtins=False, extra_tools=[Counter()])
    assert (await toolkit.execute("counter", {})).is_error

    class Lenient(Counter):
        input_schema = {"type": "object"}  # noqa: RUF012

    toolkit.register(Lenient(), replace=True)
    result = await toolkit.execute("counter", {"count": "any"})

    assert result == ToolResult.ok("any")


async def test_aclose_closes_the_shared_http_session():
    """webfetch's session is created on use and closed with the toolkit; allow_hosts lets
    the built-in reach a loopback page, which it refuses otherwise."""
    served: list[str] = []

    async def page(request: web.Request) -> web.Response:
        served.append(request.path)
        return web.Response(text="<h1>Hi</h1>", content_type="text/html")

    app = web.Application()
    app.router.add_get("/", page)
    async with loopback(app) as url:
        toolkit = Toolkit.create(allow_hosts=["127.0.0.1"])
        result = await toolkit.execute("webfetch", {"url": f"{url}/"})
        builtins = toolkit.sources[0]
        assert isinstance(builtins, BuiltinTools)
        session = builtins.session
        opened = repr(session)
        await toolkit.aclose()

    assert result.output == "# Hi"
    assert served == ["/"]
    assert opened == "SharedSession(open)"
    assert session.closed


async def test_the_builtin_webfetch_refuses_loopback_unless_allowed():
    """By name, loopback is refused once resolved, and the server sees no request."""
    served: list[str] = []

    async def page(request: web.Request) -> web.Response:
        served.append(request.path)
        return web.Response(text="<h1>Hi</h1>", content_type="text/html")

    app = web.Application()
    app.router.add_get("/", page)
    async with loopback(app) as url, Toolkit.create() as toolkit:
        url = url.replace("127.0.0.1", "localhost")
        result = await toolkit.execute("webfetch", {"url": f"{url}/"})
    assert result.output.startswith("webfetch: refused to connect to 127.0.0.1 (localhost)")
    assert served == []


async def test_a_closed_toolkit_refuses_use():
    """As a closed client refuses to run: execute, register and async with are refused."""
    toolkit = Toolkit.create(builtins=False, extra_tools=[Counter()])
    async with toolkit:
        assert (await toolkit.execute("counter", {"count": 1})).output == "1"
    with pytest.raises(UsageError, match="this toolkit is closed"):
        await toolkit.execute("counter", {"count": 1})
    with pytest.raises(UsageError, match="this toolkit is closed"):
        toolkit.register(Counter(), replace=True)
    with pytest.raises(UsageError, match="this toolkit is closed"):
        async with toolkit:
            pass
    await toolkit.aclose()  # still idempotent


async def test_a_failing_close_does_not_keep_the_others_open():
    """Every tool is closed even when one aclose raises; the error comes out afterwards."""
    closed: list[str] = []

    class Closer(Counter):
        def __init__(self, name: str, fail: bool) -> None:
            super().__init__()
            self.name = name
            self.fail = fail

        async def aclose(self) -> None:
            closed.append(self.name)
            if self.fail:
                raise OSError(f"{self.name} would not close")

    toolkit = Toolkit.create(extra_tools=[Closer("a", True), Closer("b", False)])
    builtins = toolkit.sources[0]
    assert isinstance(builtins, BuiltinTools)
    session = builtins.session

    with pytest.raises(OSError, match="a would not close"):
        await toolkit.aclose()

    assert closed == ["a", "b"]
    assert session.closed


def test_unknown_builtin_names_are_still_refused():
    """A typo in the switches is an error, not a silently kept tool."""
    with pytest.raises(UsageError, match="bahs"):
        Toolkit.create(builtins={"tools": {"bahs": False}})
