"""LlmClient end to end over HTTP against the fake LLM on 127.0.0.1, in both wire styles.

Pins the wire (paths, headers, model, tool results), the run's bookkeeping (usage, turns,
limits), the error mapping at the edge, secrecy of the key, history, lifecycle and leaks.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import aiohttp
import anyio
import pytest

from tests.conftest import FakeLLM, Seen, anthropic_reply, assert_no_leaks, openai_reply
from tests.shared import Holding
from toolnexus_async import (
    AiohttpTransport,
    Answer,
    LlmClient,
    ProtocolError,
    ProviderError,
    Request,
    RetryPolicy,
    ToolContext,
    Toolkit,
    ToolnexusError,
    ToolResult,
    TransportError,
    UsageError,
    define_tool,
    messages_from_json,
    messages_to_json,
)
from toolnexus_async.testing import ScriptedModel, reply, tool_call

LIMIT = 5  # seconds; reached only when something hangs
KEY = "sk-test-5ecret-key-0123456789"
HEADER_SECRET = "org-5ecret-header-value"
STYLES = ("openai", "anthropic")


# --- helpers -------------------------------------------------------------------------------


def script(fake_llm: FakeLLM, *replies: Any) -> None:
    """Answer the n-th request with the n-th reply (a request beyond the script is a 500)."""

    def handler(body: dict[str, Any], seen: Seen) -> Any:
        index = len(fake_llm.requests) - 1
        if index >= len(replies):
            return 500, {"error": {"message": f"unscripted request {index + 1}"}}
        return replies[index]

    fake_llm.handler = handler


def tool_turn(style: str, calls: list[tuple[str, str, Any]], usage: Any = None) -> Any:
    """A reply calling tools, in ``style``; calls are (id, name, arguments)."""
    if style == "openai":
        return openai_reply(None, calls, usage)
    return anthropic_reply(None, calls, usage)


def text_turn(style: str, text: str, usage: Any = None) -> Any:
    if style == "openai":
        return openai_reply(text, None, usage)
    return anthropic_reply(text, None, usage)


def tool_results(style: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool results of a rendered request as (id, content, is_error) dicts."""
    out = []
    for message in body["messages"]:
        if style == "openai" and message["role"] == "tool":
            out.append(
                {"id": message["tool_call_id"], "content": message["content"], "is_error": None}
            )
        elif style == "anthropic" and isinstance(message["content"], list):
            out.extend(
                {"id": b["tool_use_id"], "content": b["content"], "is_error": b.get("is_error")}
                for b in message["content"]
                if b["type"] == "tool_result"
            )
    return out


def headers_of(seen: Seen) -> dict[str, str]:
    return {k.lower(): v for k, v in seen.headers.items()}


def make_client(fake_llm: FakeLLM, style: str, **kwargs: Any) -> LlmClient:
    kwargs.setdefault("api_key", KEY)
    kwargs.setdefault("model", "test-model")
    return LlmClient(fake_llm.url, style, **kwargs)


@define_tool
async def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@define_tool
async def explode(reason: str) -> str:
    """Always fails."""
    raise ValueError(f"cannot comply: {reason}")


async def run_once(client: LlmClient, prompt: str = "go", *tools: Any) -> Any:
    with anyio.fail_after(LIMIT):
        async with Toolkit.create(builtins=False, extra_tools=tools or [add]) as tk:
            return await client.run(prompt, tk)


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def session_of(client: LlmClient) -> aiohttp.ClientSession | None:
    """The aiohttp session of a client's default transport."""
    transport = client.transport
    assert isinstance(transport, AiohttpTransport)
    return transport.session


def is_closed(session: aiohttp.ClientSession) -> bool:
    """Read ``closed`` afresh (a plain attribute read would stay narrowed for mypy)."""
    return session.closed


def secret_free(text: str) -> bool:
    return KEY not in text and HEADER_SECRET not in text


