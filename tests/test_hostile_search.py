"""Issue 42: no glob or regular expression a model sends can stall the event loop.

Each hostile pattern below took seconds to minutes with Python's ``re`` (which holds the GIL,
so the worker thread stalled the loop too). Every test runs the real tool over real files
in ``tmp_path`` and asserts two things: the call ends within a generous bound, and a
heartbeat task on the same loop kept beating (its largest gap is checked loosely, to catch
a stall, not to time anything).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import pytest

from toolnexus_async import ToolResult
from toolnexus_async.tools.builtin._workspace import Workspace
from toolnexus_async.tools.builtin.search import GlobMatcher, GlobTool, GrepTool

BOUND = 5.0  # seconds for one call; the old matcher took 2.5 s to 90 s on these
STALL = 0.5  # a larger gap between beats means the loop was blocked


async def beating(call: Callable[[], Awaitable[ToolResult]]) -> tuple[ToolResult, float]:
    """The call's result and the largest gap between heartbeats while it ran."""
    last = anyio.current_time()
    gaps: list[float] = []

    async def beat() -> None:
        nonlocal last
        while True:
            await anyio.sleep(0.01)
            now = anyio.current_time()
            gaps.append(now - last)
            last = now

    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as group:
            group.start_soon(beat)
            result = await call()
            group.cancel_scope.cancel()
    gaps.append(anyio.current_time() - last)
    return result, max(gaps)


def deep(root: Path, segment: str, depth: int, name: str) -> Path:
    """A file ``name`` under ``depth`` folders called ``segment``."""
    folder = root.joinpath(*[segment] * depth)
    folder.mkdir(parents=True)
    (folder / name).write_text("x\n")
    return folder / name


# --- glob -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "make"),
    [
        # Nested wildcard groups: 16.9 s for a 40-character name with re.
        ("*a*a*a*a*a*a*a*a*a*a*b", lambda root: (root / ("a" * 40)).write_text("")),
        # '**/' eight times against a 30-deep path: thousands of times a linear matcher.
        ("**/" * 8 + "x", lambda root: deep(root, "d", 30, "f")),
        # wcmatch's globstar backtracks here: 85 s at 60 deep with six of them.
        ("**/" + "a/**/" * 6 + "b", lambda root: deep(root, "a", 60, "c")),
        # Alternatives are not expanded: 2**200 spellings cost no more than one.
        ("{a,b}" * 200 + "c", lambda root: (root / ("a" * 200)).write_text("")),
        ("{" * 3000 + "a" + "}" * 3000 + "b", lambda root: (root / "ab").write_text("")),
        ("*{a,*a}*{a,*a}*{a,*a}*{a,*a}*b", lambda root: (root / ("a" * 200)).write_text("")),
    ],
    ids=["stars", "globstars", "globstar-segments", "braces", "nested-braces", "star-braces"],
)
async def test_hostile_glob_keeps_the_loop_beating(
    tmp_path: Path, pattern: str, make: Callable[[Path], object]
) -> None:
    """A glob built to backtrack finishes within the bound and the loop keeps beating."""
    make(tmp_path)
    tool = GlobTool(Workspace(tmp_path, confine=True))
    result, gap = await beating(lambda: tool.execute({"pattern": pattern}))
    assert not result.is_error, result.output
    assert gap < STALL, f"the event loop stalled {gap:.2f} s"
    if pattern.endswith("ab") or pattern.startswith("{" * 10):
        assert result.output == "ab"


def test_glob_braces_nest_to_any_depth() -> None:
    """Deep nesting is translated in one pass: no recursion limit, same meaning."""
    matcher = GlobMatcher("{" * 3000 + "a,b" + "}" * 3000 + ".txt")
    assert matcher.match("a.txt") and matcher.match("b.txt")
    assert not matcher.match("c.txt")


@pytest.mark.parametrize(
    ("pattern", "yes", "no"),
    [
        ("[!a]", ["b"], ["a", "/"]),  # a class never matches the separator
        ("x/[^a]", ["x/b"], ["x//"]),
        ("[a-c]?", ["bz"], ["dz"]),
        ("[]]", ["]"], ["a"]),
        ("[.+]x", [".x", "+x"], ["ax"]),
        ("{a,[}]}x", ["ax", "}x"], ["bx"]),  # a brace inside a class does not close one
        ("{a,b", ["{a,b"], ["a"]),  # unclosed: literal
        ("a}b,c", ["a}b,c"], ["a"]),
        ("\\*", ["\\x"], ["x"]),  # a backslash is a character, not an escape
    ],
)
def test_glob_matcher_edges(pattern: str, yes: list[str], no: list[str]) -> None:
    """Classes, braces and literals at their edges."""
    matcher = GlobMatcher(pattern)
    for path in yes:
        assert matcher.match(path), (pattern, path)
    for path in no:
        assert not matcher.match(path), (pattern, path)


async def test_glob_with_a_bad_class_range_is_an_error_result(tmp_path: Path) -> None:
    """'[z-a]' cannot match anything; the tool says so instead of raising."""
    result = await GlobTool(Workspace(tmp_path)).execute({"pattern": "[z-a].txt"})
    assert result.is_error
    assert result.output.startswith("glob: invalid glob '[z-a].txt'")


