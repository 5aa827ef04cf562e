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
import uuid
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Self

import aiohttp

from ._codecs import codec_for
from ._errors import UsageError
from ._executor import Executor, WaitFor
from ._loop import CallModel, RunLoop, RunTools
from ._messages import Message
from ._model import FunctionModel, Generate, HttpModel, Model
from ._results import RunResult
from ._toolkit import Toolkit
from ._transport import Transport

__all__ = ("LlmClient",)

log = logging.getLogger("toolnexus_async")


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
        prompt: str,
        toolkit: Toolkit,
        history: Sequence[Message] | None = None,
    ) -> RunResult:
        """Run the tool-calling loop on ``prompt`` until the model answers or a limit stops it.

        Returns a :class:`RunResult` whose ``status`` is ``"done"``, ``"pending"`` (a tool
        suspended and no ``wait_for`` is set) or ``"incomplete"`` (``max_turns`` reached).

        Raises:
            ProviderError: the provider replied with a non-2xx status.
            ProtocolError: a 2xx reply lacked what the wire style requires.
            TransportError: the provider could not be reached.
            UsageError: the client is closed, or ``history`` ends with unanswered calls.
        """
        if self._state is _State.CLOSED:
            raise UsageError("this client is closed; create a new LlmClient")
        loop = RunLoop(
            prompt,
            history=history or (),
            system_prompt=self.system_prompt,
            max_turns=self.max_turns,
        )
        run_id = "run_" + uuid.uuid4().hex
        executor = Executor(toolkit, self.wait_for, run_id)
        model = self._model
        while True:
            action = loop.next_action()
            if isinstance(action, CallModel):
                log.debug("%s: model request %d (%s)", run_id, action.turn, model.name)
                loop.model_replied(await model.request(action.messages, toolkit))
            elif isinstance(action, RunTools):
                log.debug("%s: running %d tool call(s)", run_id, len(action.calls))
                loop.tools_finished(await executor.run(action.calls))
            else:
                result = action.result
                log.debug("%s: %s after %d turn(s)", run_id, result.status, result.turns)
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
