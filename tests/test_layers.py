"""The package's seams hold: no package reaches into another's private names.

A private name (one leading underscore, not a dunder) belongs to the package that defines
it: ``durable/`` drives runs through ``client.engine``, not ``client._execute``; serve
starts a begun run with ``begun.run(...)``, not ``begun._run_with(...)``. Read from the
source with ``ast``, so the check costs no import and sees every module.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "toolnexus_async"


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
        ("from toolnexus_async._client import _given\n", True),
    ],
)
def test_the_check_sees_a_reach(source: str, reaches: bool) -> None:
    """The scan itself: an attribute or an import of a private name on something else
    counts; one on ``self`` does not."""
    names = [name for _, name in _reaches(ast.parse(source))]
    assert bool(names) is reaches