def error_texts(err: BaseException) -> list[str]:
    """Everything an error shows: str, repr, args and attribute values."""
    texts = [str(err), repr(err), *(repr(a) for a in err.args)]
    texts += [repr(v) for v in vars(err).values()]
    return texts


# --- the wire ------------------------------------------------------------------------------


async def test_openai_posts_to_chat_completions_under_the_v1_base(fake_llm: FakeLLM) -> None:
    """openai: POST {base}/chat/completions, Bearer key, the model verbatim on every turn."""
    script(
        fake_llm, tool_turn("openai", [("c1", "add", {"a": 1, "b": 2})]), text_turn("openai", "3")
    )
    model = "acme/GPT-x_1.2:2024-06 preview"
    async with LlmClient(fake_llm.url + "/v1", "openai", model, api_key=KEY) as client:
        result = await run_once(client)

    assert result.status == "done" and result.text == "3"
    assert [s.path for s in fake_llm.requests] == ["/v1/chat/completions"] * 2
    for seen in fake_llm.requests:
        headers = headers_of(seen)
        assert headers["authorization"] == f"Bearer {KEY}"
        assert "x-api-key" not in headers
        assert headers["content-type"].startswith("application/json")
        assert seen.body["model"] == model
    assert fake_llm.bodies[0]["tools"][0]["function"]["name"] == "add"


@pytest.mark.parametrize(
    ("suffix", "path"),
    [
        ("", "/v1/messages"),
        ("/v1", "/v1/messages"),
        ("/v1/", "/v1/messages"),
        ("/proxy", "/proxy/v1/messages"),
    ],
)
async def test_anthropic_posts_to_messages(fake_llm: FakeLLM, suffix: str, path: str) -> None:
    """anthropic: {base}/v1/messages, or {base}/messages when the base ends in /v1; its headers."""
    script(
        fake_llm,
        tool_turn("anthropic", [("tu1", "add", {"a": 1, "b": 2})]),
        text_turn("anthropic", "3"),
    )
    model = "claude-x 3.5@special"
    async with LlmClient(fake_llm.url + suffix, "anthropic", model, api_key=KEY) as client:
        result = await run_once(client)

    assert result.status == "done" and result.text == "3"
    assert [s.path for s in fake_llm.requests] == [path] * 2
    for seen in fake_llm.requests:
        headers = headers_of(seen)
        assert headers["x-api-key"] == KEY
        assert headers["anthropic-version"] == "2023-06-01"
        assert "authorization" not in headers
        assert seen.body["model"] == model
        assert isinstance(seen.body["max_tokens"], int) and seen.body["max_tokens"] > 0


@pytest.mark.parametrize("style", STYLES)
async def test_usage_is_summed_across_turns(fake_llm: FakeLLM, style: str) -> None:
    """Usage is summed over turns; anthropic input/output tokens map to prompt/completion."""
    if style == "openai":
        first = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        second = {"prompt_tokens": 20, "completion_tokens": 7, "total_tokens": 27}
    else:
        first = {"input_tokens": 10, "output_tokens": 5}
        second = {"input_tokens": 20, "output_tokens": 7}
    script(
        fake_llm,
        tool_turn(style, [("c1", "add", {"a": 1, "b": 2})], first),
        text_turn(style, "3", second),
    )
    async with make_client(fake_llm, style) as client:
        result = await run_once(client)

    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (30, 12)
    assert result.usage.total_tokens == 42
    assert result.turns == 2


