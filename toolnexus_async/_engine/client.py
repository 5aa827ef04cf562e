"""``LlmClient``: configuration, lifecycle, and the one place that awaits the loop's actions.

Rules of this module:

- The API key comes from the argument or the style's usual environment variable, lives in
  one private attribute, and is never logged, shown in a ``repr`` or put in an error.
- The client owns its :class:`Transport` (the default :class:`AiohttpTransport`, or the
  one passed as ``transport=``) and closes it with :meth:`LlmClient.aclose` or
  ``async with``; a session the transport borrows stays open.
- A run is a :class:`RunSpec` driven by the client's :class:`Engine` (``client.engine``),
  which the durable host and serve drive their runs through too; the client's methods that
  start runs (``entries``) and resume them (``resuming``) only check their arguments and
  build the spec.
"""

from __future__ import annotations

import enum
import logging
import os
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self

from .._core.closing import Closing
from .._core.codecs import codec_for
from .._core.config import IN_PROCESS_LIMITS, Limits, ModelSettings
from .._core.errors import UsageError
from .._core.http import Transport, check_headers
from .._core.metric_events import Reporter
from .._core.output import OutputSpec, output_spec
from .._core.results import RunResult
from .._core.retry import RetryPolicy
from .._core.secrets import redact_url, url_secrets
from .._io.transport import AiohttpTransport
from .conversations import ConversationRuns, ConversationStore, MemoryConversationStore
from .engine import Engine
from .entries import Entries
from .function_model import FunctionModel
from .hooks import Hooks
from .metrics import MetricsRegistry
from .model import Generate, HttpModel, Model, hints_for
from .resolver import Resolver, WaitFor
from .resuming import Resuming
from .tracing import Tracing, otel_missing

if TYPE_CHECKING:
    from .otel import RunTracer

__all__ = ("LlmClient",)

log = logging.getLogger("toolnexus_async")

# Every provider's keys are dozens of characters; a shorter one is a placeholder or a slip.
SHORT_KEY = 8


def _given(value: Any, default: Any, kind: type, name: str) -> Any:
    """``value`` (``default`` when None), refused with a clear error when not a ``kind``."""
    if value is None:
        return default
    if not isinstance(value, kind):
        raise UsageError(f"{name} must be a {kind.__name__}, got {type(value).__name__}")
    return value


def _tracer(tracing: object, style: str, model: Model) -> RunTracer | None:
    """The engine's tracer for ``tracing`` (``None``: not traced)."""
    if tracing is None:
        return None
    if not isinstance(tracing, Tracing):
        raise UsageError(f"tracing must be a Tracing, got {type(tracing).__name__}")
    try:
        from .otel import RunTracer
    except ImportError as exc:
        raise otel_missing(exc) from None
    return RunTracer(tracing, style, model)


class _State(enum.Enum):
    OPEN = "open"  # usable; the session is created on first use
    CLOSED = "closed"  # aclose() ran; the client cannot be used again


# As loop_state.py's Expect (with its figure): read once, not through 3.11's EnumType hook per run.
_OPEN, _CLOSED = _State.OPEN, _State.CLOSED


