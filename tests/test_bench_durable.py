"""benchmarks/durable_cost.py, briefly: its cross-worker mode takes each answer on a second
host and still brings every run to its checked end, so that the script (which reads the
store's channel naming, an internal) cannot rot between runs of ``nox -s bench``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.pg import require_server_binaries

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def test_durable_cost_answers_on_the_holder_and_on_another_worker() -> None:
    require_server_binaries()  # the script starts a throwaway cluster of its own
    argv = [sys.executable, "durable_cost.py", "--quick", "--listeners", "2"]
    argv += ["--listen-runs", "4", "--answer-elsewhere"]
    # Non-zero if a run ends with the wrong text, or an answer was not the other worker's.
    done = subprocess.run(argv, cwd=BENCH, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    rounds = re.findall(
        r"K = +2, answered on (the holder|another worker): PostgreSQL .*"
        r"notifications per idle listener per run ([\d.]+)",
        done.stdout,
    )
    assert sorted(place for place, _ in rounds) == ["another worker", "the holder"]
    # Routed: the idle workers hear nothing, wherever the answer was taken.
    assert [heard for _, heard in rounds] == ["0.000", "0.000"]
