"""The model side of the engine: one model request of a run, its attempts and retries.

Rules of this module:

- Retries are decided by :class:`RetryPolicy` (pure) and the host's ``on_error``; only this
  module sleeps between attempts, and never once text reached someone (it would repeat).
- The per-request limit (``request_timeout``) is a cancel scope, except where the model
  enforces it itself (an HTTP model: in its session), which needs none.
- Every attempt is reported as a metric event, the failed ones with their error's type.
- A mixin of :class:`~toolnexus_async._engine.engine.Engine` (as ``Resuming`` is of the
  client): it reads the engine's model, policy and reporter, and keeps no state.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio

from .._core.errors import ModelError, TransportError
from .._core.messages import Message, ModelReply
from .._core.metric_events import Reporter
from .._core.output import OutputSpec
from .._core.retry import RetryPolicy
from .._core.types import Tool
from .hooks import call_hook
from .model import Model
from .streaming import Sink, StreamReasoning, StreamText, arguments_preview, text_preview
from .tracing import run_extra

__all__ = ("ModelRequests",)

log = logging.getLogger("toolnexus_async")

OnError = Callable[[ModelError, int], Any]


class ModelRequests:
    """A run's model requests: attempted, limited, retried and reported."""

    model: Model
    style: str
    retry: RetryPolicy
    on_error: OnError | None
    request_timeout: float | None
    _report: Reporter

    def _report_reply(self, reply: ModelReply, started: float) -> None:
        usage = reply.usage
        seconds = time.perf_counter() - started
        parts = (usage.cache_read_tokens, usage.cache_write_tokens, usage.reasoning_tokens)
        report = self._report
        if report.listener is None:
            # Nobody listens: straight to the registry, what Reporter.llm would do first.
            report.registry.record_llm(
                self.model.name, "ok", seconds, usage.prompt_tokens, usage.completion_tokens, parts
            )
            return
        # Positional, error=None included: a keyword costs the call more, once per request.
        report.llm(
            self.model.name,
            self.style,
            "ok",
            seconds,
            usage.prompt_tokens,
            usage.completion_tokens,
            None,
            parts,
        )

    async def _retry(
        self,
        failure: ModelError,
        started: float,
        messages: Sequence[Message],
        tools: Sequence[Tool],
        sink: Sink | None,
        streamed: list[str],
        run_id: str,
        output: OutputSpec | None = None,
    ) -> ModelReply:
        """After a failed first attempt: retry as the policy and ``on_error`` decide.

        Every attempt is reported to metrics; raises the last failure when they give up.
        """
        attempt = 1
        while True:
            seconds = time.perf_counter() - started
            self._report.llm(
                self.model.name, self.style, "error", seconds, error=type(failure).__name__
            )
            verdict = None
            if self.on_error is not None:
                verdict = await call_hook(self.on_error, failure, attempt)
            delay = self.retry.delay(attempt, failure, verdict=verdict)
            if delay is None or streamed:
                # Text already reached the consumer: a retry would repeat it.
                raise failure
            log.info(
                "%s: model request failed (%s); retry %d in %.2f s",
                run_id,
                failure,
                attempt,
                delay,
                extra=run_extra(run_id),
            )
            await anyio.sleep(delay)
            attempt += 1
            started = time.perf_counter()
            try:
                reply = await self._attempt(messages, tools, sink, streamed, output)
            except ModelError as exc:
                failure = exc
                continue
            self._report_reply(reply, started)
            return reply

    async def _attempt(
        self,
        messages: Sequence[Message],
        tools: Sequence[Tool],
        sink: Sink | None,
        streamed: list[str],
        output: OutputSpec | None = None,
    ) -> ModelReply:
        limit = self.request_timeout
        if limit is None or self.model.enforces_timeout:
            # An HTTP model has the limit in its session: no cancel scope per request.
            return await self._ask_model(messages, tools, sink, streamed, output)
        with anyio.move_on_after(limit):
            return await self._ask_model(messages, tools, sink, streamed, output)
        raise TransportError(f"the model request took longer than {limit} s")

    async def _ask_model(
        self,
        messages: Sequence[Message],
        tools: Sequence[Tool],
        sink: Sink | None,
        streamed: list[str],
        output: OutputSpec | None = None,
    ) -> ModelReply:
        if sink is None:
            return await self.model.request(messages, tools, output)

        def on_text(text: str) -> None:
            streamed.append(text)
            sink(StreamText(text))

        def on_reasoning(text: str) -> None:
            streamed.append(text)  # shown to someone: the request is not retried either
            sink(StreamReasoning(text))

        if output is None:
            return await self.model.stream(messages, tools, on_text, on_reasoning)
        if output.method == "tool":
            previews = arguments_preview(sink, output.wrapped)
            return await self.model.stream(messages, tools, on_text, on_reasoning, output, previews)
        previewing = text_preview(on_text, sink, output.wrapped)
        return await self.model.stream(messages, tools, previewing, on_reasoning, output)
