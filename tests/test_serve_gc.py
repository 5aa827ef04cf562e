"""``create_app(freeze_gc=True)`` (what ``serve`` runs unless ``--no-freeze-gc``; test_cli
checks the flag): a GcFreezer while the app runs.

While a run is parked, what survives the young collections is frozen (no full collection
walks it); once no run is parked, everything is handed back; at shutdown the freezer is
gone (no callback left in ``gc.callbacks``). Without the option the app leaves the
collector alone.
"""

from __future__ import annotations

import gc
from typing import Any

import anyio
import pytest

from tests.test_serve_api import LIMIT, answer_demo_from, demo_app, events, post, serving
from toolnexus_async.suspend import GcFreezer


def freezers() -> list[Any]:
    return [cb for cb in gc.callbacks if isinstance(getattr(cb, "__self__", None), GcFreezer)]


@pytest.mark.parametrize("freeze_gc", [True, False])
async def test_the_app_freezes_while_runs_are_parked_only_if_asked(freeze_gc: bool) -> None:
    gc.collect()
    before = gc.get_freeze_count()  # what the interpreter keeps frozen itself (3.12)
    with anyio.fail_after(LIMIT):
        async with serving(demo_app(freeze_gc=freeze_gc)) as http, events(http) as stream:
            assert len(freezers()) == (1 if freeze_gc else 0)
            status, started = await post(http, "/runs", {"prompt": "Dinner for my team"})
            assert status == 202
            login = await stream.until("pending", run_id=started["id"])
            gc.collect(1)  # what the collector does by itself as objects pile up
            frozen = gc.get_freeze_count()
            assert (frozen > before) if freeze_gc else (frozen == before)

            done = await answer_demo_from(http, stream, started["id"], login)
            assert done["status"] == "done"
            gc.collect(1)  # no run is parked now: everything goes back to the collector
            assert gc.get_freeze_count() <= before
    assert freezers() == []
    assert gc.get_freeze_count() <= before
