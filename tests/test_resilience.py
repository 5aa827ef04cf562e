"""Retries, time limits and cancellation end to end through ``LlmClient``.

Nothing sleeps for long: retries use ``RetryPolicy(base_delay=0)`` or ``Retry-After: 0``,
a policy that would wait for real is bounded by ``anyio.fail_after`` so that honouring the
wrong delay fails fast, and the time-limit tests use limits of a tenth of a second.

The retry decisions are about what a reply means, not how it travelled: a provider played
over the mock transport (``provider``) serves them, headers and hanging requests included.
Real sockets stay where the transport is the subject: a refused connection, a request
timeout applied by aiohttp, and a cancelled run aborting its request on the server.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import anyio
import attrs
import pytest
from aiohttp import web

from tests.conftest import FakeLLM, FakeProvider, Seen, assert_no_leaks, openai_reply
from toolnexus_async import (
    Answer,
    Hooks,
    HttpResponse,
    Limits,
    LlmCallEvent,
    LlmClient,
    MetricEvent,
    ModelError,
    ProviderError,
    Request,
    RetryPolicy,
    RunResult,
    RunTimeoutError,
    ToolContext,
    Toolkit,
    ToolResult,
    TransportError,
)
from toolnexus_async.testing import ScriptedModel, json_response, reply, tool_call

LIMIT = 5  # seconds; reached only when something hangs
FAST = RetryPolicy(base_delay=0)  # the default policy, minus the waiting


# --- helpers -------------------------------------------------------------------------------


def busy(status: int = 503, *, retry_after: str | None = None) -> HttpResponse:
    """A provider error reply, with a ``Retry-After`` header when one is given."""
    headers = {} if retry_after is None else {"Retry-After": retry_after}
    return json_response({"error": {"message": "busy"}}, status, headers)


class RecordingTool:
    """A tool whose behaviour is an async function; records starts and cancellations."""

    source = "custom"
    description = "a tool for the resilience tests"
    input_schema: dict[str, Any] = {"type": "object", "properties": {}}  # noqa: RUF012

    def __init__(self, name: str, body: Callable[..., Any] | None = None) -> None:
        self.name = name
        self._body = body
        self.started = anyio.Event()
        self.calls = 0
        self.cancelled = 0

    async def execute(self, args: dict[str, Any], ctx: ToolContext | None = None) -> ToolResult:
        self.calls += 1
        self.started.set()
        try:
            if self._body is None:
                await anyio.sleep_forever()
                raise AssertionError("unreachable")
            result: ToolResult = await self._body(ctx)
            return result
        except anyio.get_cancelled_exc_class():
            self.cancelled += 1
            raise


def approval_after(name: str, work: float = 0.0) -> RecordingTool:
    """Suspends for approval; once answered, works for ``work`` seconds and reports."""

    async def body(ctx: ToolContext | None) -> ToolResult:
        if ctx is None or ctx.answer is None:
            return ToolResult.pending(Request("", "approval", f"{name}?"))
        await anyio.sleep(work)
        return ToolResult.ok(f"{name} done")

    return RecordingTool(name, body)


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def always(provider: FakeProvider, status: int) -> None:
    provider.handler = lambda body, seen: (status, {"error": {"message": f"HTTP {status}"}})


async def run_http(client: LlmClient, *tools: Any) -> RunResult:
    with anyio.fail_after(LIMIT):
        async with Toolkit.create(builtins=False, extra_tools=tools) as tk, client:
            return await client.run("go", tk)


async def run_in_process(model: Any, tools: list[Any], **kwargs: Any) -> RunResult:
    with anyio.fail_after(LIMIT):
        async with (
            Toolkit.create(builtins=False, extra_tools=tools) as tk,
            LlmClient.in_process(model, model="scripted", **kwargs) as client,
        ):
            return await client.run("go", tk)


@pytest.fixture
def gate(fake_llm: FakeLLM) -> Iterator[threading.Event]:
    """A gate the fake server's handler may block on; opened at teardown, before the server
    stops (a blocked handler blocks the server's loop)."""
    event = threading.Event()
    try:
        yield event
    finally:
        event.set()


class HangingServer:
    """An aiohttp server in a thread whose handler never answers on its own; it records
    whether the handler was cancelled because the client went away."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.cancelled = threading.Event()
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._release: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._release = asyncio.Event()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.5)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        self._ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    async def _handle(self, request: web.Request) -> web.Response:
        await request.read()
        self.entered.set()
        assert self._release is not None
        try:
            async with asyncio.timeout(LIMIT):
                await self._release.wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return web.json_response(openai_reply("too late"))

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the hanging server did not start")

    def stop(self) -> None:
        loop, release = self._loop, self._release
        assert loop is not None and release is not None
        loop.call_soon_threadsafe(release.set)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(10)


@pytest.fixture
def hanging() -> Iterator[HangingServer]:
    server = HangingServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def until(flag: Callable[[], bool]) -> None:
    """Poll ``flag`` (set by another thread) until true; callers bound it with fail_after."""
    while not flag():  # noqa: ASYNC110 - the flag is a threading.Event of the server thread
        await anyio.sleep(0.005)


# --- retries -------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504, 529])
async def test_retryable_statuses_get_two_retries_then_raise(
    provider: FakeProvider, status: int
) -> None:
    """429/500/502/503/504/529: three attempts in all (retries=2), then the ProviderError."""
    always(provider, status)
    client = provider.client(retry=FAST)

    with pytest.raises(ProviderError) as caught:
        await run_http(client)

    assert caught.value.status == status
    # The last failure alone: not chained to the attempts before it.
    assert caught.value.__context__ is None and caught.value.__cause__ is None
    assert len(provider.requests) == 3
    assert provider.bodies[0] == provider.bodies[1] == provider.bodies[2]
    assert_no_leaks()


@pytest.mark.parametrize("status", [400, 401, 404])
async def test_client_errors_are_not_retried(provider: FakeProvider, status: int) -> None:
    """400/401/404 fail at once: one request."""
    always(provider, status)
    client = provider.client(retry=FAST)

    with pytest.raises(ProviderError) as caught:
        await run_http(client)

    assert caught.value.status == status
    assert len(provider.requests) == 1


async def test_connection_refused_is_retried_then_a_transport_error() -> None:
    """Nothing listening: three attempts (each an error metric), then TransportError."""
    events: list[MetricEvent] = []
    client = LlmClient(
        f"http://127.0.0.1:{closed_port()}",
        "openai",
        "m",
        api_key="sk-test-key",
        retry=FAST,
        hooks=Hooks(on_metric=events.append),
    )

    with pytest.raises(TransportError):
        await run_http(client)

    attempts = [e for e in events if isinstance(e, LlmCallEvent)]
    assert [(e.status, e.error) for e in attempts] == [("error", "TransportError")] * 3
    assert_no_leaks()


async def test_default_policy_retries_twice(provider: FakeProvider) -> None:
    """The client's default policy: 503, 503, 503 (Retry-After 0) is three attempts, then 503."""
    provider.handler = lambda body, seen: busy(503, retry_after="0")  # a 4th attempt would count
    client = provider.client()
    # fail_after(1): ignoring Retry-After would mean >= 1.125 s of jittered backoff.
    with anyio.fail_after(1), pytest.raises(ProviderError) as caught:
        await run_http(client)
    assert len(provider.requests) == 3
    assert caught.value.status == 503
    assert caught.value.headers["retry-after"] == "0"


async def test_scripted_503_503_200_succeeds_on_the_third_attempt(provider: FakeProvider) -> None:
    """503, 503, then 200 is a done run after exactly three requests."""
    provider.script(busy(503), busy(503), openai_reply("third time lucky"))
    client = provider.client(retry=FAST)
    result = await run_http(client)
    assert len(provider.requests) == 3
    assert result.status == "done" and result.text == "third time lucky"
    assert result.turns == 1


async def test_retry_after_zero_is_honoured_over_a_long_backoff(provider: FakeProvider) -> None:
    """Retry-After: 0 beats a 30 s backoff: the retry comes at once."""
    patient = RetryPolicy(base_delay=30, max_delay=60, jitter=0)
    provider.script(busy(503, retry_after="0"), openai_reply("done"))
    client = provider.client(retry=patient)
    with anyio.fail_after(2):  # a backoff of 30 s would trip this
        result = await run_http(client)
    assert result.status == "done"
    assert len(provider.requests) == 2


async def test_retry_after_http_date_is_ignored_for_backoff(provider: FakeProvider) -> None:
    """An HTTP-date Retry-After is not a delay: the policy falls back to its backoff."""
    when = format_datetime(datetime.now(UTC) + timedelta(hours=1), usegmt=True)
    errors: list[ModelError] = []

    def on_error(error: ModelError, attempt: int) -> None:
        errors.append(error)

    provider.script(busy(503, retry_after=when), openai_reply("done"))
    client = provider.client(retry=RetryPolicy(base_delay=0, max_delay=60, on_error=on_error))
    with anyio.fail_after(2):  # honouring the date (an hour, capped at 60 s) would trip this
        result = await run_http(client)
    assert result.status == "done"
    assert len(provider.requests) == 2
    (error,) = errors
    assert isinstance(error, ProviderError) and error.headers["retry-after"] == when
    # The decision itself, on the error the client really got: backoff, not the date.
    assert RetryPolicy(jitter=0).delay(1, error) == 0.5
    assert (
        RetryPolicy(jitter=0).delay(1, ProviderError(503, "", "u", headers={"Retry-After": "0"}))
        == 0
    )


@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_on_error_retry_makes_a_400_retried_within_retries(
    provider: FakeProvider, flavour: str
) -> None:
    """on_error saying "retry" retries a 400, but no more than ``retries`` times."""
    always(provider, 400)
    attempts: list[int] = []

    def classify(error: ModelError, attempt: int) -> str:
        assert isinstance(error, ProviderError) and error.status == 400
        attempts.append(attempt)
        return "retry"

    async def classify_async(error: ModelError, attempt: int) -> str:
        await anyio.lowlevel.checkpoint()
        return classify(error, attempt)

    client = provider.client(
        retry=RetryPolicy(
            base_delay=0, retries=2, on_error=classify if flavour == "sync" else classify_async
        ),
    )
    with pytest.raises(ProviderError):
        await run_http(client)

    assert len(provider.requests) == 3
    assert attempts == [1, 2, 3]


async def test_on_error_fail_stops_a_503_at_once(provider: FakeProvider) -> None:
    """on_error saying "fail" gives up on a retryable 503 after one request."""
    always(provider, 503)
    client = provider.client(retry=attrs.evolve(FAST, on_error=lambda e, n: "fail"))
    with pytest.raises(ProviderError) as caught:
        await run_http(client)
    assert caught.value.status == 503
    assert len(provider.requests) == 1


# --- time limits ---------------------------------------------------------------------------


async def test_request_timeout_is_a_transport_error_and_is_retried(
    provider: FakeProvider,
) -> None:
    """A request over request_timeout fails as TransportError and is retried."""

    async def handler(body: dict[str, Any], seen: Seen) -> Any:
        if len(provider.requests) == 1:
            await anyio.sleep_forever()  # the first request hangs until its timeout
        return openai_reply("second attempt")

    provider.handler = handler
    failures: list[ModelError] = []

    def on_error(error: ModelError, attempt: int) -> None:
        failures.append(error)

    client = provider.client(
        limits=Limits(request_timeout=0.05), retry=attrs.evolve(FAST, on_error=on_error)
    )
    result = await run_http(client)

    assert result.status == "done" and result.text == "second attempt"
    assert [type(e) for e in failures] == [TransportError]
    assert len(provider.requests) == 2
    assert_no_leaks()


async def test_request_timeout_without_retries_raises_transport_error(
    fake_llm: FakeLLM, gate: threading.Event
) -> None:
    """With retries=0 a request over request_timeout raises TransportError promptly.

    Over loopback: the timeout is the aiohttp transport's own, and this is where it is
    seen to work against a server that does not answer.
    """

    def handler(body: dict[str, Any], seen: Seen) -> Any:
        gate.wait(LIMIT)
        return openai_reply("late")

    fake_llm.handler = handler
    client = LlmClient(
        fake_llm.url,
        "openai",
        "m",
        api_key="sk-test-key",
        limits=Limits(request_timeout=0.05),
        retry=RetryPolicy(retries=0),
    )
    with anyio.fail_after(1), pytest.raises(TransportError):
        await run_http(client)
    assert_no_leaks()


async def test_run_timeout_when_a_tool_is_slow() -> None:
    """A tool that outlasts the run's timeout: RunTimeoutError (a TimeoutError), tool cancelled."""
    slow = RecordingTool("slow")
    model = ScriptedModel(reply(tool_call("slow", id="c1")), "never")

    with pytest.raises(RunTimeoutError) as caught:
        await run_in_process(model, [slow], limits=Limits(timeout=0.05))

    assert isinstance(caught.value, TimeoutError)
    assert slow.calls == 1 and slow.cancelled == 1
    assert_no_leaks()


async def test_run_timeout_when_the_model_is_slow(provider: FakeProvider) -> None:
    """A model request that outlasts the run's timeout: RunTimeoutError, not a TransportError."""

    async def handler(body: dict[str, Any], seen: Seen) -> Any:
        await anyio.sleep_forever()

    provider.handler = handler
    client = provider.client(limits=Limits(timeout=0.1), retry=FAST)
    with pytest.raises(RunTimeoutError):
        await run_http(client)
    assert len(provider.requests) == 1
    assert_no_leaks()


async def test_run_timeout_reaches_runs_waiting_in_wait_for() -> None:
    """A wait_for that never answers is cut off by the run's timeout, in every call's task."""
    entered: list[str] = []
    cancelled: list[str] = []

    async def never(request: Request) -> Answer:
        entered.append(request.prompt)
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            cancelled.append(request.prompt)
            raise
        raise AssertionError("unreachable")

    tools = [approval_after("a"), approval_after("b")]
    model = ScriptedModel(reply(tool_call("a", id="c1"), tool_call("b", id="c2")), "never")

    with pytest.raises(RunTimeoutError):
        await run_in_process(model, tools, limits=Limits(timeout=0.1), wait_for=never)

    assert sorted(entered) == ["a?", "b?"]
    assert sorted(cancelled) == ["a?", "b?"]
    assert_no_leaks()


@pytest.mark.parametrize("count_wait", [False, True])
async def test_count_wait_in_timeout_decides_whether_a_long_wait_times_out(
    count_wait: bool,
) -> None:
    """A 0.2 s human wait under a 0.1 s timeout: done when waits do not count, else
    RunTimeoutError."""

    async def slow_yes(request: Request) -> Answer:
        await anyio.sleep(0.2)
        return Answer(request.id, True)

    tool = approval_after("pay")
    model = ScriptedModel(reply(tool_call("pay", id="c1")), "paid")
    started = time.monotonic()
    if count_wait:
        with pytest.raises(RunTimeoutError):
            await run_in_process(
                model,
                [tool],
                limits=Limits(timeout=0.1, count_wait_in_timeout=True),
                wait_for=slow_yes,
            )
        assert time.monotonic() - started < 0.2
    else:
        result = await run_in_process(
            model,
            [tool],
            limits=Limits(timeout=0.1, count_wait_in_timeout=False),
            wait_for=slow_yes,
        )
        assert result.status == "done" and result.text == "paid"
        assert time.monotonic() - started >= 0.2
    assert_no_leaks()


async def test_time_outside_waits_still_counts_when_waits_do_not() -> None:
    """count_wait_in_timeout=False: model time before a wait plus tool time after it add up.

    0.1 s of model and 0.1 s of tool work, each under the 0.16 s timeout but not together,
    around a 0.2 s wait that is not counted: the run times out in the tool, after the wait.
    """
    phases: list[str] = []

    async def slow_model(messages: list[Any], tools: list[Any]) -> Any:
        if len(phases) == 0:
            phases.append("model")
            await anyio.sleep(0.1)
            return reply(tool_call("pay", id="c1"))
        phases.append("second model request")
        return "paid"

    async def slow_yes(request: Request) -> Answer:
        phases.append("wait")
        await anyio.sleep(0.2)
        phases.append("answered")
        return Answer(request.id, True)

    tool = approval_after("pay", work=0.1)
    with pytest.raises(RunTimeoutError):
        await run_in_process(
            slow_model,
            [tool],
            limits=Limits(timeout=0.16, count_wait_in_timeout=False),
            wait_for=slow_yes,
        )

    assert phases == ["model", "wait", "answered"]
    assert tool.calls == 2 and tool.cancelled == 1, "the timeout must land in the tool's work"
    assert_no_leaks()


# --- cancellation --------------------------------------------------------------------------


async def test_cancelling_the_run_task_aborts_the_http_request(hanging: HangingServer) -> None:
    """Cancelling the task awaiting run closes the in-flight request: the server sees it go."""
    with anyio.fail_after(LIMIT):
        async with (
            Toolkit.create(builtins=False) as tk,
            LlmClient(hanging.url, "openai", "m", api_key="sk-test-key") as client,
        ):
            task = asyncio.create_task(client.run("go", tk))
            await until(hanging.entered.is_set)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await until(hanging.cancelled.is_set)
    assert task.cancelled()
    assert_no_leaks()


async def test_cancelling_the_run_task_cancels_every_tool_task() -> None:
    """Cancelling the task awaiting run cancels all of the turn's tool calls."""
    tools = [RecordingTool(name) for name in ("a", "b", "c")]
    model = ScriptedModel(reply(*(tool_call(t.name, id=f"c{i}") for i, t in enumerate(tools))))
    with anyio.fail_after(LIMIT):
        async with (
            Toolkit.create(builtins=False, extra_tools=tools) as tk,
            LlmClient.in_process(model, model="scripted") as client,
        ):
            task = asyncio.create_task(client.run("go", tk))
            for tool in tools:
                await tool.started.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    assert [t.cancelled for t in tools] == [1, 1, 1]
    assert_no_leaks()


async def test_cancelling_the_run_task_reaches_a_wait_for() -> None:
    """Cancelling the task awaiting run cancels a wait_for in progress; nothing is left."""
    waiting = anyio.Event()
    cancelled: list[str] = []

    async def never(request: Request) -> Answer:
        waiting.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            cancelled.append(request.id)
            raise
        raise AssertionError("unreachable")

    model = ScriptedModel(reply(tool_call("a", id="c1"), tool_call("b", id="c2")))
    tools = [approval_after("a"), approval_after("b")]
    with anyio.fail_after(LIMIT):
        async with (
            Toolkit.create(builtins=False, extra_tools=tools) as tk,
            LlmClient.in_process(model, model="scripted", wait_for=never) as client,
        ):
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.run, "go", tk)
                await waiting.wait()
                await anyio.wait_all_tasks_blocked()
                tg.cancel_scope.cancel()
    assert len(cancelled) == 2
    assert_no_leaks()
