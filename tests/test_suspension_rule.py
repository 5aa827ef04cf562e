"""The suspension rule as a state machine: every rule of DESIGN §3, without an event loop.

These tests drive :class:`CallRule` with plain calls, as ``test_loop.py`` drives
``RunLoop``: feed it what happened, check the action it asks for next. The end-to-end
tests in ``test_suspension.py`` check that the executor performs those actions.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from toolnexus_async import Answer, Request, ToolCall, ToolResult
from toolnexus_async._core.suspension import (
    FIRST,
    HOOK_GATE,
    Ask,
    CallRule,
    Execute,
    Halt,
    Settle,
    hooks_own,
)
from toolnexus_async._core.types import request_in
from toolnexus_async._engine.hooks import GATE

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
CALL = ToolCall("c1", "pay", {"amount": 30})


def clock(at: datetime = NOW) -> Callable[[], datetime]:
    return lambda: at


def stamp(seconds: float) -> str:
    return (NOW + timedelta(seconds=seconds)).isoformat()


def pending(request_id: str = "r1", prompt: str = "Pay 30?", **kw: object) -> ToolResult:
    return ToolResult.pending(Request(request_id, "approval", prompt, **kw))  # type: ignore[arg-type]


def rule(*, can_ask: bool = True, enforces: bool = False, at: datetime = NOW) -> CallRule:
    return CallRule(CALL, can_ask=can_ask, enforces_expiry=enforces, clock=clock(at))


def asked(machine: CallRule, result: ToolResult | None = None) -> Ask:
    """Start ``machine`` and feed it a suspension; it must ask."""
    assert machine.start() is FIRST
    action = machine.executed(result or pending())
    assert isinstance(action, Ask)
    return action


# -- 1. a result that is not a suspension is final --------------------------------------------


def test_an_ordinary_result_settles_at_once():
    machine = rule()
    assert machine.start() is FIRST
    action = machine.executed(ToolResult.ok("paid"))
    assert isinstance(action, Settle)
    assert action.outcome.result == ToolResult.ok("paid")
    assert action.outcome.request is None and action.outcome.answered_ok is None


def test_an_error_result_is_final_too():
    machine = rule()
    machine.start()
    action = machine.executed(ToolResult.error("card declined"))
    assert isinstance(action, Settle) and action.outcome.result.is_error


def test_arguments_that_are_not_an_object_settle_without_running_the_tool():
    machine = CallRule(ToolCall("c1", "pay", {}, invalid_arguments="[1, 2"), can_ask=True)
    action = machine.start()
    assert isinstance(action, Settle)
    assert action.outcome.result.output.startswith("invalid arguments for tool 'pay'")
    assert "'[1, 2'" in action.outcome.result.output


# -- 2. asked once; an ok answer retries once -------------------------------------------------


def test_a_suspension_with_a_resolver_is_asked_with_the_request():
    action = asked(rule())
    assert action.request.id == "r1" and action.timeout is None


def test_an_ok_answer_runs_the_call_again_with_the_answer_and_the_request():
    machine = rule()
    ask = asked(machine)
    answer = Answer("r1", True, data={"note": "fine"})
    again = machine.answered(answer)
    assert isinstance(again, Execute)
    assert again.answer == answer and again.request == ask.request
    assert again.hook_answer is None
    done = machine.executed(ToolResult.ok("paid 30"))
    assert isinstance(done, Settle)
    assert done.outcome.result == ToolResult.ok("paid 30")
    assert done.outcome.request == ask.request and done.outcome.answered_ok is True


def test_a_retry_that_suspends_again_is_unresolved_and_not_asked_again():
    machine = rule()
    asked(machine)
    machine.answered(Answer("r1", True))
    done = machine.executed(pending("r2", "Really pay?"))
    assert isinstance(done, Settle)
    assert done.outcome.result == ToolResult.error("unresolved: Really pay?")
    assert done.outcome.answered_ok is True
    with pytest.raises(RuntimeError):
        machine.answered(Answer("r2", True))  # over: nothing more to ask


# -- 3. a refusal is fed back -----------------------------------------------------------------


@pytest.mark.parametrize("reason", [None, "declined", "cancelled", "expired"])
def test_a_refusal_settles_as_declined_or_expired(reason: str | None):
    machine = rule()
    asked(machine)
    done = machine.answered(Answer("r1", False, reason=reason))
    assert isinstance(done, Settle)
    assert done.outcome.result == ToolResult.error("declined/expired: Pay 30?")
    assert done.outcome.answered_ok is False


# -- 4. halting ---------------------------------------------------------------------------------


def test_without_a_resolver_the_run_halts_on_the_call():
    machine = rule(can_ask=False)
    machine.start()
    result = pending()
    halt = machine.executed(result)
    assert isinstance(halt, Halt)
    assert halt.announce  # nobody was asked: the request is announced with the halt
    assert halt.outcome.result is result
    assert halt.outcome.request is not None and halt.outcome.request.id == "r1"
    assert machine.request == halt.outcome.request


def test_a_resolver_that_gives_up_halts_the_run_on_the_same_request():
    machine = rule()
    ask = asked(machine)
    halt = machine.halted()
    assert isinstance(halt, Halt) and not halt.announce  # announced before the Ask already
    assert halt.outcome.request == ask.request
    assert halt.outcome.result == ToolResult.pending(ask.request)


# -- 5. expiry -----------------------------------------------------------------------------------


@pytest.mark.parametrize("can_ask", [True, False])
def test_an_expired_request_is_declined_without_asking_or_halting(can_ask: bool):
    machine = rule(can_ask=can_ask)
    machine.start()
    done = machine.executed(pending(expires_at=stamp(-1)))
    assert isinstance(done, Settle)
    assert done.outcome.result == ToolResult.error("declined/expired: Pay 30?")
    assert done.outcome.answered_ok is False


def test_the_ask_is_limited_to_the_time_left_unless_the_resolver_enforces_it():
    limited = asked(rule(), pending(expires_at=stamp(90)))
    assert limited.timeout == pytest.approx(90)
    enforced = asked(rule(enforces=True), pending(expires_at=stamp(90)))
    assert enforced.timeout is None


def test_the_time_limit_passing_is_an_expired_answer():
    machine = rule()
    asked(machine, pending(expires_at=stamp(90)))
    done = machine.timed_out()
    assert isinstance(done, Settle)
    assert done.outcome.result == ToolResult.error("declined/expired: Pay 30?")


def test_a_late_yes_to_an_expired_request_counts_as_expired():
    """An ok answer delivered after expires_at (a late resume, say) does not run the call."""
    late = NOW + timedelta(seconds=120)
    times = iter([NOW, late])
    machine = CallRule(CALL, can_ask=True, clock=lambda: next(times))
    machine.start()
    assert isinstance(machine.executed(pending(expires_at=stamp(60))), Ask)
    done = machine.answered(Answer("r1", True))
    assert isinstance(done, Settle) and done.outcome.answered_ok is False
    assert done.outcome.result.output == "declined/expired: Pay 30?"


# -- 6. wrong answers -----------------------------------------------------------------------------


def test_an_answer_for_another_request_is_refused_and_the_call_not_run_again():
    machine = rule()
    asked(machine)
    done = machine.answered(Answer("r-other", True))
    assert isinstance(done, Settle)
    assert done.outcome.result.is_error
    assert "refused an answer with id 'r-other'" in done.outcome.result.output
    assert "request id 'r1'" in done.outcome.result.output


def test_a_resolver_that_fails_is_reported_to_the_model():
    machine = rule()
    asked(machine)
    done = machine.failed(ConnectionError("chat service down"))
    assert isinstance(done, Settle)
    assert done.outcome.result == ToolResult.error(
        "could not resolve 'Pay 30?': wait_for raised ConnectionError: chat service down"
    )


# -- 7. approval gates ---------------------------------------------------------------------------


def gate(request_id: str = "g1") -> ToolResult:
    return ToolResult.pending(
        Request(request_id, "approval", "Allow pay?", data={"tool": "pay", "gate": GATE})
    )


def test_an_approved_gate_runs_the_call_afresh_with_the_answer_for_the_hook_only():
    machine = rule()
    machine.start()
    assert isinstance(machine.executed(gate(), by_gate=True), Ask)
    approval = Answer("g1", True)
    again = machine.answered(approval)
    assert isinstance(again, Execute)
    assert again.hook_answer == approval
    assert again.answer is None and again.request is None  # the tool never asked
    done = machine.executed(ToolResult.ok("paid"))
    assert isinstance(done, Settle)
    assert done.outcome.request is not None and done.outcome.request.id == "g1"
    assert done.outcome.answered_ok is True


def test_a_gate_asking_again_after_its_approval_is_unresolved():
    machine = rule()
    machine.start()
    machine.executed(gate(), by_gate=True)
    machine.answered(Answer("g1", True))
    done = machine.executed(gate("g2"), by_gate=True)
    assert isinstance(done, Settle)
    assert done.outcome.result == ToolResult.error("unresolved: Allow pay?")


def test_after_its_gate_the_tools_own_suspension_follows_the_rule_afresh():
    machine = rule()
    machine.start()
    machine.executed(gate(), by_gate=True)
    machine.answered(Answer("g1", True))
    ask = machine.executed(pending("t1", "Confirm the card?"))
    assert isinstance(ask, Ask) and ask.request.id == "t1"
    retry = machine.answered(Answer("t1", True))
    assert isinstance(retry, Execute) and retry.request == ask.request
    done = machine.executed(ToolResult.ok("paid"))
    assert isinstance(done, Settle) and done.outcome.request == ask.request


def test_after_its_gate_the_tools_own_suspension_halts_without_a_resolver():
    machine = rule(can_ask=False)
    machine.start()
    halt = machine.executed(gate(), by_gate=True)
    assert isinstance(halt, Halt)


def test_a_gate_carried_over_a_halt_is_recognised_by_its_mark():
    machine = rule()
    request = gate().metadata["pending"]  # type: ignore[index]
    again = machine.resumed(request, Answer("g1", True))
    assert isinstance(again, Execute) and again.hook_answer is not None
    assert again.answer is None


@pytest.mark.parametrize("can_ask", [True, False])
def test_a_hosts_hook_request_is_marked_as_a_gates_before_the_rule_sees_it(can_ask: bool):
    """``hooks_own``: a host's own before_tool hook's request gets ``data["gate"] =
    "before_tool"`` (its own data kept), so that a rule rebuilt from it after a halt gives
    the answer to the hook, as the rule that asked does."""
    theirs = ToolResult.pending(Request("h1", "input", "Which account?", data={"form": 1}))
    result = hooks_own(CALL, theirs)
    request = request_in(result)
    assert request is not None and request.data == {"form": 1, "gate": HOOK_GATE}
    assert (request.id, request.kind, request.prompt) == ("h1", "input", "Which account?")
    assert result.output == theirs.output and result.is_error
    machine = rule(can_ask=can_ask)
    machine.start()
    action = machine.executed(result, by_gate=True)
    if isinstance(action, Ask):
        assert action.request == request
    else:
        assert isinstance(action, Halt) and action.outcome.request == request
        assert request_in(action.outcome.result) == request  # what a halted run keeps
    rebuilt = rule().resumed(request, Answer("h1", True))
    assert isinstance(rebuilt, Execute) and rebuilt.hook_answer is not None
    assert rebuilt.answer is None  # the tool never asked


def test_require_approvals_request_inside_a_hosts_hook_is_left_as_it_is():
    result = gate()
    assert hooks_own(CALL, result) is result
    plain = ToolResult.error("refused by the hook")
    assert hooks_own(CALL, plain) is plain  # not a suspension: as it is


def test_a_hosts_hook_request_whose_data_has_a_gate_of_its_own_settles_as_an_error():
    theirs = ToolResult.pending(Request("h1", "input", "Which door?", data={"gate": "B12"}))
    result = hooks_own(CALL, theirs)
    assert result.is_error and "'B12'" in result.output and request_in(result) is None
    machine = rule()
    machine.start()
    done = machine.executed(result, by_gate=False)
    assert isinstance(done, Settle) and done.outcome.result == result


# -- resuming ------------------------------------------------------------------------------------


def test_a_resumed_call_goes_on_from_its_answer():
    machine = rule()
    request = Request("r1", "approval", "Pay 30?")
    again = machine.resumed(request, Answer("r1", True))
    assert isinstance(again, Execute) and again.request == request
    declined = rule().resumed(request, Answer("r1", False, reason="declined"))
    assert isinstance(declined, Settle) and declined.outcome.answered_ok is False


@pytest.mark.parametrize("marked", [False, True])
def test_a_rule_rebuilt_from_its_request_goes_on_as_the_one_that_asked(marked: bool):
    """``asked``: the engine waits for a turn's last call itself and rebuilds the call's
    rule from the request; from there it acts as the rule that asked would have."""
    result = gate() if marked else pending()
    request = result.metadata["pending"]  # type: ignore[index]
    answer = Answer(request.id, True)
    outcomes: list[Execute | Ask | Settle | Halt] = []
    for machine in (rule(), rule()):
        if outcomes:
            machine.asked(request)
        else:
            asked(machine, result)
        outcomes.append(machine.answered(answer))
    original, rebuilt = outcomes
    assert isinstance(original, Execute) and isinstance(rebuilt, Execute)
    assert (rebuilt.answer, rebuilt.request, rebuilt.hook_answer) == (
        original.answer,
        original.request,
        original.hook_answer,
    )
    assert (rebuilt.hook_answer is not None) is marked
    halted = rule()
    halted.asked(request)
    assert isinstance(halted.halted(), Halt)
    failed = rule()
    failed.asked(request)
    assert failed.failed(OSError("down")).outcome.result.is_error
    with pytest.raises(RuntimeError, match="needs the call 'not started', and it is 'over'"):
        failed.asked(request)  # only a rule that has not started is rebuilt


def test_steps_out_of_order_are_refused():
    machine = rule()
    with pytest.raises(RuntimeError, match="needs the call 'waiting for an answer'"):
        machine.answered(Answer("r1", True))
    machine.start()
    with pytest.raises(RuntimeError, match="and it is 'running the call'"):
        machine.halted()
