"""A run another worker took over is shown as the store has it, never as this worker's error.

The book of a worker that lost a run's lease (``LeaseLostError`` ended its drive here)
marks the run ``elsewhere`` and, when it is shown, reads its status from the store: still
running there, waiting for answers, or ended (with its text) once the other worker ended it.
"""

from __future__ import annotations

import time

import attrs

from tests.test_host import Pay, model
from toolnexus_async import LeaseLostError, LlmClient
from toolnexus_async.durable import MemoryRunStore
from toolnexus_async.serve._events import EventBus
from toolnexus_async.serve._runs import RunBook


async def test_a_run_taken_over_by_another_worker_shows_the_stores_status():
    pay = Pay()
    async with MemoryRunStore() as store, LlmClient.in_process(model) as client:
        halted = await client.run("pay", pay.toolkit)
        assert halted.run_id is not None and halted.pending is not None
        run_id = halted.run_id
        await store.save(halted)
        now = time.time()
        assert await store.claim(run_id, "here", now + 60, now) is not None
        book = RunBook(EventBus())
        record = book.start(run_id, "pay")
        book.parked(halted.pending, run_id)

        # This worker's drive ended: another worker took the run over.
        book.failed(run_id, LeaseLostError(f"run {run_id!r} is held by 'there'"))
        assert record.status == "running" and record.error is None
        assert book.run_of(halted.pending.id) is None  # its request is the other's to show

        await store.release(run_id, "here")
        assert await store.claim(run_id, "there", now + 60, now) is not None
        await store.halt(run_id, "there")
        await book.refresh(store, [record])
        assert record.status == "pending"  # halted there, waiting for its answer

        assert await store.claim(run_id, "there", now + 60, now) is not None
        await store.finish(attrs.evolve(halted, status="done", text="paid"), "there")
        await book.refresh(store, [record])
        assert (record.status, record.text) == ("done", "paid")
        assert [r.status for r in book.newest_first()] == ["done"]