class LlmClient(Entries, Resuming, Closing):
    """Runs the tool-calling loop against a model.

    Args:
        base_url: the provider's base URL. openai style posts to
            ``{base_url}/chat/completions`` (the URL carries any ``/v1``); anthropic style
            to ``{base_url}/v1/messages``, or ``{base_url}/messages`` when it ends in
            ``/v1``; gemini style to ``{base_url}/v1beta/models/{model}:generateContent``
            (no ``/v1beta`` added when it ends in a version). Defaults to the provider's
            public API.
        style: ``"openai"``, ``"anthropic"`` or ``"gemini"``.
        model: the model name, sent verbatim every turn.
        api_key: the key; defaults to ``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY`` or
            ``GEMINI_API_KEY``.
        wait_for: ``async def wait_for(request) -> Answer``, or an ``Inbox()``; a class, a
            plain (sync) function or anything not callable is a :class:`UsageError`.
            Set: suspensions are resolved in-process. Unset: a suspension halts the run
            with ``status == "pending"``.
        system_prompt: instructions sent first in every request.
        max_turns: the most model requests one run may make.
        headers: extra HTTP headers for every request (values are treated as secrets).
        limits: the :class:`Limits` of a run and its requests (default: no run time
            limit, 600 s per request attempt, replies up to 32 MiB).
        retry: the :class:`RetryPolicy` for failed model requests, with its ``on_error``
            (default: 2 retries on 429, 500, 502, 503, 504, 529 and connection errors,
            exponential backoff, jitter, ``Retry-After`` in seconds honoured).
        hooks: the :class:`Hooks` called around model requests and tool calls, and its
            ``on_metric`` given every metric event.
        settings: the :class:`ModelSettings` of every request (``max_tokens``,
            ``extra_body``).
        transport: what sends the requests (:class:`Transport`); by default an
            :class:`AiohttpTransport` of the client's own. Whatever the transport, the
            client closes it with itself; a session it borrows stays open.
        conversations: where :meth:`ask` keeps transcripts (default: in memory).
        tracing: :class:`Tracing` to make OpenTelemetry spans of every run (needs
            ``opentelemetry-api``: the extra ``[otel]``); ``None``, the
            default: no spans, and nothing of OpenTelemetry is imported.
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
        limits: Limits | None = None,
        retry: RetryPolicy | None = None,
        hooks: Hooks | None = None,
        settings: ModelSettings | None = None,
        transport: Transport | None = None,
        conversations: ConversationStore | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        codec = codec_for(style)
        if not model:
            raise UsageError("model is required: the provider needs to know which model to run")
        base = base_url or codec.default_base_url
        if not base.startswith(("http://", "https://")):
            raise UsageError(f"base_url must be an http(s) URL, got {base!r}")
        limits = _given(limits, Limits(), Limits, "limits")
        settings = _given(settings, ModelSettings(), ModelSettings, "settings")
        self.__api_key = api_key if api_key is not None else os.environ.get(codec.key_env)
        if self.__api_key and len(self.__api_key) < SHORT_KEY:
            where = "api_key" if api_key is not None else codec.key_env
            warnings.warn(
                f"{where} is {len(self.__api_key)} characters long, too short to be a real "
                f"provider key (a placeholder, or the wrong value?); leave it out for a "
                f"server that needs no key",
                UserWarning,
                stacklevel=2,
            )
        request_headers = {**codec.headers(self.__api_key), **(headers or {})}
        check_headers(request_headers)  # before anything is opened
        if transport is None:
            transport = AiohttpTransport()
        elif not isinstance(transport, Transport):
            raise UsageError(
                f"transport must have send(), stream() and aclose(), got {type(transport).__name__}"
            )
        if (
            isinstance(transport, AiohttpTransport)
            and url_secrets(base)
            and any(k.lower() == "authorization" for k in request_headers)
        ):
            # aiohttp refuses both at every request: a client that could never work.
            raise UsageError(
                "base_url carries credentials (user:password@) and the requests also carry "
                "an Authorization header (from api_key or headers=): both would be the "
                "Authorization header; keep one"
            )
        self._transport: Transport | None = transport
        model_impl = HttpModel(
            codec,
            transport,
            base_url=base,
            model=model,
            headers=request_headers,
            max_tokens=settings.max_tokens,
            max_tokens_field=settings.max_tokens_field,
            extra_body=settings.extra_body,
            # The transport applies it (aiohttp's own timeout): no cancel scope per request.
            timeout=limits.request_timeout,
            max_reply_bytes=limits.max_reply_bytes,
            secrets=(self.__api_key or "", *(headers or {}).values(), *url_secrets(base)),
            hints=hints_for(codec, base, self.__api_key),
        )
        self._setup(
            model_impl,
            style,
            base,
            wait_for,
            system_prompt,
            max_turns,
            limits,
            retry,
            hooks,
            conversations,
            tracing,
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
        limits: Limits = IN_PROCESS_LIMITS,
        retry: RetryPolicy | None = None,
        hooks: Hooks | None = None,
        conversations: ConversationStore | None = None,
        tracing: Tracing | None = None,
    ) -> LlmClient:
        """A client whose model is a Python function: no HTTP, no key.

        ``generate(messages, tools)`` (async or plain) gets the transcript so far and the
        toolkit's tools and returns one assistant message (or a plain string as the final
        text). The demo, the tests and the benchmarks use this. Its default ``limits``
        have no ``request_timeout``: set one to bound a slow function.
        """
        self = cls.__new__(cls)
        self.__api_key = None
        self._transport = None
        limits = _given(limits, IN_PROCESS_LIMITS, Limits, "limits")
        self._setup(
            FunctionModel(generate, model),
            "in-process",
            None,
            wait_for,
            system_prompt,
            max_turns,
            limits,
            retry,
            hooks,
            conversations,
            tracing,
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
        limits: Limits,
        retry: RetryPolicy | None,
        hooks: Hooks | None,
        conversations: ConversationStore | None,
        tracing: Tracing | None = None,
    ) -> None:
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise UsageError(f"max_turns must be an int of at least 1, got {max_turns!r}")
        retry = _given(retry, RetryPolicy(), RetryPolicy, "retry")
        hooks = _given(hooks, None, Hooks, "hooks")
        resolver = Resolver.of(wait_for)
        self._model = model
        self.style = style
        self.base_url = base_url
        self.wait_for = wait_for
        self.limits = limits
        self._metrics = MetricsRegistry()
        self._conversation_runs = ConversationRuns(
            conversations if conversations is not None else MemoryConversationStore()
        )
        self._engine = Engine(
            model,
            style,
            resolver=resolver,
            hooks=hooks,
            retry=retry,
            limits=limits,
            report=Reporter(self._metrics, hooks.on_metric if hooks is not None else None),
            system_prompt=system_prompt,
            max_turns=max_turns,
            tracer=_tracer(tracing, style, model),
        )
        self._state = _OPEN

    @property
    def model(self) -> str:
        """The configured model name."""
        return self._model.name

    @property
    def system_prompt(self) -> str | None:
        """The instructions sent first in every request."""
        return self._engine.system_prompt

    @property
    def max_turns(self) -> int:
        """The most model requests one run may make."""
        return self._engine.max_turns

    @property
    def engine(self) -> Engine:
        """What drives this client's runs; the durable host and serve drive theirs through
        it too (see ``_engine``). Not for applications: its interface may change.

        Raises:
            UsageError: the client is closed.
        """
        self._check_open()
        return self._engine

    @property
    def transport(self) -> Transport | None:
        """What sends the requests (None for an in-process model)."""
        return self._transport

    @property
    def closed(self) -> bool:
        return self._state is _CLOSED

    def __repr__(self) -> str:
        key = "set" if self.__api_key else "unset"
        where = f", base_url={redact_url(self.base_url)!r}" if self.base_url else ""
        return f"LlmClient(style={self.style!r}, model={self.model!r}{where}, api_key=<{key}>)"

    def output_spec(
        self, output_type: object, method: str | None = None, retries: int = 1
    ) -> OutputSpec | None:
        """The :class:`OutputSpec` a run of this client gets for ``output_type`` (``None``
        for ``None``): see ``docs/output.md``.

        Raises:
            UsageError: the type cannot be described, or the method does not suit the style.
        """
        if output_type is None:
            return None
        return output_spec(output_type, style=self.style, method=method, retries=retries)

    def _check_open(self) -> None:
        if self._state is _CLOSED:
            raise UsageError("this client is closed; create a new LlmClient")

    async def _after_resume(self, halted: RunResult, result: RunResult) -> None:
        # A run that came from ask(): its conversation goes on from the resumed transcript.
        await self._conversation_runs.resumed(halted.run_id, result)

    def metrics(self) -> str:
        """Every model request, tool call and run of this client so far, as Prometheus text."""
        return self._metrics.render()

    async def aclose(self) -> None:
        """Close the session this client created (a borrowed one stays open). Idempotent."""
        self._state = _CLOSED
        await self._model.aclose()

    async def __aenter__(self) -> Self:
        if self._state is _CLOSED:
            raise UsageError("this client is closed; create a new LlmClient")
        return self
