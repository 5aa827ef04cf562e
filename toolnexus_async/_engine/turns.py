"""The engine's model turns: one model request of a run, and what the run makes of it.

Rules of this module:

- The plain turn (no ``before_llm`` or ``after_llm`` hook, no stream, no journal) is not a
  coroutine of its own: the engine's :meth:`~Engine._drive` awaits the model's request
  (an untraced HTTP model's transport, even: ``HttpModel.send``, then ``reply``) in its one
  frame, and asks this module for the request (:meth:`ModelTurns._asking`) and, if it
  failed, the retries (:meth:`ModelTurns._retried`). A failed
  plain turn ends exactly as :meth:`ModelTurns._model_turn`'s would, errors scrubbed alike
  (``tests/test_plain_paths.py``).
- :meth:`ModelTurns._model_turn` is every other turn: the hooks around the request, the
  stream, and the journal, which keeps a turn of calls before any of them runs.
- A mixin of :class:`~toolnexus_async._engine.engine.Engine`, over ``ModelRequests``
  (attempts and retries): it reads the engine's model, hooks and reporter, keeps no state.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Sequence

from .._core.errors import ModelError, TransportError
from .._core.http import HttpResponse
from .._core.loop import RunLoop
from .._core.messages import Message, ModelReply, raw_of
from .._core.output import OutputSpec
from .._core.types import Tool
from .asking import ModelRequests
from .hooks import BeforeLlm, Hooks, LlmCall, call_hook
from .journal import Journal
from .model import HttpModel
from .streaming import Sink, StreamToolCall, StreamUsage
from .toolkit import ToolRegistry
from .tracing import run_extra

__all__ = ("ModelTurns",)

log = logging.getLogger("toolnexus_async")

# Shared by every request that is not streamed: nothing is ever appended to it.
_NO_TEXT: list[str] = []


class ModelTurns(ModelRequests):
    """A run's model turns, for :class:`~toolnexus_async._engine.engine.Engine`."""

    hooks: Hooks | None
    _plain: bool
    _http: HttpModel | None

    async def _model_turn(
        self,
        loop: RunLoop,
        toolkit: ToolRegistry,
        sink: Sink | None,
        output: OutputSpec | None,
        journal: Journal | None,
        debug: bool,
    ) -> ToolRegistry:
        """A model turn of :meth:`_drive`, retried as the policy says; the toolkit after it."""
        run_id = loop.run_id
        messages: Sequence[Message] = loop.messages
        if debug:
            self._announce(loop)
        hooks = self.hooks
        if hooks is not None and hooks.before_llm is not None:
            messages, toolkit = await _before_llm(hooks.before_llm, loop, messages, toolkit)
        messages, specs = _shaped(messages, toolkit, output)
        streamed: list[str] = [] if sink is not None else _NO_TEXT
        request_started = time.perf_counter()
        try:
            # Retries (rare) have a frame of their own, entered outside the except block so
            # that a later failure is not chained to the first.
            failure: ModelError | None = None
            try:
                reply = await (
                    self.model.request(messages, specs, output)
                    if sink is None and self._plain
                    else self._attempt(messages, specs, sink, streamed, output)
                )
            except ModelError as exc:
                failure = exc
            if failure is None:
                self._report_reply(reply, request_started)
            else:
                reply = await self._retry(
                    failure,
                    request_started,
                    messages,
                    specs,
                    sink,
                    streamed,
                    run_id,
                    output,
                )
            if hooks is not None and hooks.after_llm is not None:
                await call_hook(hooks.after_llm, reply, raw_of(reply))
        except ModelError as exc:
            # The host may retry from here; tools that already ran are not redone.
            exc.run = loop.interrupted()
            raise
        # What the transcript keeps: a reply cut by the output limit loses its calls.
        kept = loop.model_replied(reply)
        if journal is not None and kept.tool_calls:
            # The turn is kept before any of its calls runs (and before a stream shows them).
            await journal.turn(loop, streamed=sink is not None)
        if sink is not None:
            sink(StreamUsage(reply.usage))
            for call in kept.tool_calls:
                sink(StreamToolCall(call.id, call.name, call.arguments))
        return toolkit

    def _asking(
        self, loop: RunLoop, toolkit: ToolRegistry, output: OutputSpec | None, debug: bool
    ) -> Awaitable[ModelReply] | Awaitable[HttpResponse]:
        """The plain turn's request, to be awaited: the model's, or an HTTP model's
        transport's (whose response the engine reads with ``HttpModel.reply``)."""
        if debug:
            self._announce(loop)
        # _shaped's work inline: this is every plain turn.
        messages: Sequence[Message] = loop.messages
        specs: Sequence[Tool] = toolkit.specs
        if output is not None:
            messages, specs = output.shape(messages, specs)
        http = self._http
        if http is None:
            return self.model.request(messages, specs, output)
        return http.send(messages, specs, output)

    def _announce(self, loop: RunLoop) -> None:
        """The debug record of the model request that is due."""
        run_id = loop.run_id
        log.debug(
            "%s: model request %d (%s)",
            run_id,
            loop.turns + 1,
            self.model.name,
            extra=run_extra(run_id),
        )

    def _failure(self, error: ModelError) -> ModelError:
        """What the plain turn's request ``error`` is to the run: a transport's own error
        scrubbed, as ``HttpModel.request`` raises it (raise it outside the except block)."""
        http = self._http
        if http is not None and isinstance(error, TransportError):
            return http.scrubbed(error)
        return error

    async def _retried(
        self,
        failure: ModelError,
        started: float,
        loop: RunLoop,
        toolkit: ToolRegistry,
        output: OutputSpec | None,
    ) -> ModelReply:
        """The plain turn's request after its first attempt failed, as :meth:`_model_turn`
        retries it (a frame only for the rare retry)."""
        messages, specs = _shaped(loop.messages, toolkit, output)
        try:
            return await self._retry(
                failure, started, messages, specs, None, _NO_TEXT, loop.run_id, output
            )
        except ModelError as exc:
            # The host may retry from here; tools that already ran are not redone.
            exc.run = loop.interrupted()
            raise


def _shaped(
    messages: Sequence[Message], toolkit: ToolRegistry, output: OutputSpec | None
) -> tuple[Sequence[Message], Sequence[Tool]]:
    """A request's transcript and tools, as the run's output asks (``OutputSpec.shape``)."""
    if output is None:
        return messages, toolkit.specs
    return output.shape(messages, toolkit.specs)


async def _before_llm(
    hook: BeforeLlm, loop: RunLoop, messages: Sequence[Message], toolkit: ToolRegistry
) -> tuple[Sequence[Message], ToolRegistry]:
    tools = toolkit.tools()
    # The hook gets its own lists: an in-place edit must show as a change.
    changed = await call_hook(hook, LlmCall(list(messages), list(tools)))
    if not isinstance(changed, LlmCall):
        return messages, toolkit
    # A replacement holds for the rest of the run: the loop keeps the new transcript
    # and a toolkit of the new tools executes what the model calls from now on.
    loop.messages[:] = changed.messages
    if changed.tools != tools:
        toolkit = ToolRegistry(changed.tools)
    return loop.messages, toolkit
