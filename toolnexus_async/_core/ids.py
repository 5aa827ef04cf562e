"""Run ids: unique within a process and across processes, without a uuid per run.

Rule of this module: a random prefix drawn once per process, then a counter; cheap enough
for the hot path, and two processes sharing a run store never collide.
"""

from __future__ import annotations

import itertools
import uuid

__all__ = ("new_run_id",)

_RUN_PREFIX = "run_" + uuid.uuid4().hex[:12] + "_"
_run_numbers = itertools.count(1)


def new_run_id() -> str:
    """A fresh run id, e.g. ``run_3f2a9c0d1e4b_17``."""
    return f"{_RUN_PREFIX}{next(_run_numbers)}"