@pytest.mark.parametrize("style", STYLES)
async def test_a_tool_result_reaches_the_model_unchanged(fake_llm: FakeLLM, style: str) -> None:
    """The output text goes to the model byte for byte; anthropic marks errors with is_error."""
    odd = '  {"not": "parsed"}\n\tline two — ünïcödé ✓ \\n "quoted"  '

    @define_tool
    async def echo() -> ToolResult:
        """Return an awkward text."""
        return ToolResult.ok(odd)

    @define_tool
    async def fail() -> ToolResult:
        """Return an error result."""
        return ToolResult.error("it failed:\n" + odd)

    script(
        fake_llm,
        tool_turn(style, [("c1", "echo", {}), ("c2", "fail", {})]),
        text_turn(style, "seen"),
    )
    async with make_client(fake_llm, style) as client:
        result = await run_once(client, "go", echo, fail)

    assert result.status == "done"
    fed = tool_results(style, fake_llm.bodies[1])
    assert [(r["id"], r["content"]) for r in fed] == [("c1", odd), ("c2", "it failed:\n" + odd)]
    if style == "anthropic":
        assert [r["is_error"] for r in fed] == [None, True]
        # The results of one turn travel in a single user message.
        assert fake_llm.bodies[1]["messages"][-1]["role"] == "user"
        assert len(fake_llm.bodies[1]["messages"][-1]["content"]) == 2


@pytest.mark.parametrize("style", STYLES)
async def test_a_raising_tool_becomes_an_error_result_and_the_run_goes_on(
    fake_llm: FakeLLM, style: str
) -> None:
    """A tool's exception: an error result naming the exception and its message."""
    script(
        fake_llm,
        tool_turn(style, [("c1", "explode", {"reason": "no fuel"})]),
        text_turn(style, "recovered"),
    )
    async with make_client(fake_llm, style) as client:
        result = await run_once(client, "go", explode)

    (fed,) = tool_results(style, fake_llm.bodies[1])
    assert "ValueError" in fed["content"] and "cannot comply: no fuel" in fed["content"]
    if style == "anthropic":
        assert fed["is_error"] is True
    assert result.status == "done" and result.text == "recovered"
    assert result.tool_calls[0].result.is_error


async def test_invalid_json_arguments_are_reported_to_the_model(fake_llm: FakeLLM) -> None:
    """Arguments that are not JSON: the tool does not run; the model is told; the run goes on."""
    ran: list[dict[str, Any]] = []

    @define_tool
    async def record(x: int = 0) -> str:
        """Record a call."""
        ran.append({"x": x})
        return "recorded"

    script(
        fake_llm,
        openai_reply(None, [("c1", "record", '{"x": 1,,')]),
        openai_reply("fixed it"),
    )
    async with make_client(fake_llm, "openai") as client:
        result = await run_once(client, "go", record)

    assert ran == []
    (fed,) = tool_results("openai", fake_llm.bodies[1])
    assert "invalid arguments" in fed["content"] and "JSON" in fed["content"]
    assert '{"x": 1,,' in fed["content"]
    assert result.status == "done" and result.text == "fixed it"
    # The assistant's call is sent back as the model wrote it.
    sent_call = fake_llm.bodies[1]["messages"][1]["tool_calls"][0]
    assert sent_call["function"]["arguments"] == '{"x": 1,,'


@pytest.mark.parametrize("style", STYLES)
async def test_an_unknown_tool_is_an_error_result_naming_it(fake_llm: FakeLLM, style: str) -> None:
    """A call to a tool that does not exist: an error result naming it; the run goes on."""
    script(
        fake_llm,
        tool_turn(style, [("c1", "teleport", {"to": "mars"})]),
        text_turn(style, "no teleport then"),
    )
    async with make_client(fake_llm, style) as client:
        result = await run_once(client)

    (fed,) = tool_results(style, fake_llm.bodies[1])
    assert "teleport" in fed["content"] and "unknown" in fed["content"]
    assert result.status == "done" and result.text == "no teleport then"


@pytest.mark.parametrize("style", STYLES)
async def test_max_turns_ends_the_run_as_incomplete(fake_llm: FakeLLM, style: str) -> None:
    """A model that never stops calling tools: "incomplete", limit "max_turns", N requests."""
    counter = iter(range(1, 1000))
    fake_llm.handler = lambda body, seen: tool_turn(
        style, [(f"c{next(counter)}", "add", {"a": 1, "b": 1})]
    )
    async with make_client(fake_llm, style, max_turns=3) as client:
        result = await run_once(client)

    assert result.status == "incomplete"
    assert result.limit == "max_turns"
    assert result.turns == 3
    assert len(fake_llm.requests) == 3
    assert len(result.tool_calls) == 3, "the last allowed turn's calls still run"


