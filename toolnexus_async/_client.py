"""``LlmClient``: configuration, lifecycle, and the one place that awaits the loop's actions.

Rules of this module:

- The API key comes from the argument or the style's usual environment variable, lives in
  one private attribute, and is never logged, shown in a ``repr`` or put in an error.
- The client owns one ``aiohttp.ClientSession`` (created on first use, closed by
  :meth:`LlmClient.aclose` or ``async with``), or borrows one passed as ``session=`` and
  leaves it open.
- :meth:`LlmClient.run` is the shell around the sans-IO :class:`RunLoop`: it asks for the
  next action, performs it, feeds the outcome back. Nothing else decides anything.
"""

from __future__ import annotations

import enum
import itertools
import logging
import os
import uuid
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Self

import aiohttp

from ._codecs import codec_for
from ._errors import AnswerMismatch, ModelError, UsageError
from ._executor import Executor, WaitFor
from ._loop import CallModel, HaltedTurn, RunLoop, RunTools
from ._messages import Message
from ._model import FunctionModel, Generate, HttpModel, Model
from ._results import RunResult, ToolCallRecord, Usage
from ._toolkit import Toolkit
from ._transport import Transport
from ._types import Answer, Request, ToolResult

__all__ = ("LlmClient",)

log = logging.getLogger("toolnexus_async")


# Unique without a uuid per run: a random prefix per process, then a counter.
_RUN_PREFIX = "run_" + uuid.uuid4().hex[:12] + "_"
_run_numbers = itertools.count(1)


def _new_run_id() -> str:
    return f"{_RUN_PREFIX}{next(_run_numbers)}"


def _unless_expired(request: Request, answer: Answer) -> Answer:
    # DESIGN section 3.4: a request past its expires_at is answered as expired, even when a
    # late "yes" arrives for it after a halt.
    if answer.ok and request.expired():
        return Answer(answer.id, False, reason="expired")
    return answer


class _State(enum.Enum):
    OPEN = "open"  # usable; the session is created on first use
    CLOSED = "closed"  # aclose() ran; the client cannot be used again


