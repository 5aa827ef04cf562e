"""Arguments changed on approval, or by a hook, are checked, kept beside the model's, and
taken only where the gate allows it.

``require_approval(..., editable=True)`` lets an approver answer with changed
``data["arguments"]`` (naming the request's digest); the tool runs with them once they pass
its schema, and the call's record keeps both. Any other request refuses such an answer
wherever an answer is taken (an inbox, a store, serve), and a ``wait_for`` resolver that
returns one gets an error result with nothing run. A ``before_tool`` hook's changed
arguments are checked and kept the same way.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.test_answer_digest import parked, served
from tests.test_host import LIMIT, until
from tests.test_serve_api import post
from toolnexus_async import (
    Answer,
    AnswerMismatchError,
    Hooks,
    Inbox,
    LlmClient,
    Message,
    Request,
    RunResult,
    Toolkit,
    ToolResult,
    ToolReturn,
    UsageError,
    define_tool,
    require_approval,
)
from toolnexus_async._engine.hooks import call_digest
from toolnexus_async.durable import DurableHost, SqliteRunStore
from toolnexus_async.testing import reply, tool_call

ASKED = {"amount": 30, "to": "Ann"}
EDITED = {"amount": 3, "to": "Ann"}


class Payments:
    """A ``pay(amount, to)`` tool that records what it was given."""

    def __init__(self) -> None:
        self.paid: list[dict[str, Any]] = []

        @define_tool(name="pay")
        async def pay(amount: int, to: str) -> ToolResult:
            """Pay ``amount`` to ``to``."""
            self.paid.append({"amount": amount, "to": to})
            return ToolResult.ok(f"paid {amount} to {to}")

        self.toolkit = Toolkit.create(builtins=False, extra_tools=[pay])


def model(messages: list[Message], tools: list[Any]) -> Any:
    """Asks to pay 30 to Ann, then reports what came back."""
    last = messages[-1]
    if isinstance(last, ToolReturn):
        return f"result: {last.output}"
    return reply(tool_call("pay", ASKED, id="c1"))


def client(editable: bool = False, **kw: Any) -> LlmClient:
    gate = require_approval(["pay"], editable=editable)
    return LlmClient.in_process(model, hooks=Hooks(before_tool=gate), **kw)


def edit(request: Request, arguments: object) -> Answer:
    assert request.data is not None
    return Answer(request.id, True, data={"digest": request.data["digest"], "arguments": arguments})


async def parked_run(editable: bool, answer: Any) -> tuple[RunResult, Payments]:
    """One run parked on the gate in an Inbox; ``answer(inbox, request)`` answers it."""
    pay = Payments()
    make = functools.partial(client, editable)
    async with parked(pay.toolkit, lambda inbox: make(wait_for=inbox)) as (inbox, request, done):
        answer(inbox, request)
    return done[0], pay


async def test_an_editable_gate_runs_the_approvers_arguments_and_keeps_both():
    def approve_edited(inbox: Inbox, request: Request) -> None:
        assert request.data is not None and request.data["editable"] is True
        inbox.answer_nowait(edit(request, EDITED))

    result, pay = await parked_run(True, approve_edited)
    assert pay.paid == [EDITED]
    assert result.text == "result: paid 3 to Ann"
    (record,) = result.tool_calls
    assert record.arguments == ASKED and record.changed_arguments == EDITED
    again = RunResult.from_dict(result.to_dict())  # the stored form keeps both
    assert again.tool_calls[0].changed_arguments == EDITED


async def test_edited_arguments_that_fail_the_schema_do_not_run():
    result, pay = await parked_run(
        True,
        lambda inbox, request: inbox.answer_nowait(edit(request, {"amount": "all", "to": "Eve"})),
    )
    assert pay.paid == []
    (record,) = result.tool_calls
    assert record.result.is_error and "invalid arguments for tool 'pay'" in record.result.output
    assert "changed by a before_tool hook or on approval" in record.result.output
    assert record.changed_arguments == {"amount": "all", "to": "Eve"}


async def test_unchanged_arguments_echoed_back_are_no_edit():
    result, pay = await parked_run(
        False, lambda inbox, request: inbox.answer_nowait(edit(request, dict(ASKED)))
    )
    assert pay.paid == [ASKED] and result.tool_calls[0].changed_arguments is None


@pytest.mark.parametrize(
    ("editable", "arguments", "digest", "why"),
    [
        (False, EDITED, True, "does not take changed arguments"),
        (True, ["amount", 3], True, "must be a JSON object"),
        (True, EDITED, False, "without naming the call it changes"),
    ],
)
async def test_an_inbox_refuses_an_edit_it_may_not_take_and_the_run_still_waits(
    editable: bool, arguments: object, digest: bool, why: str
) -> None:
    def refused_then_approved(inbox: Inbox, request: Request) -> None:
        assert request.data is not None
        data: dict[str, Any] = {"arguments": arguments}
        if digest:
            data["digest"] = request.data["digest"]
        with pytest.raises(AnswerMismatchError, match=why):
            inbox.answer_nowait(Answer(request.id, True, data=data))
        assert inbox.pending() == [request]  # nothing taken
        inbox.answer_nowait(Answer(request.id, True))

    result, pay = await parked_run(editable, refused_then_approved)
    assert pay.paid == [ASKED] and result.tool_calls[0].changed_arguments is None


async def test_a_resolver_that_edits_a_gate_without_editable_runs_nothing():
    """A ``wait_for`` resolver's answer reaches the gate unchecked by any inbox: the gate
    itself refuses the change."""
    pay = Payments()

    async def resolver(request: Request, run_id: str | None = None) -> Answer:
        return edit(request, EDITED)

    async with client(False, wait_for=resolver) as c:
        result = await c.run("pay", pay.toolkit)
    assert pay.paid == []
    assert "not made with editable=True" in result.tool_calls[0].result.output


async def test_a_hooks_changed_arguments_are_checked_and_kept() -> None:
    pay = Payments()
    seen: list[dict[str, Any]] = []

    def halve(name: str, args: dict[str, Any], ctx: Any) -> dict[str, Any]:
        seen.append(args)
        return {**args, "amount": args["amount"] // 2}

    async with LlmClient.in_process(model, hooks=Hooks(before_tool=halve)) as c:
        result = await c.run("pay", pay.toolkit)
    assert pay.paid == [{"amount": 15, "to": "Ann"}]
    (record,) = result.tool_calls
    assert record.arguments == ASKED and record.changed_arguments == {"amount": 15, "to": "Ann"}

    def break_it(name: str, args: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return {"amount": 1}  # "to" is required

    async with LlmClient.in_process(model, hooks=Hooks(before_tool=break_it)) as c:
        result = await c.run("pay", Toolkit(pay.toolkit.tools(), validate=False))
    assert pay.paid == [{"amount": 15, "to": "Ann"}]  # checked even with validate=False
    assert result.tool_calls[0].result.is_error


def test_editable_must_be_a_bool() -> None:
    with pytest.raises(UsageError, match="editable must be True or False"):
        require_approval(["pay"], editable="no")  # type: ignore[arg-type]
    assert (
        repr(require_approval(["pay"], editable=True)) == "require_approval(['pay'], editable=True)"
    )


async def test_a_stored_run_takes_the_edit_on_another_worker_and_keeps_both(
    tmp_path: Path,
) -> None:
    """Halted into a SQLite file by one host; a second host on the file (another worker,
    after a restart) refuses an edit the gate does not allow, takes an allowed one, and the
    stored history shows the model's arguments and the approver's."""
    pay, path = Payments(), tmp_path / "runs.sqlite"
    with anyio.fail_after(LIMIT):
        async with (
            SqliteRunStore(path) as store,
            client(True) as c,
            DurableHost(c, pay.toolkit, store, sweep=0.02) as host,
        ):
            halted = await host.run("pay")
        request = halted.pending
        assert request is not None and request.data is not None
        assert request.data["digest"] == call_digest("pay", ASKED)
        results: list[RunResult] = []
        async with (
            SqliteRunStore(path) as store,
            client(True) as c,
            DurableHost(c, pay.toolkit, store, on_result=results.append, sweep=0.02) as host,
        ):
            with pytest.raises(AnswerMismatchError, match="must be a JSON object"):
                await host.answer(edit(request, "amount=3"))
            await host.answer(edit(request, EDITED))
            await until(lambda: results)
    assert pay.paid == [EDITED] and results[0].text == "result: paid 3 to Ann"
    (record,) = results[0].tool_calls
    assert record.arguments == ASKED and record.changed_arguments == EDITED


def make_serve_client(editable: bool, inbox: Inbox) -> LlmClient:
    return client(editable, wait_for=inbox)


@pytest.mark.parametrize("editable", [False, True])
async def test_serve_shows_both_and_refuses_an_edit_the_gate_does_not_allow(
    editable: bool,
) -> None:
    pay = Payments()
    make = functools.partial(make_serve_client, editable)
    async with served(pay.toolkit, make) as (http, stream, run_id, pending):
        changed = {"digest": pending["data"]["digest"], "arguments": EDITED}
        status, body = await post(
            http, f"/requests/{pending['id']}/answer", {"ok": True, "data": changed}
        )
        if not editable:
            assert status == 409 and "does not take changed arguments" in body["error"]
            assert pay.paid == []
            return
        assert status == 200
        await stream.until("done", run_id=run_id)
        async with http.get(f"/runs/{run_id}") as response:
            run = await response.json()
    assert pay.paid == [EDITED]
    (step,) = run["steps"]
    assert step["arguments"] == ASKED and step["changed_arguments"] == EDITED
