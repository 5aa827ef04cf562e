"""The public surface: __all__ is honest, names live in toolnexus_async, py.typed ships."""

import __future__

import importlib
import inspect
import types
import typing
from pathlib import Path

import toolnexus_async

# DESIGN §2: the names a user imports. Every one must be exported.
DESIGN_NAMES = {
    "Answer",
    "Request",
    "Tool",
    "ToolContext",
    "ToolResult",
    "Toolkit",
    "LlmClient",
    "RunResult",
    "define_tool",
    "pending_of",
    "ToolnexusError",
    "ProviderError",
    "ProtocolError",
}


def public_namespace() -> set[str]:
    """Names bound in the package that are meant for users: no dunders, no modules.

    ``from __future__ import annotations`` binds ``annotations`` to a compiler directive;
    it is not something the package defines, so it is left out too.
    """
    return {
        name
        for name, value in vars(toolnexus_async).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)
        and not isinstance(value, __future__._Feature)
    }


def test_all_matches_the_public_namespace():
    """Nothing public is missing from __all__, and __all__ names nothing that is not there."""
    exported = set(toolnexus_async.__all__)
    assert exported - public_namespace() == set(), "listed in __all__ but not defined"
    assert public_namespace() - exported == set(), "defined but not listed in __all__"


def test_all_has_no_duplicates():
    """Each name is exported once."""
    assert len(toolnexus_async.__all__) == len(set(toolnexus_async.__all__))


def test_design_names_are_exported():
    """Every name of the DESIGN §2 import line is in __all__."""
    assert DESIGN_NAMES <= set(toolnexus_async.__all__)


def test_design_import_line_works():
    """The DESIGN §2 import line runs and gives the package's own objects."""
    namespace: dict[str, object] = {}
    exec(  # the import line is the thing under test
        "from toolnexus_async import (\n"
        "    Answer, Request, Tool, ToolContext, ToolResult, Toolkit, LlmClient, RunResult,\n"
        "    define_tool, pending_of,\n"
        "    ToolnexusError, ProviderError, ProtocolError,\n"
        ")\n",
        namespace,
    )
    for name in DESIGN_NAMES:
        assert namespace[name] is getattr(toolnexus_async, name)


def test_star_import_gives_exactly_all():
    """from toolnexus_async import * binds exactly the names of __all__."""
    namespace: dict[str, object] = {}
    exec("from toolnexus_async import *", namespace)
    namespace.pop("__builtins__", None)
    assert set(namespace) == set(toolnexus_async.__all__)


def test_error_hierarchy_has_one_base():
    """Every exported exception derives from ToolnexusError."""
    errors = [
        obj
        for name in toolnexus_async.__all__
        if isinstance(obj := getattr(toolnexus_async, name), type)
        and issubclass(obj, BaseException)
    ]
    assert {e.__name__ for e in errors} >= {"ToolnexusError", "ProviderError", "ProtocolError"}
    for error in errors:
        if error is toolnexus_async.HaltRun:
            # A signal, not an error: `except ToolnexusError` must not swallow it.
            assert not issubclass(error, toolnexus_async.ToolnexusError)
            continue
        assert issubclass(error, toolnexus_async.ToolnexusError), error
        assert error.__name__.endswith("Error"), f"{error.__name__}: one naming convention"
    assert issubclass(toolnexus_async.ProviderError, toolnexus_async.ToolnexusError)
    assert issubclass(toolnexus_async.ProtocolError, toolnexus_async.ToolnexusError)


def exported_definitions() -> list[tuple[str, object]]:
    """Exported classes and functions (type aliases such as Message are not definitions)."""
    return [
        (name, obj)
        for name in toolnexus_async.__all__
        if inspect.isclass(obj := getattr(toolnexus_async, name)) or inspect.isfunction(obj)
    ]


def test_exported_objects_are_reachable_by_their_reported_name():
    """toolnexus_async.<__qualname__> finds each export again (pickling and docs rely on it)."""
    module = importlib.import_module("toolnexus_async")
    for name, obj in exported_definitions():
        assert getattr(module, obj.__qualname__) is obj, name  # type: ignore[attr-defined]


def test_type_hints_of_exported_classes_resolve():
    """typing.get_type_hints works on every exported class (attrs, cattrs, FastAPI use it)."""
    failures: dict[str, str] = {}
    for name, obj in exported_definitions():
        if not inspect.isclass(obj):
            continue
        try:
            typing.get_type_hints(obj)
        except Exception as exc:
            failures[name] = f"{type(exc).__name__}: {exc}"
    assert failures == {}


def test_version_is_a_string():
    """The package carries a version."""
    assert isinstance(toolnexus_async.__version__, str)
    assert toolnexus_async.__version__


def test_py_typed_marker_ships_with_the_package():
    """py.typed marks the package as typed (PEP 561)."""
    package_dir = Path(toolnexus_async.__file__).parent
    assert (package_dir / "py.typed").is_file()
