"""Run ids: unique by default, or chosen by the host, and kept across a halt and resume."""

from __future__ import annotations

from toolnexus_async import Answer, LlmClient, StreamDone, Toolkit
from toolnexus_async.testing import ScriptedModel, reply, tool_call


async def test_run_ids_are_unique_by_default():
    """Two runs of one client never share an id."""
    async with LlmClient.in_process(ScriptedModel("a", "b")) as client:
        first = await client.run("1", Toolkit.create(builtins=False))
        second = await client.run("2", Toolkit.create(builtins=False))
    assert first.run_id and second.run_id and first.run_id != second.run_id


async def test_a_host_may_name_its_runs_and_the_name_survives_a_resume():
    """run(..., run_id=...) and stream(..., run_id=...) use the host's id throughout."""
    question = {"questions": [{"question": "Which?"}]}
    model = ScriptedModel(reply(tool_call("question", question)), "thanks", "streamed")
    async with LlmClient.in_process(model) as client:
        halted = await client.run("ask", Toolkit.create(), run_id="order-42")
        assert halted.pending is not None
        done = await client.resume(
            halted, Toolkit.create(), answers=Answer(halted.pending.id, True)
        )
        async with client.stream("hi", Toolkit.create(), run_id="order-43") as events:
            last = [e async for e in events][-1]
    assert halted.run_id == done.run_id == "order-42"
    assert isinstance(last, StreamDone) and last.result.run_id == "order-43"
