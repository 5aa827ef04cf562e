"""The run's end as the loop builds it (``toolnexus_async/_core/loop_state.py``).

``LoopState._finish`` builds ``RunResult`` by position (keywords would make a dict on every
run), so a change in the order of ``RunResult``'s fields, or two arguments of one type
passed the wrong way round, would go unseen by the type checker. Here a run is driven to
each of its ends and its result compared field by field, by name, with what the loop was
fed, every field of one type given a value of its own.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from toolnexus_async import (
    AssistantMessage,
    ModelReply,
    OutputSpec,
    Request,
    RunResult,
    ToolCall,
    ToolResult,
    Usage,
)
from toolnexus_async._core.loop import CallOutcome, RunLoop

RUN_ID, STYLE, MODEL = "run_7", "openai", "model-x"
TRACE = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
USAGE = Usage(3, 5, 8)
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def spec() -> OutputSpec:
    # A converter, so that the typed output and its JSON differ.
    return OutputSpec("Point", SCHEMA, "prompt", 1, lambda data: ("built", data["n"]))


def reply(
    text: str | None = None,
    *calls: ToolCall,
    refusal: str | None = None,
    stop_reason: str | None = "stop",
) -> ModelReply:
    return ModelReply(AssistantMessage(text, calls, refusal), USAGE, MODEL, stop_reason)


def new_loop(*, max_turns: int = 5, output: OutputSpec | None = None) -> RunLoop:
    loop = RunLoop(
        "hi",
        system_prompt="be brief",
        max_turns=max_turns,
        run_id=RUN_ID,
        style=STYLE,
        output=output,
    )
    loop.trace = TRACE
    return loop


def ended(loop: RunLoop) -> RunResult:
    result = loop.due()
    assert isinstance(result, RunResult), result
    return result


def known(loop: RunLoop, turns: int, **ending: Any) -> dict[str, Any]:
    """Every field of the result the loop should make: what it holds, and ``ending``."""
    return {
        "status": "incomplete",
        "text": "",
        "messages": tuple(loop.messages),
        "tool_calls": tuple(loop.records),
        "turns": turns,
        "usage": Usage(3 * turns, 5 * turns, 8 * turns),
        "model": MODEL,
        "pending": None,
        "limit": None,
        "suspended": (),
        "run_id": RUN_ID,
        "style": STYLE,
        "refusal": None,
        "trace_context": TRACE,
        "output": None,
        "output_data": None,
        "output_spec": loop.output,
        "output_retries_used": 0,
        **ending,
    }


def done() -> tuple[RunResult, dict[str, Any]]:
    loop = new_loop()
    loop.model_replied(reply("the answer"))
    result = ended(loop)
    return result, known(loop, 1, status="done", text="the answer", output="the answer")


def done_with_output() -> tuple[RunResult, dict[str, Any]]:
    loop = new_loop(output=spec())
    loop.model_replied(reply("not json"))
    loop.model_replied(reply('{"n": 7}'))
    result = ended(loop)
    return result, known(
        loop,
        2,
        status="done",
        text='{"n": 7}',
        output=("built", 7),
        output_data={"n": 7},
        output_retries_used=1,
    )


def refused() -> tuple[RunResult, dict[str, Any]]:
    loop = new_loop()
    loop.model_replied(reply(refusal="I will not"))
    result = ended(loop)
    return result, known(loop, 1, status="done", refusal="I will not")


def cut_by_max_turns() -> tuple[RunResult, dict[str, Any]]:
    loop = new_loop(max_turns=1)
    loop.model_replied(reply("looking", ToolCall("c1", "lookup", {"q": 1})))
    loop.tools_finished([ToolResult.ok("found")])
    result = ended(loop)
    return result, known(loop, 1, text="looking", limit="max_turns")


def cut_by_max_tokens() -> tuple[RunResult, dict[str, Any]]:
    loop = new_loop()
    loop.model_replied(reply("half a", stop_reason="length"))
    result = ended(loop)
    return result, known(loop, 1, text="half a", limit="max_tokens")


def output_invalid() -> tuple[RunResult, dict[str, Any]]:
    loop = new_loop(output=spec())
    loop.model_replied(reply("not json"))
    loop.model_replied(reply("still not"))
    result = ended(loop)
    return result, known(loop, 2, text="still not", limit="output_invalid", output_retries_used=1)


def pending() -> tuple[RunResult, dict[str, Any]]:
    loop = new_loop()
    request = Request("req_1", "approval", "Pay 12 EUR?")
    loop.model_replied(reply("paying", ToolCall("c1", "look", {}), ToolCall("c2", "pay", {})))
    loop.tools_finished([ToolResult.ok("seen"), CallOutcome(ToolResult.pending(request))])
    result = ended(loop)
    return result, known(
        loop,
        1,
        status="pending",
        text="paying",
        pending=request,
        suspended=(loop.records[1],),
    )


def model_error() -> tuple[RunResult, dict[str, Any]]:
    loop = new_loop()
    loop.model_replied(reply("working", ToolCall("c1", "lookup", {})))
    loop.tools_finished([ToolResult.error("failed")])
    result = loop.interrupted()
    return result, known(loop, 1, text="working", limit="model_error")


ENDS = (
    done,
    done_with_output,
    refused,
    cut_by_max_turns,
    cut_by_max_tokens,
    output_invalid,
    pending,
    model_error,
)


@pytest.mark.parametrize("end", ENDS, ids=lambda end: end.__name__)
def test_every_field_of_the_result_is_what_the_loop_holds(end: Any) -> None:
    result, expected = end()
    assert [f.name for f in attrs.fields(RunResult)] == list(expected)
    for name, value in expected.items():
        assert getattr(result, name) == value, name


def test_the_ends_give_same_typed_fields_values_of_their_own() -> None:
    """What makes the test above see a swap: across the ends, no two fields of one type
    are always equal."""
    results = [end()[0] for end in ENDS]
    for first, second in (
        ("text", "model"),
        ("text", "limit"),
        ("text", "refusal"),
        ("limit", "refusal"),
        ("model", "style"),
        ("run_id", "style"),
        ("turns", "output_retries_used"),
        ("messages", "tool_calls"),
        ("tool_calls", "suspended"),
        ("output", "output_data"),
        ("trace_context", "output_data"),
    ):
        assert any(getattr(r, first) != getattr(r, second) for r in results), (first, second)
