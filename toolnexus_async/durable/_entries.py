"""The ways a durable host starts a run (``run``, ``stream``, ``begin``), typed by the run's
output as the client's are (``_engine/entries``): ``output_type=Order`` makes a
``RunResult[Order]``, a ``RunStream[Order]``, a ``BegunRun[Order]``; none, ``[str]``.

Rule of this module: each entry builds the run's loop as the client's do
(:func:`new_run_loop`), gives it a journal, and hands it to the host's drive; what the
journal writes and when is ``_host``'s and ``_journal``'s.
"""

from __future__ import annotations

from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, Unpack, overload

from .._core.errors import StoreUnavailableError
from .._core.loop import RunLoop
from .._core.messages import Message
from .._core.output import OutputOptions
from .._core.resume import ResumePlan
from .._engine.client import LlmClient
from .._engine.entries import new_run_loop
from .._engine.streaming import RunStream, Sink
from ..tools._standard import Toolkit
from ._begun import BegunRun
from ._journal import RunJournal
from ._upkeep import Upkeep

if TYPE_CHECKING:
    from .._core.results import RunResult

__all__ = ("HostEntries",)

T = TypeVar("T")

# The failure of a run begun while the store failed: its caller was told it was not kept.
_NOT_STARTED = "not started: the store failed while keeping it, and its caller was told so"


class HostEntries:
    """``run``, ``stream`` and ``begin``, for :class:`DurableHost`."""

    if TYPE_CHECKING:  # DurableHost's
        client: LlmClient
        toolkit: Toolkit
        _lease: float
        _upkeep: Upkeep

        def _check_open(self) -> None: ...

        def _journal(
            self, run_id: str, turn: int = 0, *, lease: float | None = None
        ) -> RunJournal: ...

        async def _drive(
            self,
            loop: RunLoop,
            journal: RunJournal,
            plan: ResumePlan | None = None,
            sink: Sink | None = None,
        ) -> RunResult: ...

    def _loop(
        self,
        prompt: str | None,
        history: Sequence[Message] | None,
        run_id: str | None,
        entry: str,
        output_type: object,
        options: OutputOptions,
    ) -> RunLoop:
        self._check_open()
        return new_run_loop(
            self.client,
            prompt,
            self.toolkit,
            history=history,
            run_id=run_id,
            entry=entry,
            output_type=output_type,
            options=options,
        )

    @overload
    def run(
        self,
        prompt: str | None,
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
        *,
        history: Sequence[Message] | None = ...,
        run_id: str | None = ...,
        output_type: object,
        **options: Unpack[OutputOptions],
    ) -> Coroutine[Any, Any, RunResult[Any]]: ...

    def run(
        self,
        prompt: str | None,
        *,
        history: Sequence[Message] | None = None,
        run_id: str | None = None,
        output_type: object = None,
        **options: Unpack[OutputOptions],
    ) -> Coroutine[Any, Any, RunResult[Any]]:
        """:meth:`LlmClient.run` with the host's toolkit, every step kept in the store:
        ``result = await host.run(prompt)``. ``output_type`` (and its method and retries):
        as :meth:`LlmClient.run`; its schema is stored with the run, and a run resumed by
        any host is checked against it (its ``output`` is then the validated JSON).

        The run is written to the store when the model first asks for tools (a run that
        asks for none is written when it ends); use :meth:`begin` to have it written
        before anything else happens.
        """
        # Not a coroutine: no frame of its own for a parked run to hold (park.py --store
        # sqlite: 35.9 pymalloc blocks per parked run, 36.9 with this one a coroutine).
        loop = self._loop(prompt, history, run_id, "run", output_type, options)
        journal = self._journal(loop.run_id, lease=self._lease)
        return self._drive(loop, journal)

    @overload
    def stream(
        self,
        prompt: str | None,
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
        *,
        history: Sequence[Message] | None = ...,
        run_id: str | None = ...,
        output_type: object,
        **options: Unpack[OutputOptions],
    ) -> RunStream[Any]: ...

    def stream(
        self,
        prompt: str | None,
        *,
        history: Sequence[Message] | None = None,
        run_id: str | None = None,
        output_type: object = None,
        **options: Unpack[OutputOptions],
    ) -> RunStream[Any]:
        """:meth:`LlmClient.stream` with the host's toolkit, every step kept in the store
        (the run is written before its first event); ``output_type``: as :meth:`run`."""
        loop = self._loop(prompt, history, run_id, "stream", output_type, options)
        journal = self._journal(loop.run_id)

        async def start(sink: Sink) -> RunResult:
            await journal.start(loop.snapshot(), self._lease)
            return await self._drive(loop, journal, sink=sink)

        return RunStream(start)

    @overload
    async def begin(
        self,
        prompt: str | None,
        *,
        history: Sequence[Message] | None = ...,
        run_id: str | None = ...,
        output_type: None = ...,
        **options: Unpack[OutputOptions],
    ) -> BegunRun[str]: ...

    @overload
    async def begin(
        self,
        prompt: str | None,
        *,
        history: Sequence[Message] | None = ...,
        run_id: str | None = ...,
        output_type: type[T],
        **options: Unpack[OutputOptions],
    ) -> BegunRun[T]: ...

    @overload
    async def begin(
        self,
        prompt: str | None,
        *,
        history: Sequence[Message] | None = ...,
        run_id: str | None = ...,
        output_type: object,
        **options: Unpack[OutputOptions],
    ) -> BegunRun[Any]: ...

    async def begin(
        self,
        prompt: str | None,
        *,
        history: Sequence[Message] | None = None,
        run_id: str | None = None,
        output_type: object = None,
        **options: Unpack[OutputOptions],
    ) -> BegunRun[Any]:
        """Keep a new run in the store, held by this host, before anyone is told of it
        (a web handler acknowledges it once this returns); then run it with
        :meth:`BegunRun.run` or :meth:`BegunRun.stream`. If nothing runs it (the process
        dies first), the next host goes on with it once its lease runs out.
        ``output_type``: as :meth:`run`."""
        loop = self._loop(prompt, history, run_id, "begin", output_type, options)
        journal = self._journal(loop.run_id)
        try:
            await journal.start(loop.snapshot(), self._lease)
        except StoreUnavailableError:
            # Its caller is told it was not kept; if it was all the same (the reply was
            # lost), it must not run unacknowledged, nor stay held here: failed, later.
            self._upkeep.give_up(loop.run_id, _NOT_STARTED)
            raise
        return BegunRun(journal.run_id, lambda sink: self._drive(loop, journal, sink=sink))
