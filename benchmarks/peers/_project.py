"""The project's side of the peers benchmark: what our client's and the floor's runners share.

Both run in the project's own environment and take the scenario, the tools, the floor's
session and schema from ``benchmarks/overhead.py`` itself, so the figures here are of the
same code that ``nox -s bench`` measures.
"""

from __future__ import annotations

import sys
from pathlib import Path

# The runners are scripts in benchmarks/peers/; overhead.py, _mock.py and _common.py are one up.
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import _mock
import overhead

__all__ = ["_mock", "overhead"]
