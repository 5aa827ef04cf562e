"""Shared test fixtures: a fake provider, with or without a socket, and a leak check.

:class:`FakeProvider` (fixture ``provider``) plays a model provider over
:class:`~toolnexus_async.testing.MockTransport`: a real :class:`LlmClient` (codec, error
mapping, retries, streaming) with no socket. Most tests use it. :class:`FakeLLM` (fixture
``fake_llm``) answers the same handlers from an aiohttp server on 127.0.0.1, for the tests
that are about HTTP itself: what goes over the wire, sessions, the aiohttp transport.

The fake server runs on its own event loop in a thread, so the test's event loop holds only
what the code under test created: after a run, :func:`assert_no_leaks` can demand that no
task and no pending future is left on it.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from aiohttp import web

from toolnexus_async import HttpRequest, HttpResponse, LlmClient
from toolnexus_async.testing import MockTransport, json_response

# pg_server and pg_dsn: a throwaway PostgreSQL cluster, started only if a test asks for it.
pytest_plugins = ["tests.pg"]

# handler(body, seen) -> reply JSON (status 200), or (status, body) for another status,
# where body may be a dict (sent as JSON) or str/bytes (sent as is), or an HttpResponse
# (sse_response, json_response with headers). FakeProvider also takes async handlers.
Handler = Callable[[dict[str, Any], "Seen"], Any]

DEFAULT_REPLY = {"choices": [{"message": {"content": "hi"}}]}


class Seen:
    """One request the fake server received."""

    def __init__(
        self, path: str, headers: dict[str, str], body: dict[str, Any], query: str = ""
    ) -> None:
        self.path = path
        self.headers = headers
        self.body = body
        self.query = query  # the URL's query string, without "?" (Gemini streams with one)


class FakeLLM:
    """An HTTP model stand-in: every POST is answered by ``handler``; requests are recorded."""

    def __init__(self) -> None:
        self.handler: Handler = lambda body, seen: DEFAULT_REPLY
        self.requests: list[Seen] = []
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fake LLM server did not start")

    def stop(self) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        port = runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        self._runner = runner
        self._ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {"_raw": raw.decode("utf-8", "replace")}
        seen = Seen(request.path, dict(request.headers), body, request.query_string)
        self.requests.append(seen)
        out = self.handler(body, seen)
        if isinstance(out, HttpResponse):  # a recorded reply, sent as it came (an SSE stream)
            return web.Response(body=out.content, status=out.status, headers=out.headers)
        status = 200
        if isinstance(out, tuple):
            status, out = out
        if isinstance(out, dict | list):
            return web.json_response(out, status=status)
        if isinstance(out, str):
            out = out.encode()
        return web.Response(body=out, status=status, content_type="application/json")

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [seen.body for seen in self.requests]


@pytest.fixture
def fake_llm() -> Iterator[FakeLLM]:
    """A fake LLM on 127.0.0.1; set ``fake_llm.handler`` to script its replies."""
    server = FakeLLM()
    server.start()
    try:
        yield server
    finally:
        server.stop()


class FakeProvider:
    """FakeLLM without the socket: the same handlers, answered through MockTransport.

    ``handler(body, seen)`` answers each request as FakeLLM's does (a reply dict, or
    ``(status, body)``), or with an :class:`HttpResponse` (``sse_response`` for a stream,
    ``json_response`` for a reply with headers). It may be a coroutine function (one that
    never returns plays a provider that hangs, until the request's timeout) and may raise
    :class:`TransportError` (a connection that failed).

    :meth:`client` makes a client with a transport of its own each time (a client closes
    its transport with itself); ``requests`` records what every one of them sent, as
    :class:`Seen`, in order.
    """

    url = "https://llm.test"

    def __init__(self, *, chunk_size: int = 7) -> None:
        self.handler: Handler = lambda body, seen: DEFAULT_REPLY
        self.chunk_size = chunk_size  # the pieces a streamed reply is handed over in
        self.requests: list[Seen] = []

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [seen.body for seen in self.requests]

    def script(self, *replies: Any) -> None:
        """Answer the n-th request with the n-th reply; a request past them fails the test."""

        def handler(body: dict[str, Any], seen: Seen) -> Any:
            index = len(self.requests) - 1
            if index >= len(replies):
                raise AssertionError(f"request {index + 1} is past the {len(replies)} scripted")
            return replies[index]

        self.handler = handler

    def client(
        self,
        style: str = "openai",
        model: str = "m",
        *,
        api_key: str = "sk-test-key",
        base_url: str | None = None,
        **options: Any,
    ) -> LlmClient:
        """An ``LlmClient`` (any of its options) whose requests this provider answers."""
        transport = MockTransport(self._answer, chunk_size=self.chunk_size)
        return LlmClient(
            base_url or self.url, style, model, api_key=api_key, transport=transport, **options
        )

    async def _answer(self, request: HttpRequest) -> HttpResponse:
        body = json.loads(request.content)
        url = urlsplit(request.url)
        seen = Seen(url.path, dict(request.headers), body, url.query)
        self.requests.append(seen)
        out = self.handler(body, seen)
        if inspect.isawaitable(out):
            out = await out
        if isinstance(out, HttpResponse):
            return out
        status = 200
        if isinstance(out, tuple):
            status, out = out
        if isinstance(out, dict | list):
            return json_response(out, status)
        if isinstance(out, str):
            out = out.encode()
        return HttpResponse(status, {"Content-Type": "application/json"}, out)


@pytest.fixture
def provider() -> FakeProvider:
    """A fake provider over MockTransport, no socket; set ``provider.handler`` or call
    ``provider.script(...)``, then make clients with ``provider.client(...)``."""
    return FakeProvider()


def openai_reply(
    content: str | None = None,
    tool_calls: list[tuple[str, str, dict[str, Any] | str]] | None = None,
    usage: dict[str, int] | None = None,
) -> dict[str, Any]:
    """A Chat Completions reply; tool_calls as (id, name, arguments dict or raw string)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = [
            {
                "id": call_id,
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            }
            for call_id, name, args in tool_calls
        ]
    out: dict[str, Any] = {"model": "test-model", "choices": [{"message": message}]}
    if usage is not None:
        out["usage"] = usage
    return out


def anthropic_reply(
    text: str | None = None,
    tool_uses: list[tuple[str, str, dict[str, Any]]] | None = None,
    usage: dict[str, int] | None = None,
) -> dict[str, Any]:
    """A Messages API reply; tool_uses as (id, name, input)."""
    content: list[dict[str, Any]] = []
    if text is not None:
        content.append({"type": "text", "text": text})
    for call_id, name, args in tool_uses or []:
        content.append({"type": "tool_use", "id": call_id, "name": name, "input": args})
    out: dict[str, Any] = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "test-model",
        "content": content,
        "stop_reason": "tool_use" if tool_uses else "end_turn",
    }
    if usage is not None:
        out["usage"] = usage
    return out


def assert_no_leaks() -> None:
    """No task but the current one, and no pending future, is left on the running loop."""
    loop = asyncio.get_running_loop()
    current = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks(loop) if t is not current]
    assert tasks == [], f"tasks left behind: {tasks}"
    gc.collect()
    futures = [
        obj
        for obj in gc.get_objects()
        if isinstance(obj, asyncio.Future)
        and obj is not current
        and not obj.done()
        and obj.get_loop() is loop
    ]
    assert futures == [], f"pending futures left behind: {futures}"
