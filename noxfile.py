"""Developer sessions: ``nox -s tests``, ``lint``, ``typecheck``, ``bench``.

The supported Pythons come from the pyproject classifiers, so there is one list to keep.
"""

from __future__ import annotations

import re
from pathlib import Path

import nox

nox.options.sessions = ["tests", "lint", "typecheck"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_external_run = True

PYPROJECT = Path(__file__).with_name("pyproject.toml").read_text()
PYTHONS = re.findall(r"Programming Language :: Python :: (3\.\d+)", PYPROJECT)


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite, on the interpreter nox runs with (``-p 3.12`` picks another)."""
    session.install("-e", ".[dev]")
    session.run("pytest", *session.posargs)


@nox.session(python=PYTHONS, name="tests-all")
def tests_all(session: nox.Session) -> None:
    """The test suite on every supported Python that is installed."""
    session.install("-e", ".[dev]")
    session.run("pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff: lint and formatting."""
    session.install("-e", ".[dev]")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict over the package, the tests and the benchmarks."""
    session.install("-e", ".[dev]")
    session.run("mypy", "--strict")


BENCHMARKS = {
    "overhead": "benchmarks/overhead.py",
    "park": "benchmarks/park.py",
    "serve_load": "benchmarks/serve_load.py",
    "workers": "benchmarks/workers.py",  # starts a throwaway PostgreSQL cluster of its own
}


@nox.session
def bench(session: nox.Session) -> None:
    """The benchmarks; figures are ratios against a floor measured in the same run.

    ``nox -s bench`` runs every benchmark with its defaults; ``nox -s bench -- --quick``
    passes the arguments to each (``--quick`` and ``--help`` are common to all);
    ``nox -s bench -- park --runs 20000`` runs only the named one, with its own flags
    (``overhead``, ``park``, ``serve_load`` or ``workers``; ``workers`` and
    ``park --store postgres`` need the PostgreSQL server binaries, as the tests do).
    """
    session.install("-e", ".[dev]")
    args = list(session.posargs)
    if args and args[0] in BENCHMARKS:
        session.run("python", BENCHMARKS[args[0]], *args[1:])
        return
    for script in BENCHMARKS.values():
        session.run("python", script, *args)
