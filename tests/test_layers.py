"""The package's layers hold, read from the source with ``ast`` (no import needed):

- **The pure core** (messages, wire data, results, the run loop, the suspension rule, the
  codecs, retries, validation) imports nothing above it and no event loop or I/O library:
  it is tested with plain calls.
- **The fronts**: only serve (and the CLI) imports ``serve``; only the fronts above the
  engine (serve and the CLI) import ``durable``: the engine and the package root never do.
- **No import cycles**, counting imports made inside functions (not those only for type
  checkers).
- **No package reaches into another's private names**: a private name (one leading
  underscore, not a dunder) belongs to the package that defines it; ``durable/`` drives
  runs through ``client.engine``, not ``client._execute``.

Each rule has a test on the real tree and one that shows the check catches a breach.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "toolnexus_async"


PACKAGE = "toolnexus_async"
# The layers of the runtime, lowest first; each may import only itself and those below.
LAYERS = (f"{PACKAGE}._core", f"{PACKAGE}._io", f"{PACKAGE}._engine")
CORE = {LAYERS[0]}
# Imports that break a layer today, each with the work that removes it.
KNOWN: set[str] = {
    # The toolkit still assembles its built-in and MCP sources (issue 36: tool sources).
    f"{PACKAGE}._engine.toolkit ({PACKAGE}._engine) imports {PACKAGE}.{name}, outside its layers"
    for name in (
        "mcp",
        "mcp._connect",
        "mcp._oauth",
        "mcp._tool",
        "tools._session",
        "tools.builtin",
    )
}
# What the pure core may not import: an event loop, a network or a database.
IO = {"asyncio", "anyio", "aiohttp", "asyncpg", "sqlite3", "mcp", "socket", "subprocess"}
# Who may import these packages: their own modules and the fronts above them.
FRONTS = {
    f"{PACKAGE}.serve": {f"{PACKAGE}.serve", f"{PACKAGE}._cli"},
    f"{PACKAGE}.durable": {f"{PACKAGE}.durable", f"{PACKAGE}.serve", f"{PACKAGE}._cli"},
}


def _module_name(path: Path) -> str:
    parts = list(path.with_suffix("").relative_to(ROOT.parent).parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _typing_only(tree: ast.Module) -> set[int]:
    """The ids of the nodes under ``if TYPE_CHECKING:`` (never imported at run time)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(inner) for inner in ast.walk(node))
    return skipped