class LlmClient:
    """Runs the tool-calling loop against a model.

    Args:
        base_url: the provider's base URL. openai style posts to
            ``{base_url}/chat/completions`` (the URL carries any ``/v1``); anthropic style
            to ``{base_url}/v1/messages``, or ``{base_url}/messages`` when it ends in
            ``/v1``. Defaults to the provider's public API.
        style: ``"openai"`` or ``"anthropic"``.
        model: the model name, sent verbatim every turn.
        api_key: the key; defaults to ``OPENAI_API_KEY`` or ``ANTHROPIC_API_KEY``.
        wait_for: ``async def wait_for(request) -> Answer`` (a plain function works too).
            Set: suspensions are resolved in-process. Unset: a suspension halts the run
            with ``status == "pending"``.
        system_prompt: instructions sent first in every request.
        max_turns: the most model requests one run may make.
        headers: extra HTTP headers for every request (values are treated as secrets).
        timeout: seconds one HTTP request may take in all.
        max_tokens: the reply budget (anthropic requires one and defaults to 4096).
        max_connections: cap on pooled connections; ``None`` means no cap.
        session: an ``aiohttp.ClientSession`` to borrow instead of creating one.
        extra_body: keys merged into every request body (``temperature``, ...).
    """

    def __init__(
        self,
        base_url: str | None = None,
        style: str = "openai",
        model: str | None = None,
        api_key: str | None = None,
        wait_for: WaitFor | None = None,
        system_prompt: str | None = None,
        max_turns: int = 10,
        headers: Mapping[str, str] | None = None,
        *,
        timeout: float | None = 600.0,
        max_tokens: int | None = None,
        max_connections: int | None = None,
        session: aiohttp.ClientSession | None = None,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        codec = codec_for(style)
        if not model:
            raise UsageError("model is required: the provider needs to know which model to run")
        base = base_url or codec.default_base_url
        if not base.startswith(("http://", "https://")):
            raise UsageError(f"base_url must be an http(s) URL, got {base!r}")
        self.__api_key = api_key if api_key is not None else os.environ.get(codec.key_env)
        request_headers = {**codec.headers(self.__api_key), **(headers or {})}
        secrets = (self.__api_key or "", *(headers or {}).values())
        transport = Transport(
            session=session, timeout=timeout, max_connections=max_connections, secrets=secrets
        )
        self._transport: Transport | None = transport
        model_impl = HttpModel(
            codec,
            transport,
            base_url=base,
            model=model,
            headers=request_headers,
            max_tokens=max_tokens,
            extra_body=extra_body,
        )
        self._setup(model_impl, style, base, wait_for, system_prompt, max_turns)

    @classmethod
    def in_process(
        cls,
        generate: Generate,
        *,
        model: str = "in-process",
        wait_for: WaitFor | None = None,
        system_prompt: str | None = None,
        max_turns: int = 10,
    ) -> LlmClient:
        """A client whose model is a Python function: no HTTP, no key.

        ``generate(messages, tools)`` (async or plain) gets the transcript so far and the
        toolkit's tools and returns one assistant message (or a plain string as the final
        text). The demo, the tests and the benchmarks use this.
        """
        self = cls.__new__(cls)
        self.__api_key = None
        self._transport = None
        self._setup(
            FunctionModel(generate, model), "in-process", None, wait_for, system_prompt, max_turns
        )
        return self

    def _setup(
        self,
        model: Model,
        style: str,
        base_url: str | None,
        wait_for: WaitFor | None,
        system_prompt: str | None,
        max_turns: int,
    ) -> None:
        if max_turns < 1:
            raise UsageError(f"max_turns must be at least 1, got {max_turns}")
        if wait_for is not None and not callable(wait_for):
            raise UsageError(f"wait_for must be callable, got {type(wait_for).__name__}")
        self._model = model
        self.style = style
        self.base_url = base_url
        self.wait_for = wait_for
        self.system_prompt = system_prompt
        self.max_turns = max_turns
        self._state = _State.OPEN

    @property
    def model(self) -> str:
        """The configured model name."""
        return self._model.name

    @property
    def session(self) -> aiohttp.ClientSession | None:
        """The aiohttp session in use (None before the first request or in-process)."""
        return self._transport.session if self._transport is not None else None

    @property
    def closed(self) -> bool:
        return self._state is _State.CLOSED

    def __repr__(self) -> str:
        key = "set" if self.__api_key else "unset"
        where = f", base_url={self.base_url!r}" if self.base_url else ""
        return f"LlmClient(style={self.style!r}, model={self.model!r}{where}, api_key=<{key}>)"

    async def run(
        self,
        prompt: str | None,
        toolkit: Toolkit,
        history: Sequence[Message] | None = None,
    ) -> RunResult:
        """Run the tool-calling loop on ``prompt`` until the model answers or a limit stops it.

        ``prompt=None`` adds no user message: the model is asked to go on from ``history``
        as it stands (for instance ``error.run.messages`` after a :class:`ModelError`).

        Returns a :class:`RunResult` whose ``status`` is ``"done"``, ``"pending"`` (a tool
        suspended and no ``wait_for`` is set) or ``"incomplete"`` (``max_turns`` reached).

        Raises:
            ProviderError: the provider replied with a non-2xx status.
            ProtocolError: a 2xx reply lacked what the wire style requires.
            TransportError: the provider could not be reached.
            UsageError: the client is closed, or ``history`` ends with unanswered calls.
        """
        self._check_open()
        if prompt is None and not history:
            raise UsageError("run(None, ...) continues a history; pass history=")
        run_id = _new_run_id()
        loop = RunLoop(
            prompt,
            history=history or (),
            system_prompt=self.system_prompt,
            max_turns=self.max_turns,
            run_id=run_id,
            style=self.style,
        )
        return await self._drive(loop, Executor(toolkit, self.wait_for, run_id), toolkit)

    async def resume(
        self,
        halted: RunResult,
        answers: Answer | Iterable[Answer],
        toolkit: Toolkit,
    ) -> RunResult:
        """Continue a run that halted with ``status == "pending"``, given answers to it.

        Each answer must echo the id of one of the halted turn's outstanding requests
        (``halted.suspended``). The calls of that turn that completed are never executed
        again; each answered call runs again with ``ctx.answer`` (or gets
        ``"declined/expired: <prompt>"``); the other suspended calls run again and may
        suspend again, halting the run once more on the first in call order. The model then
        sees exactly one result per call of the turn and no new user message. An answer to
        a request whose ``expires_at`` has passed counts as ``Answer(ok=False,
        reason="expired")``, whatever it says.

        Raises:
            AnswerMismatch: an answer echoes no outstanding request; nothing was executed.
            UsageError: ``halted`` is not a halted run, or two answers share an id.
        """
        self._check_open()
        if halted.status != "pending" or not halted.suspended:
            raise UsageError(f"only a halted run can be resumed; this one is {halted.status!r}")
        given = [answers] if isinstance(answers, Answer) else list(answers)
        if not given:
            raise UsageError("resume needs at least one answer")
        outstanding = {r.request.id: r for r in halted.suspended if r.request is not None}
        by_call: dict[str, tuple[Request, Answer]] = {}
        for answer in given:
            record = outstanding.get(answer.id)
            if record is None or record.request is None:
                raise AnswerMismatch(
                    answer.id,
                    f"answer {answer.id!r} matches no outstanding request of run "
                    f"{halted.run_id or '?'}; outstanding: {', '.join(outstanding) or 'none'}",
                )
            if record.call.id in by_call:
                raise UsageError(f"two answers for request {answer.id!r}")
            by_call[record.call.id] = (record.request, _unless_expired(record.request, answer))
        turn = HaltedTurn.of(halted.messages)
        kept = {r.call.id: r.result for r in halted.tool_calls if r.turn == halted.turns}
        return await self._continue(
            turn,
            by_call,
            toolkit,
            halted.run_id or _new_run_id(),
            turns=halted.turns,
            usage=halted.usage,
            model=halted.model,
            records=halted.tool_calls,
            kept=kept,
        )

    async def run_with_answer(
        self,
        toolkit: Toolkit,
        history: Sequence[Message],
        pending: Request,
        answer: Answer,
    ) -> RunResult:
        """Resume from a halted transcript and its pending request alone.

        ``history`` is a halted run's ``messages`` (completed results included, suspended
        calls unanswered) and ``pending`` its ``pending`` request. A transcript does not say
        which request each unanswered call raised, so the answer goes to the **first**
        unanswered call, the one ``RunResult.pending`` always belongs to; to answer another
        call of the turn, use :meth:`resume`. The rules are those of :meth:`resume`. Turn
        counts and usage start afresh (the resumed turn's records carry turn 0), since a
        transcript does not carry them.

        Raises:
            AnswerMismatch: ``answer.id`` is not ``pending.id``.
            UsageError: ``history`` is not a halted transcript.
        """
        self._check_open()
        if answer.id != pending.id:
            raise AnswerMismatch(
                answer.id, f"answer {answer.id!r} does not echo the pending request {pending.id!r}"
            )
        turn = HaltedTurn.of(history)
        by_call = {turn.open[0].id: (pending, _unless_expired(pending, answer))}
        return await self._continue(
            turn, by_call, toolkit, _new_run_id(), turns=0, usage=Usage(), model=None, records=()
        )

    async def _continue(
        self,
        turn: HaltedTurn,
        by_call: dict[str, tuple[Request, Answer]],
        toolkit: Toolkit,
        run_id: str,
        *,
        turns: int,
        usage: Usage,
        model: str | None,
        records: Sequence[ToolCallRecord],
        kept: dict[str, ToolResult] | None = None,
    ) -> RunResult:
        loop = RunLoop.resume(
            turn,
            turns=turns,
            usage=usage,
            model=model,
            records=records,
            max_turns=self.max_turns,
            run_id=run_id,
            style=self.style,
        )
        executor = Executor(toolkit, self.wait_for, run_id)
        log.debug("%s: resuming with %d answer(s)", run_id, len(by_call))
        loop.tools_finished(await executor.resume(turn, by_call, kept))
        return await self._drive(loop, executor, toolkit)

    def _check_open(self) -> None:
        if self._state is _State.CLOSED:
            raise UsageError("this client is closed; create a new LlmClient")

    async def _drive(self, loop: RunLoop, executor: Executor, toolkit: Toolkit) -> RunResult:
        """Perform the loop's actions until it finishes: the only place a run awaits."""
        run_id = loop.run_id
        model = self._model
        while True:
            action = loop.next_action()
            if isinstance(action, CallModel):
                log.debug("%s: model request %d (%s)", run_id, action.turn, model.name)
                try:
                    reply = await model.request(action.messages, toolkit)
                except ModelError as exc:
                    # The host may retry from here; tools that already ran are not redone.
                    exc.run = loop.interrupted()
                    raise
                loop.model_replied(reply)
            elif isinstance(action, RunTools):
                log.debug("%s: running %d tool call(s)", run_id, len(action.calls))
                loop.tools_finished(await executor.run(action.calls))
            else:
                result = action.result
                log.debug("%s: %s after %d turn(s)", run_id, result.status, result.turns)
                on_halt = getattr(self.wait_for, "on_halt", None)
                if result.status == "pending" and on_halt is not None:
                    # A resolver that gave up waiting (an Inbox spilling to its store) is
                    # handed the halted run to keep.
                    await on_halt(result, self, toolkit)
                return result

    async def aclose(self) -> None:
        """Close the session this client created (a borrowed one stays open). Idempotent."""
        self._state = _State.CLOSED
        await self._model.aclose()

    async def __aenter__(self) -> Self:
        if self._state is _State.CLOSED:
            raise UsageError("this client is closed; create a new LlmClient")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
