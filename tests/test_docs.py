"""The documentation is executable: a doc example that breaks fails the suite.

- Every ```python block of ``docs/*.md`` runs. The blocks of one page run in order in one
  namespace, so a page can build an example up step by step; top-level ``await`` is
  allowed. Blocks fenced ```python-norun are only shown (they talk to a real provider); they
  are compiled, so a typo in them still fails, but never run.
- Every public name (``toolnexus_async.__all__``, and the ``__all__`` of ``.testing``,
  ``.mcp`` and ``.durable``) has a heading in ``docs/reference.md``.
- The ``>>>`` examples in the package's docstrings run as doctests, and every one of them is
  found (a docstring the finder cannot reach would otherwise pass by being skipped).
"""

from __future__ import annotations

import ast
import doctest
import importlib
import inspect
import io
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import toolnexus_async
import toolnexus_async.durable
import toolnexus_async.mcp
import toolnexus_async.testing

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGES = sorted(DOCS.glob("*.md"))
# The pages issue 2 asks for; the suite fails if one goes missing rather than skipping it.
REQUIRED_PAGES = {"index.md", "suspension.md", "tools.md", "reference.md"}

RUN = "python"
SHOW_ONLY = "python-norun"
# Fences that are never Python. Anything else is refused, so that a misspelt ```pyhton
# block cannot slip through unrun.
OTHER_LANGUAGES = {"", "console", "sh", "json", "text"}

FENCE = re.compile(r"^```(?P<lang>[\w-]*)[ \t]*\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)


def fenced_blocks(page: Path) -> list[tuple[str, int, str]]:
    """``(language, first line number of the body, body)`` for every fenced block."""
    text = page.read_text(encoding="utf-8")
    return [
        (m["lang"], text.count("\n", 0, m.start("body")) + 1, m["body"])
        for m in FENCE.finditer(text)
    ]


def compile_block(page: Path, line: int, body: str) -> object:
    # Padding with newlines makes tracebacks point at the line in the .md file.
    return compile(
        "\n" * (line - 1) + body,
        str(page),
        "exec",
        flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT,
        dont_inherit=True,
    )


def test_required_pages_exist():
    """Each page issue 2 names is there (the parametrised tests below cannot notice one missing)."""
    assert REQUIRED_PAGES <= {page.name for page in PAGES}


@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
def test_fences_are_known(page):
    """Every fence is runnable Python, explicitly show-only Python, or not Python at all."""
    languages = {lang for lang, _, _ in fenced_blocks(page)}
    assert set() == languages - {RUN, SHOW_ONLY} - OTHER_LANGUAGES


@pytest.fixture
def page_store(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A page whose examples read ``TOOLNEXUS_STORE`` gets a real PostgreSQL database there
    (tests/pg.py), as a reader would set it."""
    page: Path = request.node.callspec.params["page"]
    if "TOOLNEXUS_STORE" in "".join(b for lang, _, b in fenced_blocks(page) if lang == RUN):
        monkeypatch.setenv("TOOLNEXUS_STORE", str(request.getfixturevalue("pg_dsn")))


@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
async def test_page_examples_run(page, page_store):
    """The ```python blocks of a page run, in order, in one namespace, on this event loop."""
    blocks = fenced_blocks(page)
    runnable = [(line, body) for lang, line, body in blocks if lang == RUN]
    if page.name in REQUIRED_PAGES:
        assert runnable, f"{page.name} has no runnable example"
    for lang, line, body in blocks:
        if lang == SHOW_ONLY:
            compile_block(page, line, body)  # shown, not run: it must still be valid Python
    namespace: dict[str, object] = {"__name__": f"docs_{page.stem}"}
    for line, body in runnable:
        code = compile_block(page, line, body)
        assert inspect.iscode(code)
        outcome = eval(code, namespace)
        if code.co_flags & inspect.CO_COROUTINE:
            await outcome


def test_every_public_name_has_a_reference_heading():
    """Each public name appears, in backticks, in a heading of docs/reference.md."""
    headings = "\n".join(
        line
        for line in (DOCS / "reference.md").read_text(encoding="utf-8").splitlines()
        if line.startswith("#")
    )
    public = [
        *toolnexus_async.__all__,
        *toolnexus_async.testing.__all__,
        *toolnexus_async.mcp.__all__,
        *toolnexus_async.durable.__all__,
    ]
    missing = [name for name in public if f"`{name}`" not in headings]
    assert [] == missing


def test_documented_demo_command_runs():
    """`toolnexus-async demo --yes`, which docs/index.md shows, runs to a done status."""
    done = subprocess.run(
        [sys.executable, "-m", "toolnexus_async", "demo", "--yes"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert 0 == done.returncode, done.stderr
    assert "status: done" in done.stdout
    assert "status: done" in (DOCS / "index.md").read_text(encoding="utf-8")


def package_modules() -> list[object]:
    modules: list[object] = [toolnexus_async]
    for info in pkgutil.walk_packages(toolnexus_async.__path__, "toolnexus_async."):
        if info.name == "toolnexus_async.__main__":
            continue  # importing it runs the command line
        modules.append(importlib.import_module(info.name))
    return modules


def package_doctests() -> list[doctest.DocTest]:
    # Public objects have their __module__ rewritten to the package, so the finder reaches a
    # docstring through the package or through its own module, never both; keying by the
    # docstring keeps one of each all the same.
    # The finder skips the methods of a class whose __module__ is not the module it walks
    # (their globals are the private module's), so each public class is walked on its own
    # too, with the package's namespace.
    finder = doctest.DocTestFinder()
    found: dict[str | None, doctest.DocTest] = {}
    for module in package_modules():
        for test in finder.find(module):
            if test.examples:
                found.setdefault(test.docstring, test)
    for namespace in (toolnexus_async, toolnexus_async.durable):
        names = {**vars(toolnexus_async), **vars(namespace)}
        for name in namespace.__all__:
            value = getattr(namespace, name)
            if inspect.isclass(value):
                tests = finder.find(
                    value, f"{namespace.__name__}.{name}", module=False, globs=names
                )
                for test in tests:
                    if test.examples:
                        found.setdefault(test.docstring, test)
    return sorted(found.values(), key=lambda test: test.name)


DOCTESTS = package_doctests()


def test_doctests_reach_every_example():
    """Each `>>>` line in the package's sources belongs to a doctest that runs below."""
    package_dir = Path(toolnexus_async.__file__).parent
    written = sum(
        line.lstrip().startswith(">>>")
        for source in package_dir.rglob("*.py")
        for line in source.read_text(encoding="utf-8").splitlines()
    )
    assert DOCTESTS, "the package has >>> examples; none were found"
    # Each example opens with exactly one >>> line, so the counts must agree.
    assert written == sum(len(test.examples) for test in DOCTESTS)


@pytest.mark.parametrize("test", DOCTESTS, ids=[test.name for test in DOCTESTS])
def test_package_doctest(test):
    """A docstring's `>>>` examples print what they claim."""
    out = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test, out=out.write)
    assert 0 == runner.failures, out.getvalue()
