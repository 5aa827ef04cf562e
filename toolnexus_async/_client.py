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
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Self

import aiohttp
import attrs

from ._client_resume import Resuming
from ._closing import Closing
from ._codecs import codec_for
from ._conversations import ConversationRuns, ConversationStore, MemoryConversationStore
from ._errors import UsageError
from ._executor import WaitFor
from ._hooks import Hooks
from ._ids import new_run_id
from ._loop import RunLoop
from ._messages import Message
from ._metric_events import MetricEvent, Reporter
from ._metrics import MetricsRegistry
from ._model import FunctionModel, Generate, HttpModel, Model
from ._results import RunResult
from ._resume_plan import ResumePlan
from ._retry import RetryPolicy
from ._runner import OnError, Runner
from ._secrets import redact_url, url_secrets
from ._streaming import RunStream, Sink
from ._toolkit import Toolkit
from ._transport import DEFAULT_MAX_REPLY_BYTES, Transport

__all__ = ("LlmClient",)

log = logging.getLogger("toolnexus_async")


@attrs.frozen
class _Options:
    """The run settings both constructors share."""

    timeout: float | None
    request_timeout: float | None
    count_wait_in_timeout: bool
    retry: RetryPolicy | None
    on_error: OnError | None
    hooks: Hooks | None
    on_metric: Callable[[MetricEvent], None] | None
    conversations: ConversationStore | None


class _State(enum.Enum):
    OPEN = "open"  # usable; the session is created on first use
    CLOSED = "closed"  # aclose() ran; the client cannot be used again