def import_graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Per module of the package: the package's modules it imports (at its top or inside
    a function) and the top-level names of the other libraries it imports."""
    modules = {_module_name(path): path for path in ROOT.rglob("*.py")}
    inner: dict[str, set[str]] = {}
    outer: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skipped = _typing_only(tree)
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        libraries: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if _in(alias.name, PACKAGE):
                        found.add(alias.name)
                    else:
                        libraries.add(alias.name.partition(".")[0])
            elif isinstance(node, ast.ImportFrom):
                if node.level == 0 and not _in(node.module or "", PACKAGE):
                    libraries.add((node.module or "").partition(".")[0])
                    continue
                base = here.split(".")
                base = base[: len(base) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                if not node.level:
                    target = node.module or ""
                submodules = [f"{target}.{a.name}" for a in node.names]
                submodules = [m for m in submodules if m in modules]
                found.update(submodules)
                if len(submodules) < len(node.names) and target in modules:
                    found.add(target)
        inner[name] = found - {name}
        outer[name] = libraries
    return inner, outer


def layer_breaches(inner: dict[str, set[str]], outer: dict[str, set[str]]) -> list[str]:
    """Each import that crosses a layer the wrong way (see the module's docstring)."""
    found = []
    for module, imported in sorted(inner.items()):
        core = any(_in(module, c) for c in CORE)
        level = next((i for i, layer in enumerate(LAYERS) if _in(module, layer)), None)
        for target in sorted(imported):
            if level is not None and not any(_in(target, layer) for layer in LAYERS[: level + 1]):
                found.append(f"{module} ({LAYERS[level]}) imports {target}, outside its layers")
            for front, allowed in FRONTS.items():
                if _in(target, front) and not any(
                    module == a or (_in(module, a) and a != PACKAGE) for a in allowed
                ):
                    found.append(f"{module} imports {target}, a front above it")
        if core:
            found.extend(
                f"{module} (the pure core) imports {lib}" for lib in sorted(outer[module] & IO)
            )
    return found


def cycles(inner: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``inner`` (its strongly connected parts of more than one)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan's algorithm
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in inner.get(module, ()):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            part = []
            while True:
                top = stack.pop()
                part.append(top)
                if top == module:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for module in sorted(inner):
        if module not in index:
            visit(module)
    return found


def test_the_layers_hold() -> None:
    assert sorted(set(layer_breaches(*import_graph())) - KNOWN) == []


def test_there_is_no_import_cycle() -> None:
    inner, _ = import_graph()
    assert cycles(inner) == []


def test_the_checks_see_a_breach() -> None:
    """A lower layer importing a higher one, the core importing an event loop, and a
    cycle are each reported."""
    inner, outer = import_graph()
    inner = {module: set(targets) for module, targets in inner.items()}
    outer = {module: set(libraries) for module, libraries in outer.items()}
    loop, engine, transport = (
        f"{PACKAGE}._core.loop",
        f"{PACKAGE}._engine.engine",
        f"{PACKAGE}._io.transport",
    )
    inner[loop].add(engine)
    inner[transport].add(engine)
    inner[engine].add(f"{PACKAGE}.serve._app")
    outer[f"{PACKAGE}._core.wire"].add("asyncio")
    breaches = layer_breaches(inner, outer)
    assert f"{loop} ({PACKAGE}._core) imports {engine}, outside its layers" in breaches
    assert f"{transport} ({PACKAGE}._io) imports {engine}, outside its layers" in breaches
    assert f"{engine} imports {PACKAGE}.serve._app, a front above it" in breaches
    assert f"{PACKAGE}._core.wire (the pure core) imports asyncio" in breaches
    assert any(loop in part for part in cycles(inner))


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _package(path: Path) -> str:
    return ".".join(path.parent.relative_to(ROOT.parent).parts)


def _modules() -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text(encoding="utf-8"))) for p in sorted(ROOT.rglob("*.py"))]


def _defined(tree: ast.Module) -> set[str]:
    """Private names a module defines: functions, classes, attributes it assigns
    (``self._x = ...``, class-level ``_x = ...``) and the strings of its ``__slots__``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)  # __slots__ entries, and harmlessly any string
    return {name for name in names if _private(name)}


def _reaches(tree: ast.Module) -> list[tuple[int, str]]:
    """Private names a module uses on something else: ``x._name`` where ``x`` is not
    ``self``/``cls``, and ``from module import _name``."""
    used: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and _private(node.attr)
            and not (isinstance(node.value, ast.Name) and node.value.id in {"self", "cls"})
        ):
            used.append((node.lineno, node.attr))
        elif isinstance(node, ast.ImportFrom):
            used.extend((node.lineno, a.name) for a in node.names if _private(a.name))
    return used


def cross_package_uses() -> list[str]:
    """Each use of a private name that the using module's package does not define, but
    another package does."""
    modules = _modules()
    by_package: dict[str, set[str]] = defaultdict(set)
    for path, tree in modules:
        by_package[_package(path)] |= _defined(tree)
    found = []
    for path, tree in modules:
        own = by_package[_package(path)]
        for line, name in _reaches(tree):
            if name in own:
                continue
            owners = sorted(p for p, names in by_package.items() if name in names)
            if owners:
                where = path.relative_to(ROOT.parent)
                found.append(f"{where}:{line} uses {name}, private to {', '.join(owners)}")
    return found


def test_no_package_uses_another_packages_private_names() -> None:
    assert cross_package_uses() == []


@pytest.mark.parametrize(
    ("source", "reaches"),
    [
        ("def f(client):\n    return client._execute()\n", True),
        ("def f(self):\n    return self._execute()\n", False),
        ("from toolnexus_async._engine.client import _given\n", True),
    ],
)
def test_the_check_sees_a_reach(source: str, reaches: bool) -> None:
    """The scan itself: an attribute or an import of a private name on something else
    counts; one on ``self`` does not."""
    names = [name for _, name in _reaches(ast.parse(source))]
    assert bool(names) is reaches