@pytest.mark.parametrize(
    ("style", "env"), [("openai", "OPENAI_API_KEY"), ("anthropic", "ANTHROPIC_API_KEY")]
)
async def test_the_api_key_falls_back_to_the_environment(
    fake_llm: FakeLLM, monkeypatch: pytest.MonkeyPatch, style: str, env: str
) -> None:
    """Without api_key the style's usual environment variable is used."""
    monkeypatch.setenv(env, "sk-from-env")
    script(fake_llm, text_turn(style, "hi"))
    async with LlmClient(fake_llm.url, style, "m") as client:
        await run_once(client)

    headers = headers_of(fake_llm.requests[0])
    if style == "openai":
        assert headers["authorization"] == "Bearer sk-from-env"
    else:
        assert headers["x-api-key"] == "sk-from-env"


# --- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize("style", STYLES)
async def test_a_non_2xx_reply_is_a_provider_error_with_a_bounded_excerpt(
    fake_llm: FakeLLM, style: str
) -> None:
    """Non-2xx: ProviderError with .status and at most 500 characters of the body."""
    body = "upstream overloaded " + "x" * 5000
    fake_llm.handler = lambda b, seen: (529, body)
    async with make_client(fake_llm, style) as client:
        with pytest.raises(ProviderError) as caught:
            await run_once(client)

    err = caught.value
    assert isinstance(err, ToolnexusError) and not isinstance(err, aiohttp.ClientError)
    assert err.status == 529
    assert err.body.startswith("upstream overloaded")
    assert len(err.body) <= 500
    assert len(str(err)) < 1000


@pytest.mark.parametrize(
    ("style", "reply_body", "missing"),
    [
        ("openai", {"id": "x", "object": "chat.completion"}, "choices"),
        ("openai", {"choices": []}, "choices"),
        ("openai", {"choices": [{"finish_reason": "stop"}]}, "message"),
        ("anthropic", {"id": "msg", "role": "assistant"}, "content"),
        ("anthropic", {"content": [{"type": "tool_use", "name": "add"}]}, "id"),
    ],
)
async def test_a_2xx_reply_missing_what_the_style_needs_is_a_protocol_error(
    fake_llm: FakeLLM, style: str, reply_body: dict[str, Any], missing: str
) -> None:
    """A 2xx body without what the style requires: ProtocolError saying what is missing."""
    fake_llm.handler = lambda b, seen: reply_body
    async with make_client(fake_llm, style) as client:
        with pytest.raises(ProtocolError) as caught:
            await run_once(client)

    assert isinstance(caught.value, ToolnexusError)
    assert missing in str(caught.value)


@pytest.mark.parametrize("style", STYLES)
async def test_a_body_that_is_not_json_is_a_protocol_error(fake_llm: FakeLLM, style: str) -> None:
    """A 2xx body that is not JSON: ProtocolError, not a JSONDecodeError."""
    fake_llm.handler = lambda b, seen: (200, "<html>gateway says hi</html>")
    async with make_client(fake_llm, style) as client:
        with pytest.raises(ProtocolError) as caught:
            await run_once(client)

    assert "not JSON" in str(caught.value)
    assert not isinstance(caught.value, ValueError)


@pytest.mark.parametrize("style", STYLES)
async def test_a_refused_connection_is_a_transport_error(style: str) -> None:
    """Nothing listening: TransportError (a ToolnexusError), never an aiohttp exception."""
    port = closed_port()
    no_retry = RetryPolicy(retries=0)
    async with LlmClient(
        f"http://127.0.0.1:{port}", style, "m", api_key=KEY, retry=no_retry
    ) as client:
        with pytest.raises(TransportError) as caught:
            await run_once(client)

    assert isinstance(caught.value, ToolnexusError)
    assert not isinstance(caught.value, aiohttp.ClientError)
    assert str(port) in str(caught.value)
    assert secret_free(str(caught.value))