async def test_glob_matches_a_name_that_is_not_utf8(tmp_path: Path) -> None:
    """A name with a byte that is not UTF-8 still counts as characters for '*' and '?'."""
    (tmp_path / "caf\udce9.txt").write_text("")  # the file system holds the byte 0xe9
    tool = GlobTool(Workspace(tmp_path))
    for pattern in ("*.txt", "caf?.txt", "caf[!a].txt"):
        result = await tool.execute({"pattern": pattern})
        assert result.metadata == {"count": 1, "truncated": False}, pattern


# --- grep -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "line"),
    [
        (r"(a+)+$", "a" * 26 + "b"),
        (r"(x+x+)+y", "x" * 27),
        (r"(a|aa)+$", "a" * 37 + "b"),
        (r"^(\w+\s?)*$", "word " * 9 + "!"),
    ],
)
async def test_hostile_regex_keeps_the_loop_beating(
    tmp_path: Path, pattern: str, line: str
) -> None:
    """A regex built to backtrack finishes within the bound and the loop keeps beating."""
    (tmp_path / "text.txt").write_text(f"{line}\n" * 3 + "aaaa xxy\n")
    tool = GrepTool(Workspace(tmp_path))
    result, gap = await beating(lambda: tool.execute({"pattern": pattern}))
    assert not result.is_error, result.output
    assert gap < STALL, f"the event loop stalled {gap:.2f} s"
    assert result.metadata is not None and result.metadata["matches"] <= 1


async def test_hostile_regex_over_a_large_file(tmp_path: Path) -> None:
    """Linear in the text: 8 MB of near-misses for '(a|aa)+$' take well under the bound."""
    (tmp_path / "big.txt").write_bytes((b"a" * 4000 + b"b\n") * 2000)
    tool = GrepTool(Workspace(tmp_path))
    result, gap = await beating(lambda: tool.execute({"pattern": r"(a|aa)+$"}))
    assert result.output == "no matches for '(a|aa)+$'"
    assert gap < STALL, f"the event loop stalled {gap:.2f} s"


@pytest.mark.parametrize(
    ("pattern", "construct"),
    [
        (r"(a)\1", "invalid escape sequence: \\1"),
        (r"foo(?=bar)", "invalid perl operator: (?="),
        (r"(?<!a)b", "invalid perl operator: (?<!"),
        (r"(?>a+)b", "invalid perl operator: (?>"),
        (r"a*+", "bad repetition operator: *+"),
    ],
)
async def test_unsupported_constructs_are_refused_by_name(
    tmp_path: Path, pattern: str, construct: str
) -> None:
    """A pattern RE2 cannot run is an error result naming the construct and the rule."""
    (tmp_path / "a.txt").write_text("foobar\n")
    result = await GrepTool(Workspace(tmp_path)).execute({"pattern": pattern})
    assert result.is_error
    assert result.output.startswith(
        f"grep: the regular expression {pattern!r} uses a construct RE2 does not support "
        f"({construct}); grep uses RE2, which runs in time linear in the text"
    )
    assert "backreferences" in result.output and "lookahead" in result.output


async def test_grep_searches_line_by_line(tmp_path: Path) -> None:
    """Matches never span lines; ^ $ \\A \\Z \\z anchor at each line; CRLF is one line end."""
    (tmp_path / "a.txt").write_bytes(b"one\r\ntwo\r\n\r\nthree")
    tool = GrepTool(Workspace(tmp_path))

    async def lines(pattern: str) -> list[str]:
        result = await tool.execute({"pattern": pattern})
        assert not result.is_error, result.output
        return [] if result.metadata == {"matches": 0} else result.output.splitlines()

    assert await lines("e$") == ["a.txt:1:one", "a.txt:4:three"]
    assert await lines(r"\At") == ["a.txt:2:two", "a.txt:4:three"]
    assert await lines(r"o\Z") == ["a.txt:2:two"]
    assert await lines(r"e\z") == ["a.txt:1:one", "a.txt:4:three"]
    assert await lines("^$") == ["a.txt:3:"]
    assert await lines(r"one\s+two") == []
    assert await lines(r"o[^x]*t") == []
    assert await lines("^") == ["a.txt:1:one", "a.txt:2:two", "a.txt:3:", "a.txt:4:three"]


async def test_grep_line_numbers_across_blocks(tmp_path: Path) -> None:
    """Files are searched in blocks of lines; numbers and long lines survive the seams."""
    filler = b"." * 99 + b"\n"
    long_line = b"start " + b"y" * 3_000_000 + b" end\n"
    data = filler * 20_000 + b"needle one\n" + long_line + filler * 5 + b"needle two"
    (tmp_path / "big.txt").write_bytes(data)
    tool = GrepTool(Workspace(tmp_path))
    found = await tool.execute({"pattern": "needle"})
    assert found.output.splitlines() == ["big.txt:20001:needle one", "big.txt:20008:needle two"]
    ends = await tool.execute({"pattern": "y end$"})
    assert ends.output == "big.txt:20002:start " + "y" * 494


async def test_grep_invalid_utf8_is_a_replacement_character(tmp_path: Path) -> None:
    """A byte that is not UTF-8 is one character (U+FFFD), as on the decoded line before."""
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9 cr\xe8me\n")
    result = await GrepTool(Workspace(tmp_path)).execute({"pattern": "caf. cr.me"})
    assert result.output == "latin1.txt:1:caf\ufffd cr\ufffdme"