class LlmClient(Resuming, Closing):
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
        timeout: seconds a whole run may take (``None``: no limit); over it, the run is
            cancelled and :class:`RunTimeout` raised. Time spent waiting for a human counts,
            unless ``count_wait_in_timeout=False`` (then rely on ``expires_at``).
        request_timeout: seconds one model request may take (a timed-out request is a
            :class:`TransportError`, retried like a connection error).
        count_wait_in_timeout: whether time in ``wait_for`` counts against ``timeout``.
        retry: the :class:`RetryPolicy` for failed model requests (default: 2 retries on
            429, 500, 502, 503, 504 and connection errors, exponential backoff, jitter,
            ``Retry-After`` in seconds honoured).
        on_error: ``(error, attempt) -> "retry" | "fail" | None``, sync or async: overrides
            the policy's verdict for one failure (still bounded by ``retry.retries``).
        hooks: :class:`Hooks` called around model requests and tool calls.
        on_metric: a plain function given every :class:`LlmCallEvent`,
            :class:`ToolCallEvent` and :class:`RunEvent`; :meth:`metrics` renders them all.
        conversations: where :meth:`ask` keeps transcripts (default: in memory).
        max_tokens: the reply budget (anthropic requires one and defaults to 4096).
        max_connections: cap on pooled connections; ``None`` means no cap.
        max_reply_bytes: the largest model reply read, in bytes once decompressed (default
            32 MiB; a streamed reply counts all its chunks); a longer one raises
            :class:`ReplyTooLarge` and is not read further.
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
        timeout: float | None = None,
        request_timeout: float | None = 600.0,
        count_wait_in_timeout: bool = True,
        retry: RetryPolicy | None = None,
        on_error: OnError | None = None,
        hooks: Hooks | None = None,
        on_metric: Callable[[MetricEvent], None] | None = None,
        conversations: ConversationStore | None = None,
        max_tokens: int | None = None,
        max_connections: int | None = None,
        max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
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
        if isinstance(max_reply_bytes, bool) or not isinstance(max_reply_bytes, int):
            raise UsageError(f"max_reply_bytes must be an int, got {max_reply_bytes!r}")
        if max_reply_bytes < 1:
            raise UsageError(f"max_reply_bytes must be at least 1, got {max_reply_bytes}")
        secrets = (self.__api_key or "", *(headers or {}).values(), *url_secrets(base))
        # The request time limit is the session's (aiohttp's total timeout), which costs
        # nothing per request, unlike a cancel scope per request.
        transport = Transport(
            session=session,
            timeout=request_timeout,
            max_connections=max_connections,
            secrets=secrets,
            max_reply_bytes=max_reply_bytes,
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
        self._setup(
            model_impl,
            style,
            base,
            wait_for,
            system_prompt,
            max_turns,
            _Options(
                timeout,
                request_timeout,
                count_wait_in_timeout,
                retry,
                on_error,
                hooks,
                on_metric,
                conversations,
            ),
        )

    @classmethod
    def in_process(
        cls,
        generate: Generate,
        *,
        model: str = "in-process",
        wait_for: WaitFor | None = None,
        system_prompt: str | None = None,
        max_turns: int = 10,
        timeout: float | None = None,
        request_timeout: float | None = None,
        count_wait_in_timeout: bool = True,
        retry: RetryPolicy | None = None,
        on_error: OnError | None = None,
        hooks: Hooks | None = None,
        on_metric: Callable[[MetricEvent], None] | None = None,
        conversations: ConversationStore | None = None,
    ) -> LlmClient:
        """A client whose model is a Python function: no HTTP, no key.

        ``generate(messages, tools)`` (async or plain) gets the transcript so far and the
        toolkit's tools and returns one assistant message (or a plain string as the final
        text). The demo, the tests and the benchmarks use this.
        """
        self = cls.__new__(cls)
        self.__api_key = None
        self._transport = None
        options = _Options(
            timeout,
            request_timeout,
            count_wait_in_timeout,
            retry,
            on_error,
            hooks,
            on_metric,
            conversations,
        )
        self._setup(
            FunctionModel(generate, model),
            "in-process",
            None,
            wait_for,
            system_prompt,
            max_turns,
            options,
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
        options: _Options,
    ) -> None:
        for name in ("timeout", "request_timeout"):
            value = getattr(options, name)
            if value is not None and value <= 0:
                raise UsageError(f"{name} must be > 0 seconds or None, got {value}")
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
        self._metrics = MetricsRegistry()
        self._conversation_runs = ConversationRuns(
            options.conversations
            if options.conversations is not None
            else MemoryConversationStore()
        )
        self._on_metric = options.on_metric
        self._runner = Runner(
            model,
            style,
            wait_for=wait_for,
            hooks=options.hooks,
            retry=options.retry if options.retry is not None else RetryPolicy(),
            on_error=options.on_error,
            timeout=options.timeout,
            request_timeout=options.request_timeout,
            count_wait_in_timeout=options.count_wait_in_timeout,
            report=Reporter(self._metrics, options.on_metric),
        )
        keeper = getattr(wait_for, "on_halt", None)
        if keeper is not None:
            # A resolver that gives up waiting (an Inbox spilling to its store) is handed
            # each halted run to keep.
            async def on_halt(result: RunResult, toolkit: Toolkit) -> None:
                await keeper(result, self, toolkit)

            self._runner.on_halt = on_halt
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
        where = f", base_url={redact_url(self.base_url)!r}" if self.base_url else ""
        return f"LlmClient(style={self.style!r}, model={self.model!r}{where}, api_key=<{key}>)"

    async def run(
        self,
        prompt: str | None,
        toolkit: Toolkit,
        history: Sequence[Message] | None = None,
        *,
        run_id: str | None = None,
    ) -> RunResult:
        """Run the tool-calling loop on ``prompt`` until the model answers or a limit stops it.

        ``prompt=None`` adds no user message: the model is asked to go on from ``history``
        as it stands (for instance ``error.run.messages`` after a :class:`ModelError`).
        ``run_id`` names the run (a host that tracks runs by its own ids); by default a
        unique id is made.

        Returns a :class:`RunResult` whose ``status`` is ``"done"``, ``"pending"`` (a tool
        suspended and no ``wait_for`` is set) or ``"incomplete"`` (``max_turns`` reached).

        Raises:
            ProviderError: the provider replied with a non-2xx status.
            ProtocolError: a 2xx reply lacked what the wire style requires.
            TransportError: the provider could not be reached.
            UsageError: the client is closed, or ``history`` ends with unanswered calls.
        """
        loop = self._new_loop("run", prompt, history, run_id)
        return await self._execute(loop, toolkit)

    def stream(
        self,
        prompt: str | None,
        toolkit: Toolkit,
        history: Sequence[Message] | None = None,
        *,
        run_id: str | None = None,
    ) -> RunStream:
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
        loop = self._new_loop("stream", prompt, history, run_id)

        async def start(sink: Sink) -> RunResult:
            return await self._execute(loop, toolkit, sink=sink)

        return RunStream(start)

    def _new_loop(
        self,
        entry: str,
        prompt: str | None,
        history: Sequence[Message] | None,
        run_id: str | None,
    ) -> RunLoop:
        """A fresh run's loop, after the checks ``run`` and ``stream`` share."""
        self._check_open()
        if prompt is None and not history:
            raise UsageError(f"{entry}(None, ...) continues a history; pass history=")
        return RunLoop(
            prompt,
            history=history or (),
            system_prompt=self.system_prompt,
            max_turns=self.max_turns,
            run_id=run_id or new_run_id(),
            style=self.style,
        )

    def _check_open(self) -> None:
        if self._state is _State.CLOSED:
            raise UsageError("this client is closed; create a new LlmClient")

    def _execute(
        self,
        loop: RunLoop,
        toolkit: Toolkit,
        resume: ResumePlan | None = None,
        on_tools_done: Callable[[RunResult], Any] | None = None,
        sink: Sink | None = None,
    ) -> Awaitable[RunResult]:
        # Not a coroutine: no frame of its own for a run to hold while it is parked.
        return self._runner.execute(loop, toolkit, resume, sink, on_tools_done)

    async def ask(
        self,
        prompt: str,
        toolkit: Toolkit,
        conversation_id: str | None = None,
    ) -> RunResult:
        """A run that continues a stored conversation and saves it back.

        With ``conversation_id`` the transcript is loaded from the client's conversation
        store, the run continues it, and the new transcript is saved, halted or not. Calls
        on the same id wait for each other (one at a time, in arrival order) instead of
        interleaving. Without an id, this is :meth:`run`. A run that halts is saved halted;
        once :meth:`resume` (on this client) finishes it, the conversation is saved again
        and the next ``ask`` goes on from there.

        Raises:
            UsageError: a bad id, or the stored conversation halted on a tool call that
                has no result yet (resume that run first).
        """
        if conversation_id is None:
            return await self.run(prompt, toolkit)
        return await self._conversation_runs.ask(self.run, prompt, toolkit, conversation_id)

    async def _after_resume(self, halted: RunResult, result: RunResult) -> None:
        # A run that came from ask(): its conversation goes on from the resumed transcript.
        await self._conversation_runs.resumed(halted.run_id, result)

    def metrics(self) -> str:
        """Every model request, tool call and run of this client so far, as Prometheus text."""
        return self._metrics.render()

    async def aclose(self) -> None:
        """Close the session this client created (a borrowed one stays open). Idempotent."""
        self._state = _State.CLOSED
        await self._model.aclose()

    async def __aenter__(self) -> Self:
        if self._state is _State.CLOSED:
            raise UsageError("this client is closed; create a new LlmClient")
        return self
