"""benchmarks/peers/ is run by other interpreters (nox -s bench-peers): here, only that its
files compile and that its environments are pinned, since no test imports its runners."""

from __future__ import annotations

from pathlib import Path

import pytest

PEERS = Path(__file__).resolve().parent.parent / "benchmarks" / "peers"


@pytest.mark.parametrize("script", sorted(PEERS.glob("*.py")), ids=lambda p: p.name)
def test_runner_compiles(script: Path) -> None:
    compile(script.read_text(), str(script), "exec")


@pytest.mark.parametrize("requirements", sorted(PEERS.glob("requirements-*.txt")), ids=str)
def test_every_requirement_is_pinned(requirements: Path) -> None:
    lines = [line for line in requirements.read_text().splitlines() if not line.startswith("#")]
    assert lines
    unpinned = [line for line in lines if "==" not in line]
    assert not unpinned, f"{requirements.name}: not pinned: {unpinned}"
