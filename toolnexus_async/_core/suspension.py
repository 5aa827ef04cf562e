"""The suspension rule (DESIGN §3), one tool call at a time, as a sans-IO state machine.

Rule of this module: it decides, it never waits. :class:`CallRule` follows one tool call
from its first execution to the outcome the model sees; the executor performs the action
each step returns (:class:`Execute`, :class:`Ask`) and feeds back what happened, until the
rule says :class:`Settle` (a result for the model) or :class:`Halt` (the run halts on this
call). No coroutine, no socket; the clock is a function passed in, so every rule below is
tested with plain calls (``tests/test_suspension_rule.py``)::

    start --Execute--> executed --not suspended--------------------------> Settle
                          | suspended
                          |-- expired ------------------------------------> Settle(declined)
                          |-- nobody to ask ------------------------------> Halt
                          v
                         Ask --answered ok--> Execute(retry, ctx.answer) --> Settle
                          |                     | suspends again --------> Settle(unresolved)
                          |-- answered no / expired ----------------------> Settle(declined)
                          |-- resolver gave up (HaltRun) -----------------> Halt
                          '-- resolver failed or answered wrongly --------> Settle(error)

The rules, each pinned by a test:

1. A result that is not a suspension is final.
2. A suspension with a resolver (``wait_for``) is asked once. An ok answer runs the same
   call once more with ``ctx.answer`` and ``ctx.request``; if that retry suspends again the
   model gets ``"unresolved: <prompt>"`` and nobody is asked again.
3. A refusal gets ``"declined/expired: <prompt>"``; the model decides what next.
4. A suspension without a resolver halts the run on it (the loop halts on the first in
   call order); so does one whose resolver gave up waiting (``HaltRun``). A call resumed
   while its request is still unanswered waits for that same request again, without
   running again: nobody is asked twice.
5. Expiry: a request whose ``expires_at`` has passed is answered as expired without
   asking or halting; a resolver that does not enforce ``expires_at`` itself is given the
   seconds left as a time limit, whose passing is an expired answer; and an ok answer that
   arrives after ``expires_at`` counts as expired too, whoever delivers it (a late resume
   included).
6. An answer must be an :class:`Answer` echoing the request's id; anything else is an error
   result naming what was wrong, and the tool does not run again.
7. Approval gates: a suspension raised by a ``before_tool`` hook (``require_approval``),
   once approved, runs the call afresh: the hook sees the answer, the tool does not (it
   never asked); the tool's own suspensions then follow rules 2-6 as a fresh call's would,
   and the hook asking again is unresolved. Any ``before_tool`` hook that suspends is a
   gate: the executor gives a host's hook's request ``data["gate"] = "before_tool"``
   (:func:`hooks_own`) before the rule sees it, as require_approval marks its own, so that
   a gate carried over a halt is recognised by that mark and the tool never gets the
   hook's answer (a host's data that already uses ``"gate"`` is an error result instead:
   the mark cannot be set without losing it).
8. Telling the tool: a call settled as declined/expired on its *own* suspension (never a
   gate's) carries ``Settle.refusal``, the refusing :class:`Answer`: the one given with
   ``ok=False``, or ``Answer(id, False, reason="expired")`` for a request that expired
   unasked, whose time limit passed, or whose ok answer came late. The executor tells the
   tool (``Toolkit.refused``) before the result is kept or fed back; the tool never runs
   again either way.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from datetime import UTC, datetime

import attrs

from .loop import CallOutcome
from .messages import ToolCall
from .types import Answer, Request, ToolResult, request_in

__all__ = (
    "FIRST",
    "HOOK_GATE",
    "Ask",
    "CallRule",
    "Execute",
    "Halt",
    "Settle",
    "declined",
    "hooks_own",
    "is_gate",
)

Clock = Callable[[], datetime]


def _utcnow() -> datetime:
    return datetime.now(UTC)


class Execute:
    """Run the call: its ``before_tool`` hook, then the tool.

    ``answer`` and ``request`` go into the tool's ``ctx`` (set on the retry after an
    answer); ``hook_answer`` goes into the hook's ``ctx`` only (an approved gate).
    """

    __slots__ = ("answer", "hook_answer", "request")

    def __init__(
        self,
        answer: Answer | None = None,
        request: Request | None = None,
        hook_answer: Answer | None = None,
    ) -> None:
        self.answer = answer
        self.request = request
        self.hook_answer = hook_answer


class Ask:
    """Ask the resolver for an answer to ``request``; give up after ``timeout`` seconds
    (``None``: the resolver enforces ``expires_at`` itself, or there is none).

    The request is outstanding from now on: announce it before asking, unless ``again``
    (it was raised, and announced, before a halt; the call waits for it once more).
    """

    __slots__ = ("again", "request", "timeout")

    def __init__(self, request: Request, timeout: float | None, *, again: bool = False) -> None:
        self.request = request
        self.timeout = timeout
        self.again = again


class Settle:
    """The call is over: ``outcome.result`` is what the model sees.

    ``refusal``: the call's own request (``outcome.request``) was refused or expired, and
    this is the refusing answer, for the tool to be told (rule 8); None otherwise.
    """

    __slots__ = ("outcome", "refusal")

    def __init__(self, outcome: CallOutcome, refusal: Answer | None = None) -> None:
        self.outcome = outcome
        self.refusal = refusal


class Halt:
    """The call stays suspended and the run halts on it.

    ``announce``: the request was not announced yet (no :class:`Ask` came before).
    """

    __slots__ = ("announce", "outcome")

    def __init__(self, outcome: CallOutcome, announce: bool) -> None:
        self.outcome = outcome
        self.announce = announce


Action = Execute | Ask | Settle | Halt

# The first execution of a call: no answer, nothing asked. Shared: treat it as frozen.
FIRST = Execute()


class _State(enum.Enum):
    START = "not started"
    RUNNING = "running the call"
    ASKING = "waiting for an answer"
    RETRYING = "running the call again with the answer"
    GATED = "running the call after its gate was approved"
    OVER = "over"


# The members as globals, as loop_state.py does with its Expect: on Python 3.11 a read off the
# enum class costs about ten times a global's, and the rule reads them on every step.
_START, _RUNNING, _ASKING = _State.START, _State.RUNNING, _State.ASKING
_RETRYING, _GATED, _OVER = _State.RETRYING, _State.GATED, _State.OVER


# The value of data["gate"] in require_approval's requests: the rule runs such a call's
# tool after the approval without handing the tool an answer it never asked for.
GATE = "require_approval"


# The value of data["gate"] in the requests of a host's own before_tool hook, set when the
# hook suspends (hooks_own), for the same reason.
HOOK_GATE = "before_tool"
_GATES = (GATE, HOOK_GATE)


def is_gate(request: Request) -> bool:
    """Whether ``request`` was raised by a ``before_tool`` hook (marked in its data)."""
    return request.data is not None and request.data.get("gate") in _GATES


def hooks_own(call: ToolCall, result: ToolResult) -> ToolResult:
    """What a host's own ``before_tool`` hook returned for ``call``, as the rule must be
    given it: a suspension's request with the gate's mark (rule 7), or an error result when
    the host's data already has a ``"gate"`` of its own (the tool does not run); any other
    result as it is. The executor calls this for a host's hooks only: require_approval's
    requests are marked when it makes them."""
    request = None if result.metadata is None else request_in(result)
    if request is None or is_gate(request):
        return result  # not a suspension, or a require_approval inside the host's hook
    data = request.data
    if data is not None and "gate" in data:
        return ToolResult.error(
            f"before_tool suspended {call.name!r} with a request whose data has its own "
            f"'gate' ({data['gate']!r}): that key marks a hook's request, so that a "
            "resumed run gives the answer to the hook and not to the tool; use another key"
        )
    marked = attrs.evolve(request, data={**(data or {}), "gate": HOOK_GATE})
    # Every other field and metadata key as the hook gave them: only the request changes.
    return attrs.evolve(result, metadata={**(result.metadata or {}), "pending": marked})


def declined(request: Request) -> ToolResult:
    """What the model sees for a refused or expired request."""
    return ToolResult.error(f"declined/expired: {request.prompt}")


def _expired(request: Request) -> Answer:
    return Answer(request.id, False, reason="expired")


def _unresolved(request: Request) -> ToolResult:
    return ToolResult.error(f"unresolved: {request.prompt}")


def _invalid_arguments(call: ToolCall, raw: str) -> ToolResult:
    shown = repr(raw) if len(raw) <= 200 else repr(raw[:200]) + "..."
    return ToolResult.error(
        f"invalid arguments for tool {call.name!r}: expected a JSON object, got {shown}; "
        "call it again with valid JSON"
    )


class CallRule:
    """One tool call under the suspension rule.

    Args:
        call: the model's call.
        can_ask: there is a resolver (``wait_for``) to ask.
        enforces_expiry: the resolver enforces ``expires_at`` itself (the Inbox does), so
            :class:`Ask` carries no time limit.
        clock: the current time, for expiry; the system clock by default.
    """

    __slots__ = ("_by_gate", "_call", "_can_ask", "_clock", "_enforces", "_request", "_state")

    def __init__(
        self,
        call: ToolCall,
        can_ask: bool,
        enforces_expiry: bool = False,
        *,
        clock: Clock = _utcnow,
    ) -> None:
        self._can_ask = can_ask
        self._enforces = enforces_expiry
        self._clock = clock
        self._state = _START
        self._request: Request | None = None  # the outstanding or answered request
        self._by_gate = False  # that request is a before_tool gate's, not the tool's
        self._call = call

    @property
    def request(self) -> Request | None:
        """The request this call raised (or was resumed with), if any."""
        return self._request

    def start(self) -> Execute | Settle:
        """The first step: execute the call, unless its arguments were not a JSON object."""
        if self._state is not _START:
            self._expect(_START)
        invalid = self._call.invalid_arguments
        if invalid is not None:
            self._state = _OVER
            return Settle(CallOutcome(_invalid_arguments(self._call, invalid)))
        self._state = _RUNNING
        return FIRST

    def asked(self, request: Request) -> None:
        """Start from ``request``, which this call raised and has been waiting for: what
        the wait came to goes to :meth:`answered`, :meth:`halted` or :meth:`failed`. Whose
        request it is, is read from its mark (a gate's, or the tool's own)."""
        if self._state is not _START:
            self._expect(_START)
        self._request = request
        self._by_gate = is_gate(request)
        self._state = _ASKING

    def resumed(self, request: Request, answer: Answer) -> Action:
        """Start from an answer to ``request``, which this call raised before a halt."""
        self.asked(request)
        return self.answered(answer)

    def waiting(self, request: Request) -> Action:
        """Start from ``request``, which this call raised before a halt and nobody has
        answered yet: wait for it again, without running the call (it asked already)."""
        self.asked(request)
        now = self._clock()
        if request.expired(now):
            return self._declined(request, _expired(request))
        if not self._can_ask:
            self._state = _OVER
            # Announced when it was first raised: the run halts on it again, quietly.
            return Halt(CallOutcome(ToolResult.pending(request), request), announce=False)
        return Ask(request, None if self._enforces else request.seconds_left(now), again=True)

    def executed(self, result: ToolResult, *, by_gate: bool = False) -> Action:
        """What the :class:`Execute` gave; ``by_gate``: a ``before_tool`` hook returned it."""
        state = self._state
        if state not in (_RUNNING, _RETRYING, _GATED):
            self._expect(_RUNNING)
        request = None if result.metadata is None else request_in(result)
        if state is _RETRYING:
            asked = self._request
            assert asked is not None
            final = result if request is None else _unresolved(request)
            return self._settle(CallOutcome(final, asked, True))
        if request is None:
            if state is _GATED:
                return self._settle(CallOutcome(result, self._request, True))
            return self._settle(CallOutcome(result))
        if state is _GATED and by_gate:
            gate = self._request
            return self._settle(CallOutcome(_unresolved(request), gate, True))
        # A fresh suspension: the tool's own, or a gate's.
        self._request = request
        self._by_gate = by_gate or is_gate(request)
        timeout = None
        if request.expires_at is not None:  # else nothing to read the clock for
            now = self._clock()
            if request.expired(now):
                # Nobody can answer it any more: asking or halting on it would wait for nothing.
                return self._declined(request, _expired(request))
            if not self._enforces:
                timeout = request.seconds_left(now)
        if not self._can_ask:
            self._state = _OVER
            return Halt(CallOutcome(result, request), announce=True)
        self._state = _ASKING
        return Ask(request, timeout)

    def answered(self, answer: Answer) -> Action:
        """What the resolver returned (an :class:`Answer`: anything else is refused by the
        resolver, as a :class:`UsageError`, before it gets here)."""
        if self._state is not _ASKING:
            self._expect(_ASKING)
        request = self._request
        assert request is not None
        if answer.id != request.id:
            refused = ToolResult.error(
                f"refused an answer with id {answer.id!r}: it does not match request id "
                f"{request.id!r} ({request.prompt})"
            )
            return self._settle(CallOutcome(refused, request))
        if not answer.ok:
            return self._declined(request, answer)
        if request.expires_at is not None and request.expired(self._clock()):
            return self._declined(request, _expired(request))
        if self._by_gate:
            self._state = _GATED
            return Execute(hook_answer=answer)
        self._state = _RETRYING
        return Execute(answer=answer, request=request)

    def timed_out(self) -> Action:
        """The :class:`Ask`'s time limit passed: the request expired unanswered."""
        request = self._request
        assert request is not None
        return self.answered(_expired(request))

    def halted(self) -> Halt:
        """The resolver gave up waiting (it raised ``HaltRun``): the run halts on this call."""
        self._expect(_ASKING)
        request = self._request
        assert request is not None
        self._state = _OVER
        return Halt(CallOutcome(ToolResult.pending(request), request), announce=False)

    def failed(self, error: Exception) -> Settle:
        """The resolver raised ``error`` while working: the model is told, the run goes on."""
        self._expect(_ASKING)
        request = self._request
        assert request is not None
        failure = ToolResult.error(
            f"could not resolve {request.prompt!r}: wait_for raised {type(error).__name__}: {error}"
        )
        return self._settle(CallOutcome(failure, request))

    def _declined(self, request: Request, refusal: Answer) -> Settle:
        """Declined/expired; the tool is told only of its own request, not a gate's."""
        self._state = _OVER
        outcome = CallOutcome(declined(request), request, False)
        return Settle(outcome, None if self._by_gate else refusal)

    def _settle(self, outcome: CallOutcome) -> Settle:
        self._state = _OVER
        return Settle(outcome)

    def _expect(self, state: _State) -> None:
        if self._state is not state:
            # Quoted: the states' values are phrases ("not started", "over").
            raise RuntimeError(
                f"this step needs the call {state.value!r}, and it is {self._state.value!r}"
            )