# --- secrets -------------------------------------------------------------------------------


@pytest.mark.parametrize("style", STYLES)
async def test_secrets_never_reach_reprs_errors_or_logs(
    fake_llm: FakeLLM, style: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Key and header values stay out of repr(client), errors and DEBUG logs, even echoed."""
    caplog.set_level(logging.DEBUG)
    fail = False

    def handler(body: dict[str, Any], seen: Seen) -> Any:
        if fail:  # a provider that echoes what it got
            return 401, {"error": {"message": f"bad key {KEY} for {HEADER_SECRET}"}}
        if len(fake_llm.requests) == 1:
            return tool_turn(style, [("c1", "explode", {"reason": "r"})])
        return text_turn(style, "fine")

    fake_llm.handler = handler
    client = make_client(fake_llm, style, headers={"X-Org-Token": HEADER_SECRET})
    async with client:
        assert secret_free(repr(client)) and secret_free(str(client))
        await run_once(client, "go", explode)  # a successful run that logs a tool failure
        fail = True
        with pytest.raises(ProviderError) as caught:
            await run_once(client)

    assert headers_of(fake_llm.requests[0])["x-org-token"] == HEADER_SECRET
    err = caught.value
    assert "bad key" in err.body, "the rest of the body is kept"
    for text in error_texts(err):
        assert secret_free(text), text
    logged = caplog.text + "".join(repr(r.args) for r in caplog.records)
    assert secret_free(logged)


@pytest.mark.parametrize("style", STYLES)
async def test_a_key_echoed_in_a_2xx_error_body_is_redacted(fake_llm: FakeLLM, style: str) -> None:
    """A 2xx error body echoing the key becomes a ProtocolError that does not carry the key."""
    fake_llm.handler = lambda b, seen: {"error": {"message": f"Incorrect API key provided: {KEY}"}}
    async with make_client(fake_llm, style) as client:
        with pytest.raises(ProtocolError) as caught:
            await run_once(client)

    for text in error_texts(caught.value):
        assert secret_free(text), text


# --- history -------------------------------------------------------------------------------


async def test_a_transcript_continues_into_a_second_run(fake_llm: FakeLLM) -> None:
    """history=result.messages: the second request carries the first run, then the new prompt."""
    script(
        fake_llm,
        openai_reply(None, [("c1", "add", {"a": 2, "b": 3})]),
        openai_reply("It is 5."),
        openai_reply("Then 10."),
    )
    async with make_client(fake_llm, "openai", system_prompt="Be brief.") as client:
        first = await run_once(client, "2+3?")
        async with Toolkit.create(builtins=False, extra_tools=[add]) as tk:
            second = await client.run("times 2?", tk, history=first.messages)

    assert second.text == "Then 10."
    sent = fake_llm.bodies[2]["messages"]
    assert sent[: len(fake_llm.bodies[1]["messages"])] == fake_llm.bodies[1]["messages"]
    assert sent[-2:] == [
        {"role": "assistant", "content": "It is 5."},
        {"role": "user", "content": "times 2?"},
    ]
    assert [m["role"] for m in sent].count("system") == 1
    assert second.turns == 1, "turns count this run's requests"
    assert list(second.messages[: len(first.messages)]) == list(first.messages)


async def test_a_conversation_started_openai_continues_against_anthropic(
    fake_llm: FakeLLM,
) -> None:
    """The neutral transcript of an openai run renders as a correct anthropic request."""
    script(
        fake_llm,
        openai_reply(None, [("c1", "add", {"a": 2, "b": 3})]),
        openai_reply("It is 5."),
        anthropic_reply("Then 10."),
    )
    async with make_client(fake_llm, "openai", system_prompt="Be brief.") as client:
        first = await run_once(client, "2+3?")
    async with make_client(fake_llm, "anthropic") as client:
        async with Toolkit.create(builtins=False, extra_tools=[add]) as tk:
            second = await client.run("times 2?", tk, history=first.messages)

    assert second.status == "done" and second.text == "Then 10."
    assert fake_llm.requests[2].path == "/v1/messages"
    body = fake_llm.bodies[2]
    assert body["system"] == "Be brief."
    assert body["messages"] == [
        {"role": "user", "content": "2+3?"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "c1", "name": "add", "input": {"a": 2, "b": 3}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "5"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "It is 5."}]},
        {"role": "user", "content": "times 2?"},
    ]
    assert body["tools"][0]["name"] == "add"


async def test_a_real_transcript_round_trips_through_json(fake_llm: FakeLLM) -> None:
    """messages_to_json / messages_from_json give back the run's transcript exactly."""
    script(
        fake_llm,
        anthropic_reply("Let me add.", [("tu1", "add", {"a": 2, "b": 3}), ("tu2", "nope", {})]),
        anthropic_reply("It is 5."),
    )
    async with make_client(fake_llm, "anthropic", system_prompt="sys") as client:
        result = await run_once(client, "2+3?")

    stored = json.dumps(messages_to_json(result.messages))
    restored = messages_from_json(json.loads(stored))
    assert restored == list(result.messages)
    assert messages_from_json(stored) == list(result.messages)
    assert any(getattr(m, "is_error", False) for m in restored), "the error result survives"


# --- lifecycle -----------------------------------------------------------------------------


async def test_async_with_closes_the_owned_session(fake_llm: FakeLLM) -> None:
    """The session the client created is closed on leaving ``async with``."""
    script(fake_llm, openai_reply("hi"))
    async with make_client(fake_llm, "openai") as client:
        await run_once(client)
        session = session_of(client)
        assert session is not None and not is_closed(session)
    assert is_closed(session)
    assert client.closed


async def test_aclose_is_idempotent_and_a_closed_client_refuses_to_run(fake_llm: FakeLLM) -> None:
    """aclose twice is fine; run after aclose raises UsageError without a request."""
    script(fake_llm, openai_reply("hi"))
    client = make_client(fake_llm, "openai")
    try:
        await run_once(client)
        session = session_of(client)
    finally:
        await client.aclose()
    await client.aclose()
    assert session is not None and session.closed
    with pytest.raises(UsageError):
        await run_once(client)
    assert len(fake_llm.requests) == 1
    with pytest.raises(UsageError):
        async with client:
            pass
    # The same holds for an in-process client, which has no session to refuse for it.
    model = ScriptedModel("hi")
    local = LlmClient.in_process(model)
    await local.aclose()
    await local.aclose()
    with pytest.raises(UsageError):
        await run_once(local)
    assert model.requests == []
    assert_no_leaks()


async def test_a_borrowed_session_is_used_and_left_open(fake_llm: FakeLLM) -> None:
    """AiohttpTransport(session=...): the requests go through the lender's session, which
    aclose leaves open."""
    started: list[str] = []

    async def on_start(session: Any, ctx: SimpleNamespace, params: Any) -> None:
        started.append(str(params.url))

    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(on_start)
    script(fake_llm, openai_reply("hi"))
    async with aiohttp.ClientSession(trace_configs=[trace]) as borrowed:
        transport = AiohttpTransport(session=borrowed)
        async with make_client(fake_llm, "openai", transport=transport) as client:
            result = await run_once(client)
            assert session_of(client) is borrowed
        assert result.text == "hi"
        assert started == [fake_llm.url + "/chat/completions"]
        assert not borrowed.closed, "a borrowed session is the lender's to close"
        await client.aclose()
        assert not borrowed.closed


def test_repr_hides_the_key() -> None:
    """repr shows style, model and whether a key is set, never the key or header values."""
    client = LlmClient(
        "http://127.0.0.1:9", "anthropic", "m", api_key=KEY, headers={"X-T": HEADER_SECRET}
    )
    text = repr(client)
    assert secret_free(text)
    assert "anthropic" in text and "'m'" in text


# --- leaks ---------------------------------------------------------------------------------


@pytest.fixture
def held_server(fake_llm: FakeLLM) -> Iterator[SimpleNamespace]:
    """The fake LLM holds every request until released; ``received`` says one arrived."""
    received, release = threading.Event(), threading.Event()

    def handler(body: dict[str, Any], seen: Seen) -> Any:
        received.set()
        release.wait(LIMIT * 2)
        return openai_reply("too late")

    fake_llm.handler = handler
    try:
        yield SimpleNamespace(received=received, release=release, fake=fake_llm)
    finally:
        release.set()  # before the fake server stops, so its thread can end


async def test_nothing_is_left_behind_after_a_run(fake_llm: FakeLLM) -> None:
    """After a run with concurrent tool calls and aclose: no task, future or open session."""
    script(
        fake_llm,
        openai_reply(None, [("c1", "add", {"a": 1, "b": 2}), ("c2", "add", {"a": 3, "b": 4})]),
        openai_reply("3 and 7"),
    )
    client = make_client(fake_llm, "openai")
    try:
        result = await run_once(client)
        session = session_of(client)
    finally:
        await client.aclose()
    assert result.text == "3 and 7"
    assert session is not None and session.closed
    assert_no_leaks()


async def test_a_run_cancelled_mid_request_leaves_nothing_behind(
    held_server: SimpleNamespace,
) -> None:
    """Cancelled while the server holds the request: no task, future or session remains."""
    finished = False
    async with make_client(held_server.fake, "openai") as client:
        with anyio.fail_after(LIMIT):
            async with Toolkit.create(builtins=False) as tk, anyio.create_task_group() as tg:

                async def run() -> None:
                    nonlocal finished
                    await client.run("hello", tk)
                    finished = True

                tg.start_soon(run)
                assert await anyio.to_thread.run_sync(held_server.received.wait, LIMIT)
                tg.cancel_scope.cancel()
        session = session_of(client)
    assert not finished
    assert session is not None and session.closed
    assert_no_leaks()


async def test_a_run_cancelled_while_parked_in_wait_for_leaves_nothing_behind(
    fake_llm: FakeLLM,
) -> None:
    """Cancelled while two calls wait for answers: resolvers cancelled, nothing left."""
    script(fake_llm, openai_reply(None, [("c1", "gate", {}), ("c2", "gate", {})]))

    @define_tool
    async def gate(ctx: ToolContext | None = None) -> ToolResult:
        """Needs approval."""
        return ToolResult.pending(Request("", "approval", "ok?"))

    parked = Holding(2)

    async def wait_for(request: Request) -> Answer:
        await parked.hold(request.id)

    async with make_client(fake_llm, "openai", wait_for=wait_for) as client:
        with anyio.fail_after(LIMIT):
            async with Toolkit.create(builtins=False, extra_tools=[gate]) as tk:
                with anyio.CancelScope() as scope:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(client.run, "approve both", tk)
                        await parked.all_here.wait()
                        scope.cancel()
        session = session_of(client)
    assert len(parked.cancelled) == 2
    assert session is not None and session.closed
    assert_no_leaks()


async def test_a_run_cancelled_while_tools_run_concurrently_leaves_nothing_behind() -> None:
    """Cancelled while two tools of one turn run: both are cancelled, nothing left."""
    working = Holding(2)

    def busy(name: str) -> Any:
        @define_tool(name=name)
        async def tool() -> str:
            """Works forever."""
            await working.hold(name)

        return tool

    model = ScriptedModel(reply(None, tool_call("one"), tool_call("two")))
    async with LlmClient.in_process(model) as client:
        with anyio.fail_after(LIMIT):
            tools = [busy("one"), busy("two")]
            async with Toolkit.create(builtins=False, extra_tools=tools) as tk:
                with anyio.CancelScope() as scope:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(client.run, "work", tk)
                        await working.all_here.wait()
                        scope.cancel()
    assert sorted(working.cancelled) == ["one", "two"]
    assert_no_leaks()
