"""The engine: the one place that drives a run, for every front (client, host, serve).

A run is a value, :class:`RunSpec` (``runspec``: its loop, its toolkit, the plan of a
resume, its journal and who is told of its steps); :meth:`Engine.drive` runs one to its end.
:class:`LlmClient` (``client.engine``), the durable host, ``resume_stored`` and ``serve``
all build a spec and hand it here; none of them reaches into another's internals.

Rules of this module:

- It performs what :class:`RunLoop` asks (a model request, a turn of tool calls) and feeds
  the outcome back; the loop decides everything else.
- Time limits are cancel scopes: a whole-run ``timeout`` (which, with
  ``count_wait_in_timeout=False``, is paused while a human is being waited for) and a
  per-request ``request_timeout``. Cancelling the task that awaits a run cancels the
  in-flight request and the tool tasks with it.
- A model turn is :class:`ModelTurns`'s (``turns``: the plain one done in :meth:`_drive`'s
  own frame), its attempts and retries :class:`ModelRequests`'s (``asking``); the engine is
  both, and the loop never sees a failed attempt that is retried.
- Every model request, tool execution and run is reported as a metric event; a suspension
  is reported as pending, never as an error.
- Tracing hangs on this door and nowhere else: a traced engine (``tracer=``, see
  ``otel``) wraps each drive in its run span, its model's requests, each turn's toolkit
  and each wait; an untraced one pays one ``is None`` per run for it. Every record logged
  in the course of a run carries its id (``record.run_id``).
- A ``require_approval`` gate is checked against the run's toolkit before the run does
  anything: a name that is no tool there ends the run with :class:`UsageError`, since the
  tool it was meant to guard would run unasked.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Literal

import anyio

from .._core.config import Limits
from .._core.errors import (
    ModelError,
    OutputValidationError,
    RunTimeoutError,
    UsageError,
)
from .._core.ids import new_run_id
from .._core.loop import CallModel, HaltedTurn, RunLoop
from .._core.messages import ZERO_USAGE, Message, Usage
from .._core.metric_events import Reporter
from .._core.output import OutputSpec
from .._core.results import RunResult, ToolCallRecord
from .._core.resume import ResumePlan
from .._core.retry import RetryPolicy
from .._core.types import Answer, Request
from .executor import Executor, Plan
from .hooks import Hooks, call_hook, check_gate, plain_before_tool
from .journal import Journal
from .model import HttpModel, Model
from .resolver import Resolver
from .runspec import Budget, RunSpec
from .streaming import Sink
from .toolkit import ToolRegistry
from .tracing import run_extra
from .turns import ModelTurns

if TYPE_CHECKING:
    from .otel import RunTracer

__all__ = ("Engine", "RunSpec")

log = logging.getLogger("toolnexus_async")


class Engine(ModelTurns):
    """Drives runs for one client: requests, retries, hooks, limits and metrics."""

    def __init__(
        self,
        model: Model,
        style: str,
        *,
        resolver: Resolver | None,
        hooks: Hooks | None,
        retry: RetryPolicy,
        limits: Limits,
        report: Reporter,
        system_prompt: str | None = None,
        max_turns: int = 10,
        tracer: RunTracer | None = None,
    ) -> None:
        # A traced engine's model makes a span of each request (see otel).
        self._tracer = tracer
        if tracer is not None:
            model = tracer.model(model)
        self.model = model
        self.style = style
        self.system_prompt = system_prompt
        self.max_turns = max_turns
        self.resolver = resolver
        self.hooks = hooks
        self._before_tool = hooks.before_tool if hooks is not None else None
        self._gate = plain_before_tool(self._before_tool)
        self.retry = retry
        self.on_error = retry.on_error
        self.timeout = limits.timeout
        self.request_timeout = limits.request_timeout
        # A request that is not streamed and needs no cancel scope of ours (the model
        # applies its own limit, or there is none): the model's coroutine as it is.
        self._plain = self.request_timeout is None or model.enforces_timeout
        # A model turn with nothing around the request (no before_llm or after_llm hook),
        # when the run has no stream and no journal either: done in _drive itself.
        self._plain_turn = self._plain and (
            hooks is None or (hooks.before_llm is None and hooks.after_llm is None)
        )
        # An untraced HTTP model's transport is awaited by that turn itself (HttpModel.send,
        # then .reply): no HttpModel.request coroutine per request.
        self._http = model if type(model) is HttpModel else None
        self.count_wait_in_timeout = limits.count_wait_in_timeout
        self._report = report
        # What every run's executor shares (report.tool bound once among it).
        self._plan = Plan(resolver, hooks, report.tool, tracer, self._gate)

    def new_loop(
        self,
        prompt: str | None,
        *,
        history: Sequence[Message] | None = None,
        run_id: str | None = None,
        entry: str = "run",
        output: OutputSpec | None = None,
        instructions: str | None = None,
    ) -> RunLoop:
        """A new run's loop; ``entry`` names the method that asked, for its error.
        ``instructions`` (the toolkit's: a skill catalogue, say) follow the system prompt."""
        if prompt is None and not history:
            raise UsageError(f"{entry}(None, ...) continues a history; pass history=")
        system = self.system_prompt
        if instructions:
            system = instructions if system is None else f"{system}\n\n{instructions}"
        # By position (prompt, history, system_prompt, max_turns, run_id, style, output):
        # a class called with keywords makes a dict of them, on every run.
        run_id = run_id or new_run_id()
        return RunLoop(prompt, history or (), system, self.max_turns, run_id, self.style, output)

    def resumed_loop(
        self,
        turn: HaltedTurn,
        *,
        run_id: str | None,
        turns: int = 0,
        usage: Usage | None = None,
        model: str | None = None,
        records: Sequence[ToolCallRecord] = (),
        trace: dict[str, str] | None = None,
        output: OutputSpec | None = None,
        output_tries: int = 0,
    ) -> RunLoop:
        """The loop of a run that goes on from its halted ``turn`` (``trace``: the halted
        run's trace context, which a traced resume continues; ``output_tries``: the output
        retries it had used)."""
        return RunLoop.resume(
            turn,
            turns=turns,
            usage=usage if usage is not None else ZERO_USAGE,
            model=model,
            records=records,
            max_turns=self.max_turns,
            run_id=run_id or new_run_id(),
            style=self.style,
            trace=trace,
            output=output,
            output_tries=output_tries,
        )

    def drive(self, spec: RunSpec) -> Coroutine[Any, Any, RunResult]:
        """Run ``spec`` to its end (continuing its halted turn first when it has a plan).

        Not a coroutine itself: it hands back the driving coroutine, one frame fewer for
        each of the many runs that may be parked at once.
        """
        if self._tracer is not None:
            return self._tracer.drive(spec, self._untraced)
        return self._untraced(spec)

    def drive_new(self, loop: RunLoop, toolkit: ToolRegistry) -> Coroutine[Any, Any, RunResult]:
        """``drive(RunSpec(loop, toolkit))``: a new run with no stream, journal or plan
        (``LlmClient.run``'s), without a spec object when neither a tracer nor a run
        timeout needs one."""
        if self._tracer is None and self.timeout is None:
            return self._drive(loop, toolkit, None, None, None, None, None, None)
        return self.drive(RunSpec(loop, toolkit))

    def _untraced(self, spec: RunSpec) -> Coroutine[Any, Any, RunResult]:
        """:meth:`drive` itself, for the tracer that wraps it."""
        if self.timeout is None:
            return self._spec_driven(spec, None)
        return self._drive_limited(spec, self.timeout)

    def _spec_driven(self, spec: RunSpec, budget: Budget | None) -> Coroutine[Any, Any, RunResult]:
        # By position: the spec is not held by the driving coroutine while the run is parked
        # (benchmarks/park.py, "pymalloc blocks/run": 35.0 with it kept, 34.0 without).
        sink = spec.stream
        return self._drive(
            spec.loop,
            spec.toolkit,
            spec.plan,
            spec.journal,
            sink,
            sink if sink is not None else spec.observe,  # what the tool steps are told to
            spec.on_tools_done,
            budget,
        )

    async def _drive_limited(self, spec: RunSpec, limit: float) -> RunResult:
        with anyio.CancelScope(deadline=anyio.current_time() + limit) as scope:
            budget = None if self.count_wait_in_timeout else Budget(scope)
            driving = self._spec_driven(spec, budget)
            del spec  # as in _spec_driven: not held by this frame while the run is parked
            return await driving
        # Only reached when the scope cancelled the run.
        raise RunTimeoutError(f"the run took longer than its timeout of {limit} s")

    async def _drive(
        self,
        loop: RunLoop,
        toolkit: ToolRegistry,
        resume: ResumePlan | None,
        journal: Journal | None,
        sink: Sink | None,
        steps: Sink | None,
        on_tools_done: Callable[[RunResult], Any] | None,
        budget: Budget | None,
    ) -> RunResult:
        # One frame for the whole run: it is what a parked run holds while it waits.
        output = loop.output
        plain = self._plain_turn and sink is None and journal is None
        started = time.perf_counter()
        status: Literal["done", "pending", "incomplete", "error"] = "error"
        run_id = loop.run_id
        # Asked once per run: a log.debug call asks the logger again on every turn.
        debug = log.isEnabledFor(logging.DEBUG)
        try:
            if self._before_tool is not None:
                # Each run: the client's runs may each bring a toolkit of their own.
                check_gate(self._before_tool, toolkit)
            if resume is not None:
                if debug:
                    log.debug(
                        "%s: resuming with %d answer(s)",
                        run_id,
                        len(resume.answers),
                        extra=run_extra(run_id),
                    )
                executor = self._executor(toolkit, run_id, budget, steps, journal, loop.turns)
                resumed = executor.resume(resume.turn, resume.answers, resume.kept, resume.waiting)
                loop.tools_finished(await resumed)
                del resumed, executor  # not held by the run through its next turns
                if on_tools_done is not None and isinstance(loop.next_action(), CallModel):
                    # The answered calls have run: from here on, the old state must not be
                    # resumed again (a durable host learns it here).
                    await call_hook(on_tools_done, loop.interrupted("resumed"))
            while True:
                # loop.due(), not next_action(): no CallModel, RunTools or Finish per step.
                due = loop.due()
                if due is None and plain:
                    # The plain turn: the model's (or the transport's) coroutine awaited
                    # right here, not in a _model_turn and an HttpModel.request of its own.
                    asked = time.perf_counter()
                    try:
                        # An HTTP model's response read here, into the same name, so that
                        # no local holds the response after.
                        reply: Any = await self._asking(loop, toolkit, output, debug)
                        http = self._http
                        if http is not None:
                            reply = http.reply(reply)
                    except ModelError as exc:
                        failure: ModelError | None = self._failure(exc)
                    else:
                        failure = None
                    if failure is None:
                        self._report_reply(reply, asked)
                    else:
                        reply = await self._retried(failure, asked, loop, toolkit, output)
                    loop.model_replied(reply)
                    del reply  # not held by a parked run
                elif due is None:
                    # A frame of its own: a parked run does not hold the request's locals.
                    toolkit = await self._model_turn(loop, toolkit, sink, output, journal, debug)
                elif isinstance(due, tuple):
                    # The calls are ``due`` itself: no second local for the collector to
                    # visit in every parked run's frame.
                    if debug:
                        log.debug(
                            "%s: running %d tool call(s)",
                            run_id,
                            len(due),
                            extra=run_extra(run_id),
                        )
                    executor = self._executor(toolkit, run_id, budget, steps, journal, loop.turns)
                    begun = executor.run(due)
                    if isinstance(begun, tuple):
                        # Every call but the last finished (a lone call: there were none):
                        # the last is awaited here, in the run's frame and context, with no
                        # object to carry it (benchmarks/peers parking over HTTP: 853,098 ->
                        # 846,333 instructions a park, callgrind P=100 D=200).
                        # By position: keyword-only defaults are looked up per call.
                        outcome = await executor.run_one(due[-1], None, self._plan.hand_out)
                        if isinstance(outcome, Request):
                            # It waits for a parking resolver: here, so that a parked run
                            # holds neither run_one's frame nor the call's rule nor this
                            # turn's executor (made again for the answer). What the wait
                            # comes to goes back through run_one, as its own wait's would.
                            del executor
                            park = self._plan.park
                            assert park is not None  # run_one hands out only with one
                            try:
                                got: Answer | Exception = await park(outcome, run_id)
                            except Exception as exc:
                                got = exc
                            executor = self._executor(
                                toolkit, run_id, budget, steps, journal, loop.turns
                            )
                            outcome = await executor.run_one(due[-1], (outcome, got))
                            del got
                        outcomes = [*begun, outcome]
                        del outcome
                    else:
                        outcomes = await begun
                    del begun
                    loop.tools_finished(outcomes)
                    # Not held by the run through its next turns: the executor, kept while
                    # the model is asked again, was one more object alive in every run in
                    # flight (500 at once: more young collections, see performance.md).
                    del outcomes, executor
                else:
                    result = due
                    if loop.output_failure is not None:
                        # Raised before the journal ends the run: a durable host records
                        # it as failed, as it does a model error.
                        raise OutputValidationError(*loop.output_failure, result)
                    if journal is not None:
                        await journal.finished(result)
                    status = result.status
                    break
        finally:
            self._report.run(status, loop.turns, time.perf_counter() - started, loop.model)
        if debug:
            log.debug(
                "%s: %s after %d turn(s)",
                run_id,
                result.status,
                result.turns,
                extra=run_extra(run_id),
            )
        return result

    def _executor(
        self,
        toolkit: ToolRegistry,
        run_id: str,
        budget: Budget | None,
        sink: Sink | None,
        journal: Journal | None = None,
        turn: int | None = None,
    ) -> Executor:
        tracer = self._tracer
        return Executor(  # by position, as new_loop's RunLoop: no dict of keywords per turn
            self._plan,
            toolkit if tracer is None else tracer.tools(toolkit),
            run_id,
            budget,
            sink,  # on_event
            journal,
            turn,
        )
