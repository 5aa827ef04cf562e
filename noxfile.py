"""Developer sessions: ``nox -s tests``, ``lint``, ``typecheck``, ``bench``, ``bench-all``,
``bench-peers`` and ``plots``.

The supported Pythons come from the pyproject classifiers, so there is one list to keep.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from pathlib import Path

import nox

nox.options.sessions = ["tests", "lint", "typecheck"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_external_run = True

PYPROJECT = Path(__file__).with_name("pyproject.toml").read_text()
PYTHONS = re.findall(r"Programming Language :: Python :: (3\.\d+)", PYPROJECT)


def _find_pyenv_pythons() -> None:
    """Put pyenv's interpreters of PYTHONS on PATH when ``python3.X`` does not run as is.

    pyenv's shims answer ``python3.12`` only for the versions selected with ``pyenv global``
    or ``pyenv local``; nox would then skip (or fail) the other versions of ``tests-all``
    and ``bench-all`` although they are installed under ``$PYENV_ROOT/versions``.
    """
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    for python in PYTHONS:
        name = f"python{python}"
        found = shutil.which(name)
        if found is not None:
            check = subprocess.run([found, "-c", ""], capture_output=True, check=False)
            if check.returncode == 0:
                continue
        for bin_dir in sorted(glob.glob(os.path.join(root, "versions", f"{python}.*", "bin"))):
            if os.access(os.path.join(bin_dir, name), os.X_OK):
                os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
                break


_find_pyenv_pythons()


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
    "durable_cost": "benchmarks/durable_cost.py",  # PostgreSQL / SQLite per run, side by side
    "hostile": "benchmarks/hostile.py",  # the loop's longest stall under hostile input
    "serve_page": "benchmarks/serve_page.py",  # the page in Chromium, 1,000 requests waiting
}
# Run only when named: ten minutes or more with their defaults.
BY_NAME = {
    "gc_soak": "benchmarks/gc_soak.py",  # memory over time, freeze_gc off and on
    "instructions": "benchmarks/instructions.py",  # under callgrind (valgrind): minutes
}


@nox.session
def bench(session: nox.Session) -> None:
    """The benchmarks; figures are ratios against a floor measured in the same run.

    ``nox -s bench`` runs every benchmark with its defaults; ``nox -s bench -- --quick``
    passes the arguments to each (``--quick`` and ``--help`` are common to all);
    ``nox -s bench -- park --runs 20000`` runs only the named one, with its own flags
    (``overhead``, ``park``, ``serve_load``, ``workers``, ``hostile`` or ``serve_page``;
    ``workers`` and ``park --store postgres`` need the PostgreSQL server binaries, as the
    tests do; ``serve_page`` needs Debian's Chromium, as the page's tests do).
    ``nox -s bench -- gc_soak`` runs the memory soak, and ``nox -s bench -- instructions``
    the instruction count under callgrind; these two only run when named.
    """
    session.install("-e", ".[dev]")
    args = list(session.posargs)
    named = {**BENCHMARKS, **BY_NAME}
    if args and args[0] in named:
        session.run("python", named[args[0]], *args[1:])
        return
    for script in BENCHMARKS.values():
        session.run("python", script, *args)


@nox.session(python=PYTHONS, name="bench-all")
def bench_all(session: nox.Session) -> None:
    """``bench`` on every supported Python that is installed (posargs as for ``bench``).

    ``nox -s bench-all -- overhead --quick`` runs only the overhead benchmark on each.
    """
    bench(session)


PEERS = ("pydantic_ai", "openai_agents", "langgraph", "toolnexus")


@nox.session(name="bench-peers")
def bench_peers(session: nox.Session) -> None:
    """toolnexus_async beside pydantic-ai, the OpenAI Agents SDK, LangGraph and upstream
    toolnexus, each in a virtual environment of its own with the versions pinned in
    ``benchmarks/peers/requirements-<peer>.txt`` (created under ``.nox/peers/``).

    The posargs go to ``benchmarks/peers/run.py`` (``--quick``, ``--only``, ``--help``); its
    results land in ``benchmarks/results/``, and ``nox -s plots`` draws them.
    """
    session.install("-e", ".[dev]")
    venvs = Path(".nox", "peers")
    for peer in PEERS:
        venv = venvs / peer
        python = venv / "bin" / "python"
        if not python.exists():
            session.run("python", "-m", "venv", str(venv))
        requirements = Path("benchmarks", "peers", f"requirements-{peer}.txt")
        session.run(
            str(python), "-m", "pip", "install", "-q", "-r", str(requirements), external=True
        )
    session.run("python", "benchmarks/peers/run.py", "--venvs", str(venvs), *session.posargs)


@nox.session
def plots(session: nox.Session) -> None:
    """Draw docs/img/peers-*.png from the newest ``benchmarks/results/peers-*.json``
    (``nox -s plots -- FILE`` draws another)."""
    session.install("matplotlib==3.11.2")
    session.run("python", "benchmarks/peers/plots.py", *session.posargs)
