"""benchmarks/peers/ is run by other interpreters (nox -s bench-peers): here, that its
files compile and that its environments are pinned (no test imports the peers' runners),
and that the runners of the project's own environment park and wake (park_rate.py)."""

from __future__ import annotations

import json
import subprocess
import sys
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


def test_park_rate_runs_the_project_runners(tmp_path: Path) -> None:
    """park_rate.py with --features, briefly: the floor, the package and the features
    runner each park and wake every run (the harness checks each final text), so that a
    change to the package's internals that run_features.py calls cannot break it unseen."""
    out = tmp_path / "park-rate.json"
    argv = [sys.executable, str(PEERS / "park_rate.py"), "--parked", "30", "--rounds", "1"]
    argv += ["--batch", "10", "--features", "--out", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert sorted(row["peer"] for row in rows) == ["features", "floor", "toolnexus_async"]
    for row in rows:
        assert row["parked"] == 30
        assert row["parks_per_s"] > 0 and row["wakes_per_s"] > 0
