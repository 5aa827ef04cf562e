"""An approving answer that names a digest approves exactly the call it was shown.

An approval request of ``require_approval`` (and of the acting built-ins) carries
``data["digest"]``; an answer that echoes another digest is refused with
``AnswerMismatchError``, nothing is taken, the run still waits and the tool does not run.
Checked on the three paths an answer takes: an ``Inbox`` (a run parked in memory), a run
store (``DurableHost.answer`` on a halted run, as after a restart on another worker), and
``serve`` (409, and the page's own answer, which echoes the digest, goes through).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from tests.test_host import LIMIT, model, until
from tests.test_serve_api import TOKEN, closing, events, post, serving
from toolnexus_async import (
    Answer,
    AnswerMismatchError,
    Hooks,
    Inbox,
    LlmClient,
    Request,
    RunResult,
    Toolkit,
    ToolResult,
    define_tool,
    require_approval,
)
from toolnexus_async._engine.hooks import call_digest
from toolnexus_async.durable import DurableHost, MemoryRunStore
from toolnexus_async.serve import create_app

WRONG = "sha256:" + "0" * 64


class Pay:
    """A tool that pays at once: the ``require_approval`` gate is what asks."""

    def __init__(self) -> None:
        self.paid: list[str] = []

        @define_tool(name="pay")
        async def pay() -> ToolResult:
            """Pay."""
            self.paid.append("paid")
            return ToolResult.ok("paid")

        self.toolkit = Toolkit.create(builtins=False, extra_tools=[pay])


def gated(pay: Pay, wait_for: Inbox | None = None, **kw: Any) -> LlmClient:
    """A client whose ``pay`` tool runs only once ``require_approval`` is answered."""
    gate = Hooks(before_tool=require_approval(["pay"]))
    return LlmClient.in_process(model, hooks=gate, wait_for=wait_for, **kw)


async def test_the_digest_is_of_the_tool_and_its_canonical_arguments():
    a = call_digest("pay", {"amount": 5, "to": "Ann"})
    assert a == call_digest("pay", {"to": "Ann", "amount": 5})  # key order does not matter
    assert a != call_digest("pay", {"amount": 50, "to": "Ann"})
    assert a != call_digest("refund", {"amount": 5, "to": "Ann"})
    assert a.startswith("sha256:") and len(a) == 7 + 64


@asynccontextmanager
async def parked(
    toolkit: Toolkit, make_client: Callable[[Inbox], LlmClient]
) -> AsyncIterator[tuple[Inbox, Request, list[RunResult]]]:
    """A run of "pay" parked on one request in an Inbox: ``(inbox, request, results)``;
    on the way out, waits until the run ended (its result in ``results``)."""
    inbox = Inbox()
    results: list[RunResult] = []
    with anyio.fail_after(LIMIT):
        async with make_client(inbox) as client, anyio.create_task_group() as tg:

            async def run() -> None:
                results.append(await client.run("pay", toolkit))

            tg.start_soon(run)
            await until(lambda: len(inbox) == 1)
            (request,) = inbox.pending()
            yield inbox, request, results
            await until(lambda: results)


async def test_a_parked_run_refuses_an_answer_for_another_call_and_still_waits():
    pay = Pay()
    async with parked(pay.toolkit, functools.partial(gated, pay)) as (
        inbox,
        request,
        results,
    ):
        assert request.data is not None
        digest = request.data["digest"]
        assert digest == call_digest("pay", request.data["arguments"])
        with pytest.raises(AnswerMismatchError, match="not what would run"):
            await inbox.answer(Answer(request.id, True, data={"digest": WRONG}))
        assert inbox.pending() == [request] and pay.paid == []  # nothing was taken
        await inbox.answer(Answer(request.id, True, data={"digest": digest}))
    assert results[0].text == "result: paid" and len(pay.paid) == 1


async def test_a_stored_run_refuses_an_answer_for_another_call_and_takes_nothing():
    pay = Pay()
    results: list[RunResult] = []
    with anyio.fail_after(LIMIT):
        async with (
            MemoryRunStore() as store,
            gated(pay) as client,
            DurableHost(client, pay.toolkit, store, on_result=results.append, sweep=0.02) as host,
        ):
            halted = await host.run("pay")  # no wait_for: it halts into the store
            assert halted.pending is not None and halted.pending.data is not None
            request, digest = halted.pending, halted.pending.data["digest"]
            with pytest.raises(AnswerMismatchError):
                await host.answer(Answer(request.id, True, data={"digest": WRONG}))
            assert [r.id for r in await store.requests()] == [request.id]  # still waiting
            await host.answer(Answer(request.id, True, data={"digest": digest}))
            await until(lambda: results)
    assert results[0].text == "result: paid" and len(pay.paid) == 1


async def test_an_answer_naming_no_digest_is_taken_as_before():
    pay = Pay()
    async with parked(pay.toolkit, functools.partial(gated, pay)) as (inbox, request, _):
        await inbox.answer(Answer(request.id, True))
    assert len(pay.paid) == 1


@asynccontextmanager
async def served(
    toolkit: Toolkit, make_client: Callable[[Inbox], LlmClient]
) -> AsyncIterator[tuple[Any, Any, str, dict[str, Any]]]:
    """serve with a run of "pay" parked on one request: ``(http, stream, run id, the
    request as listed)``."""
    app = closing(
        create_app(
            make_client=make_client, toolkit=toolkit, store=(store := MemoryRunStore()), token=TOKEN
        ),
        store,
    )
    with anyio.fail_after(LIMIT):
        async with serving(app) as http, events(http) as stream:
            status, started = await post(http, "/runs", {"prompt": "pay"})
            assert status == 202
            pending = (await stream.until("pending", run_id=started["id"]))["request"]
            yield http, stream, started["id"], pending


async def test_serve_answers_409_to_an_approval_of_another_call():
    """Over HTTP: the request lists its digest; an answer naming another is 409 and the
    run still waits; the answer the page sends (the digest it showed) goes through."""
    pay = Pay()
    async with served(pay.toolkit, functools.partial(gated, pay)) as (http, stream, run, pending):
        digest = pending["data"]["digest"]
        path = f"/requests/{pending['id']}/answer"
        status, body = await post(http, path, {"ok": True, "data": {"digest": WRONG}})
        assert status == 409 and "not what would run" in body["error"]
        assert pay.paid == []
        assert await post(http, path, {"ok": True, "data": {"digest": digest}}) == (
            200,
            {"id": pending["id"], "ok": True},
        )
        await stream.until("done", run_id=run)
    assert pay.paid == ["paid"]


async def test_resuming_a_halted_run_refuses_an_answer_for_another_call():
    """``client.resume`` of a run halted on the gate (kept by the caller, not a store)."""
    pay = Pay()
    async with gated(pay) as client:
        halted = await client.run("pay", pay.toolkit)
        assert halted.pending is not None and halted.pending.data is not None
        request, digest = halted.pending, halted.pending.data["digest"]
        with pytest.raises(AnswerMismatchError):
            await client.resume(
                halted, pay.toolkit, answers=Answer(request.id, True, data={"digest": WRONG})
            )
        assert pay.paid == []
        done = await client.resume(
            halted, pay.toolkit, answers=Answer(request.id, True, data={"digest": digest})
        )
    assert done.text == "result: paid" and pay.paid == ["paid"]
