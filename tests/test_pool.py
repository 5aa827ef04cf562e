"""The aiohttp transport's bounded pool: its defaults, the cap, the queue and its timeout.

The provider is a tiny HTTP/1.1 server on 127.0.0.1 written on asyncio streams, so that it
counts exactly what the client opens: each accepted connection is one call of its handler.
It holds every request until the test opens its gate, so the requests in flight at once are
known, not guessed.
"""

from __future__ import annotations

import asyncio
import json
import math
import weakref
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from tests.conftest import assert_no_leaks
from toolnexus_async import (
    AiohttpTransport,
    HttpRequest,
    HttpResponse,
    LlmClient,
    RetryPolicy,
    Toolkit,
    TransportError,
    UsageError,
)
from toolnexus_async._io.slots import Slots

KEY = "sk-pool-test-key-0123456789"
REPLY = json.dumps({"choices": [{"message": {"role": "assistant", "content": "hi"}}]}).encode()


class CountingServer:
    """Answers every POST with ``REPLY`` once ``gate`` is set; counts connections."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.connections = 0  # accepted so far
        self.open = 0  # open now
        self.in_flight = 0  # requests read and not yet answered
        self.max_in_flight = 0
        self.changed = asyncio.Condition()
        self.closed = asyncio.Event()  # set each time a connection ends
        self.port = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> CountingServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self.gate.set()
        self._server.close()
        await self._server.wait_closed()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def _note(self, in_flight: int = 0, open_: int = 0) -> None:
        async with self.changed:
            self.in_flight += in_flight
            self.open += open_
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.changed.notify_all()

    async def wait_in_flight(self, n: int) -> None:
        async with self.changed:
            await self.changed.wait_for(lambda: self.in_flight >= n)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        await self._note(open_=1)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return  # the client closed the connection
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                await reader.readexactly(length)
                await self._note(in_flight=1)
                await self.gate.wait()
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(REPLY), REPLY)
                )
                await writer.drain()
                await self._note(in_flight=-1)
        finally:
            writer.close()
            await self._note(open_=-1)
            self.closed.set()


@pytest.fixture
async def server() -> AsyncIterator[CountingServer]:
    async with CountingServer() as s:
        yield s


def request(server: CountingServer, timeout: float | None = 10.0) -> HttpRequest:
    return HttpRequest(
        "POST", server.url + "/chat/completions", {"Authorization": KEY}, b"{}", timeout, 1 << 20
    )


def test_the_defaults_are_a_bounded_pool():
    """1000 connections (the OpenAI and Anthropic SDKs' cap), idle ones closed after 15 s;
    an LlmClient gets that transport unless it is given another."""
    assert repr(AiohttpTransport()) == (
        "AiohttpTransport(max_connections=1000, keepalive_timeout=15.0, borrowed=False)"
    )
    client = LlmClient("http://127.0.0.1:9/v1", model="m", api_key=KEY)
    assert repr(client.transport) == repr(AiohttpTransport())
    assert "max_connections=None" in repr(AiohttpTransport(max_connections=None))


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"max_connections": 0}, "max_connections"),
        ({"max_connections": -5}, "max_connections"),
        ({"max_connections": True}, "max_connections"),
        ({"max_connections": 2.5}, "max_connections"),
        ({"max_connections": "10"}, "max_connections"),
        ({"keepalive_timeout": 0}, "keepalive_timeout"),
        ({"keepalive_timeout": -1.0}, "keepalive_timeout"),
        ({"keepalive_timeout": math.nan}, "keepalive_timeout"),
        ({"keepalive_timeout": math.inf}, "keepalive_timeout"),
        ({"keepalive_timeout": "5"}, "keepalive_timeout"),
        ({"keepalive_timeout": False}, "keepalive_timeout"),
    ],
)
def test_a_bad_pool_option_is_a_usage_error_naming_it(options: dict[str, Any], named: str):
    with pytest.raises(UsageError, match=named) as caught:
        AiohttpTransport(**options)
    assert "None" in str(caught.value)  # says how to ask for no limit


async def test_concurrent_runs_never_open_more_connections_than_the_cap(server: CountingServer):
    """20 runs at once through a client capped at 3: 3 requests reach the server, the other
    17 queue; once the gate opens, all of them are answered on those 3 connections."""
    cap, runs = 3, 20
    results: list[str] = []
    async with LlmClient(
        server.url, model="m", api_key=KEY, transport=AiohttpTransport(max_connections=cap)
    ) as client:
        toolkit = Toolkit.create(builtins=False)

        async def one() -> None:
            results.append((await client.run("hi", toolkit)).text)

        async with anyio.create_task_group() as tg:
            for _ in range(runs):
                tg.start_soon(one)
            await server.wait_in_flight(cap)
            server.gate.set()
    assert results == ["hi"] * runs
    assert server.connections == cap
    assert server.max_in_flight == cap
    assert_no_leaks()


async def test_no_cap_opens_a_connection_per_concurrent_request(server: CountingServer):
    """max_connections=None is still no cap: 20 requests at once, 20 connections."""
    n = 20
    async with anyio.create_task_group() as tg:
        transport = AiohttpTransport(max_connections=None)
        for _ in range(n):
            tg.start_soon(transport.send, request(server))
        await server.wait_in_flight(n)
        server.gate.set()
    await transport.aclose()
    assert server.connections == n


async def test_a_request_in_flight_is_not_held_by_the_transport(server: CountingServer):
    """While the reply is awaited, the transport keeps what it needs of the request, not the
    request: at 500 requests in flight, 500 objects fewer for every collection to walk."""
    transport = AiohttpTransport()
    sent = request(server)
    held = weakref.ref(sent)
    async with anyio.create_task_group() as tg:
        tg.start_soon(transport.send, sent)
        del sent
        await server.wait_in_flight(1)
        assert held() is None
        server.gate.set()
    await transport.aclose()


async def test_a_request_queued_past_its_timeout_says_it_waited_for_the_pool(
    server: CountingServer,
):
    """With the one connection busy, a second request's wait counts against its timeout;
    when it runs out, the error names the pool, the cap and what to do. The slot is
    intact afterwards: once the first is answered, a third request goes through."""
    transport = AiohttpTransport(max_connections=1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(transport.send, request(server))
        await server.wait_in_flight(1)
        with pytest.raises(TransportError) as caught:
            await transport.send(request(server, timeout=0.05))
        server.gate.set()
    message = str(caught.value)
    assert "timed out after 0.05 s waiting for a free connection" in message
    assert "all 1 of max_connections were busy" in message
    assert "raise max_connections" in message
    assert KEY not in message
    assert caught.value.__cause__ is None and caught.value.__context__ is None
    reply = await transport.send(request(server))
    assert isinstance(reply, HttpResponse) and reply.content == REPLY
    assert server.connections == 1
    await transport.aclose()
    assert_no_leaks()


async def test_a_cancelled_queued_request_gives_back_nothing_it_did_not_take(
    server: CountingServer,
):
    """A request cancelled while queued leaves the count of slots as it was."""
    transport = AiohttpTransport(max_connections=1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(transport.send, request(server))
        await server.wait_in_flight(1)
        with anyio.move_on_after(0.02):
            await transport.send(request(server))
        server.gate.set()
    await transport.send(request(server))
    # Had the cancelled request released a slot it never took, two would fit at once.
    server.gate.clear()
    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(transport.send, request(server))
        await server.wait_in_flight(1)
        server.gate.set()
    assert server.max_in_flight == 1 and server.connections == 1
    await transport.aclose()


async def test_an_open_stream_holds_its_connection_until_closed(server: CountingServer):
    """A stream keeps its slot while it is read; closing it frees the slot for the next."""
    server.gate.set()
    transport = AiohttpTransport(max_connections=1)
    stream = transport.stream(request(server))
    head = await anext(stream)
    assert isinstance(head, HttpResponse) and head.status == 200
    with pytest.raises(TransportError, match="waiting for a free connection"):
        await transport.send(request(server, timeout=0.05))
    await stream.aclose()
    reply = await transport.send(request(server))
    assert reply.content == REPLY
    await transport.aclose()


async def test_an_idle_connection_is_closed_after_keepalive_timeout(server: CountingServer):
    """keepalive_timeout bounds how long an idle connection stays open."""
    server.gate.set()
    transport = AiohttpTransport(keepalive_timeout=0.05)
    await transport.send(request(server))
    with anyio.fail_after(5):
        await server.closed.wait()
    assert server.open == 0
    await transport.aclose()


async def test_a_run_with_retries_queues_like_any_request(server: CountingServer):
    """The pool is below the retry policy: a client capped at 1 still finishes 5 runs."""
    server.gate.set()
    async with LlmClient(
        server.url,
        model="m",
        api_key=KEY,
        retry=RetryPolicy(retries=0),
        transport=AiohttpTransport(max_connections=1),
    ) as client:
        toolkit = Toolkit.create(builtins=False)
        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(client.run, "hi", toolkit)
    assert server.connections == 1


async def test_a_slot_handed_to_a_waiter_cancelled_before_it_resumed_goes_to_the_next():
    """The pool's own queue: a freed slot goes to the first waiter; if that one is
    cancelled before it runs, the slot passes on to the next instead of being lost, and a
    waiter that gave up is skipped."""
    slots = Slots(1)
    assert slots.try_take() and not slots.try_take()
    got: list[str] = []

    async def take(name: str) -> None:
        await slots.take()
        got.append(name)

    loop = asyncio.get_running_loop()
    gave_up, first, second = (loop.create_task(take(n)) for n in ("gave up", "first", "second"))
    await anyio.wait_all_tasks_blocked()
    gave_up.cancel()
    await anyio.wait_all_tasks_blocked()
    slots.give()  # to "first" (the cancelled one is skipped)...
    first.cancel()  # ...which is cancelled before it resumes
    await anyio.wait_all_tasks_blocked()
    assert got == ["second"] and first.cancelled() and gave_up.cancelled()
    assert not slots.try_take()  # "second" holds the one slot
    slots.give()
    assert slots.try_take()
    await second
