"""The ways a client starts a run (``run``, ``stream``, ``start``, ``ask``), typed by the
run's output: ``output_type=Order`` makes a ``RunResult[Order]`` (a ``RunStream[Order]``,
a ``RunHandle[Order]``), no ``output_type`` a ``RunResult[str]``, whose ``output`` is the
text.

Rules of this module:

- Each entry only checks its arguments and builds the run's loop (:func:`new_run_loop`,
  which the durable host's entries use too) and its :class:`RunSpec`; the client's
  :class:`Engine` drives it.
- The keywords of the output besides ``output_type`` are :class:`OutputOptions`, taken as
  ``**options`` and written once; ``output_type`` stays a keyword of its own, since the
  result's type is read from it (three overloads: none, ``RunResult[str]``; a class
  ``T``, ``RunResult[T]``; anything else, a JSON Schema dict or a union,
  ``RunResult[Any]``). The one without ``output_type`` comes first and is not generic,
  so that ``task_group.start_soon(client.run, prompt, toolkit)`` type-checks.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, Unpack, overload

from .._core.loop import RunLoop
from .._core.messages import Message
from .._core.output import OutputOptions, OutputSpec, read_options
from .._core.results import RunResult
from .engine import Engine, RunSpec
from .handle import RunHandle
from .streaming import RunStream, Sink
from .toolkit import ToolRegistry

if TYPE_CHECKING:
    from .conversations import ConversationRuns

__all__ = ("Entries", "new_run_loop")

T = TypeVar("T")


class _Client:
    """What :func:`new_run_loop` needs of a client (:class:`LlmClient` has it)."""

    if TYPE_CHECKING:

        @property
        def engine(self) -> Engine: ...

        def output_spec(
            self, output_type: object, method: str | None = None, retries: int = 1
        ) -> OutputSpec | None: ...


def new_run_loop(
    client: _Client,
    prompt: str | None,
    toolkit: ToolRegistry,
    *,
    history: Sequence[Message] | None,
    run_id: str | None,
    entry: str,
    output_type: object,
    options: OutputOptions,
) -> RunLoop:
    """The loop of a new run of ``client`` started by ``entry`` (named in errors).

    Raises:
        TypeError: an unknown keyword among ``options``.
        UsageError: as :meth:`LlmClient.run`.
    """
    output = None
    if options or output_type is not None:  # else a text run: nothing to read
        method, retries = read_options(options, entry)
        output = client.output_spec(output_type, method, retries)
    return client.engine.new_loop(
        prompt,
        history=history,
        run_id=run_id,
        entry=entry,
        output=output,
        instructions=toolkit.instructions,
    )


class Entries(_Client):
    """``run``, ``stream``, ``start`` and ``ask``, for :class:`LlmClient`."""

    if TYPE_CHECKING:
        _conversation_runs: ConversationRuns
        _engine: Engine

    @overload
    def run(
        self,
        prompt: str | None,
        toolkit: ToolRegistry,
        *,
        history: Sequence[Message] | None = ...,
        run_id: str | None = ...,
        output_type: None = ...,
        **options: Unpack[OutputOptions],
    ) -> Coroutine[Any, Any, RunResult[str]]: ...

    @overload
    def run(
        self,
        prompt: str | None,
        toolkit: ToolRegistry,
        *,
        history: Sequence[Message] | None = ...,
        run_id: str | None = ...,
        output_type: type[T],
        **options: Unpack[OutputOptions],
    ) -> Coroutine[Any, Any, RunResult[T]]: ...

    @overload
    def run(
        self,
        prompt: str | None,
        toolkit: ToolRegistry,
        *,
        history: Sequence[Message] | None = ...,
        run_id: str | None = ...,
        output_type: object,
        **options: Unpack[OutputOptions],
    ) -> Coroutine[Any, Any, RunResult[Any]]: ...

    def run(
        self,
        prompt: str | None,
        toolkit: ToolRegistry,
        *,
        history: Sequence[Message] | None = None,
        run_id: str | None = None,
        output_type: object = None,
        **options: Unpack[OutputOptions],
    ) -> Coroutine[Any, Any, RunResult[Any]]:
        """Run the tool-calling loop on ``prompt`` until the model answers or a limit stops it.

        ``prompt=None`` adds no user message: the model is asked to go on from ``history``
        as it stands (for instance ``error.run.messages`` after a :class:`ModelError`).
        ``run_id`` names the run (a host that tracks runs by its own ids); by default a
        unique id is made.

        ``output_type`` (an attrs class, a dataclass, a ``TypedDict``, a pydantic model, a
        union of these, or a JSON Schema ``dict``) makes the run end on a validated value,
        ``result.output``; ``output_method`` says how the model is asked (``"native"``,
        ``"tool"`` or ``"prompt"``; by default the style's strongest) and
        ``output_retries`` how often an invalid reply is sent back (``docs/output.md``).
        Without ``output_type`` the output of a ``"done"`` run is its text.

        Returns a :class:`RunResult` whose ``status`` is ``"done"``, ``"pending"`` (a tool
        suspended and no ``wait_for`` is set) or ``"incomplete"`` (``max_turns`` reached).

        Raises:
            ProviderError: the provider replied with a non-2xx status.
            ProtocolError: a 2xx reply lacked what the wire style requires.
            TransportError: the provider could not be reached.
            OutputValidationError: the output stayed invalid after ``output_retries``.
            UsageError: the client is closed, ``history`` ends with unanswered calls, or
                ``output_type`` cannot be described as JSON Schema.
        """
        # Not a coroutine: it hands back the engine's, so a parked run holds no frame of its
        # own here (benchmarks/peers parking over HTTP: 312 bytes per parked run).
        loop = new_run_loop(
            self,
            prompt,
            toolkit,
            history=history,
            run_id=run_id,
            entry="run",
            output_type=output_type,
            options=options,
        )
        # The engine itself: new_run_loop asked the property, which checks the client is open.
        return self._engine.drive_new(loop, toolkit)

    @overload
    def stream(
        self,
        prompt: str | None,
        toolkit: ToolRegistry,
        *,
        history: Sequence[Message] | None = ...,
        run_id: str | None = ...,
        output_type: None = ...,
        **options: Unpack[OutputOptions],
    ) -> RunStream[str]: ...

    @overload
    def stream(
        self,
        prompt: str | None,
        toolkit: ToolRegistry,
        *,
        history: Sequence[Message] | None = ...,
        run_id: str | None = ...,
        output_type: type[T],
        **options: Unpack[OutputOptions],
    ) -> RunStream[T]: ...

    @overload
    def stream(
        self,
        prompt: str | None,
        toolkit: ToolRegistry,
        *,
        history: Sequence[Message] | None = ...,
        run_id: str | None = ...,
        output_type: object,
        **options: Unpack[OutputOptions],
    ) -> RunStream[Any]: ...

    def stream(
        self,
        prompt: str | None,
        toolkit: ToolRegistry,
        *,
        history: Sequence[Message] | None = None,
        run_id: str | None = None,
        output_type: object = None,
        **options: Unpack[OutputOptions],
    ) -> RunStream[Any]:
        """:meth:`run`, reported step by step as typed events.

        Yields :class:`StreamText` deltas as the model writes, :class:`StreamUsage` and a
        :class:`StreamToolCall` per call of each reply, :class:`StreamPending` for a
        suspended call (before ``wait_for`` is asked), :class:`StreamToolResult` per
        result, and last :class:`StreamDone` with the :class:`RunResult`. A run that fails
        raises from the iteration instead of ending with ``done``::

            async with client.stream("plan my trip", toolkit) as events:
                async for event in events:
                    if event.kind == "text":
                        print(event.text, end="")

        Leaving the ``async with`` early cancels the run: the HTTP request is aborted and
        the tool tasks are cancelled. Iterating without ``async with`` is refused
        (:class:`UsageError`), since nothing could stop the run if the loop broke off.
        """
        engine = self.engine
        loop = new_run_loop(
            self,
            prompt,
            toolkit,
            history=history,
            run_id=run_id,
            entry="stream",
            output_type=output_type,
            options=options,
        )

        async def start(sink: Sink) -> RunResult:
            return await engine.drive(RunSpec(loop, toolkit, stream=sink))

        return RunStream(start)

    @overload
    def start(
        self,
        prompt: str | None,
        toolkit: ToolRegistry,
        *,
        history: Sequence[Message] | None = ...,
        run_id: str | None = ...,
        output_type: None = ...,
        **options: Unpack[OutputOptions],
    ) -> RunHandle[str]: ...

    @overload
    def start(
        self,
        prompt: str | None,
        toolkit: ToolRegistry,
        *,
        history: Sequence[Message] | None = ...,
        run_id: str | None = ...,
        output_type: type[T],
        **options: Unpack[OutputOptions],
    ) -> RunHandle[T]: ...

    @overload
    def start(
        self,
        prompt: str | None,
        toolkit: ToolRegistry,
        *,
        history: Sequence[Message] | None = ...,
        run_id: str | None = ...,
        output_type: object,
        **options: Unpack[OutputOptions],
    ) -> RunHandle[Any]: ...

    def start(
        self,
        prompt: str | None,
        toolkit: ToolRegistry,
        *,
        history: Sequence[Message] | None = None,
        run_id: str | None = None,
        output_type: object = None,
        **options: Unpack[OutputOptions],
    ) -> RunHandle[Any]:
        """:meth:`run`, held while it goes: ``async with client.start(...) as run:``.

        The :class:`RunHandle` has the run's ``id`` at once, ``status``, ``pending``,
        ``await run.result()`` and ``cancel()``; the run is a task of its own task group,
        started and ended by the block (see ``_handle``). ``run_id`` and errors: as :meth:`run`.
        """
        engine = self.engine
        loop = new_run_loop(
            self,
            prompt,
            toolkit,
            history=history,
            run_id=run_id,
            entry="start",
            output_type=output_type,
            options=options,
        )

        def begin(observe: Sink) -> Awaitable[RunResult]:
            return engine.drive(RunSpec(loop, toolkit, observe=observe))

        return RunHandle(loop.run_id, begin)

    @overload
    async def ask(
        self,
        prompt: str,
        toolkit: ToolRegistry,
        *,
        conversation_id: str | None = ...,
        output_type: None = ...,
        **options: Unpack[OutputOptions],
    ) -> RunResult[str]: ...

    @overload
    async def ask(
        self,
        prompt: str,
        toolkit: ToolRegistry,
        *,
        conversation_id: str | None = ...,
        output_type: type[T],
        **options: Unpack[OutputOptions],
    ) -> RunResult[T]: ...

    @overload
    async def ask(
        self,
        prompt: str,
        toolkit: ToolRegistry,
        *,
        conversation_id: str | None = ...,
        output_type: object,
        **options: Unpack[OutputOptions],
    ) -> RunResult[Any]: ...

    async def ask(
        self,
        prompt: str,
        toolkit: ToolRegistry,
        *,
        conversation_id: str | None = None,
        output_type: object = None,
        **options: Unpack[OutputOptions],
    ) -> RunResult[Any]:
        """A run that continues a stored conversation and saves it back.

        With ``conversation_id`` the transcript is loaded from the client's conversation
        store, the run continues it, and the new transcript is saved, halted or not. Calls
        on the same id wait for each other (one at a time, in arrival order) instead of
        interleaving. Without an id, this is :meth:`run`. A run that halts is saved halted;
        once :meth:`resume` (on this client) finishes it, the conversation is saved again
        and the next ``ask`` goes on from there. ``output_type``, ``output_method`` and
        ``output_retries``: as :meth:`run`.

        Raises:
            UsageError: a bad id, or the stored conversation halted on a tool call that
                has no result yet (resume that run first).
        """
        read_options(options, "ask")  # an unknown keyword is refused before anything runs
        run = functools.partial(self.run, output_type=output_type, **options)
        if conversation_id is None:
            return await run(prompt, toolkit)
        return await self._conversation_runs.ask(run, prompt, toolkit, conversation_id)
